package httpenc

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"testing"
	"time"
)

// bodies returns a body in each coding Serve sends.
func bodies(t *testing.T) map[string]*Body {
	t.Helper()
	plain := document(8 << 10)
	gz, _, err := gzipBody(plain)
	if err != nil || gz == noBody {
		t.Fatalf("gzip: %v", err)
	}
	return map[string]*Body{
		"zstd":     zstdBody(storedZstd(t, plain)),
		"gzip":     gz,
		"identity": identityBody(plain),
	}
}

// write runs Write for a request with the method and headers given, on a
// response whose headers start as set.
func write(method string, b *Body, set http.Header, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, "/k", nil)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	for k, v := range set {
		w.Header()[k] = v
	}
	Write(w, r, b, "application/json")
	return w
}

// TestWrite: a 200's status, headers and body, for each coding; HEAD gets
// the same headers and no body.
func TestWrite(t *testing.T) {
	for name, b := range bodies(t) {
		get := write("GET", b, nil)
		h := get.Header()
		if get.Code != http.StatusOK || !bytes.Equal(get.Body.Bytes(), b.b) {
			t.Errorf("%s: status %d, %d bytes; want 200 with the body", name, get.Code, get.Body.Len())
		}
		want := http.Header{
			"Content-Type":   {"application/json"},
			"Content-Length": {strconv.Itoa(len(b.b))},
			"Etag":           {b.etag},
			"Vary":           {"Accept-Encoding"},
		}
		if b.coding != "" {
			want["Content-Encoding"] = []string{b.coding}
		}
		if !reflect.DeepEqual(h, want) {
			t.Errorf("%s: headers %v, want %v", name, h, want)
		}
		head := write("HEAD", b, nil)
		if head.Code != http.StatusOK || head.Body.Len() != 0 || !reflect.DeepEqual(head.Header(), want) {
			t.Errorf("%s: HEAD status %d, %d bytes, headers %v", name, head.Code, head.Body.Len(), head.Header())
		}
	}
}

// TestWriteNotAcceptable: no body (the request accepts none the value
// has) is 406.
func TestWriteNotAcceptable(t *testing.T) {
	w := write("GET", nil, nil)
	if w.Code != http.StatusNotAcceptable || w.Header().Get("Etag") != "" || w.Header().Get("Vary") != "" {
		t.Errorf("status %d, headers %v", w.Code, w.Header())
	}
}

// TestWriteNotModified: If-None-Match listing the body's tag, in any form,
// or "*", is 304 without a body and with the validators and Vary only;
// another tag, such as another coding's, is 200.
func TestWriteNotModified(t *testing.T) {
	bs := bodies(t)
	app := http.Header{"Content-Type": {"application/vnd.x+json"}, "Cache-Control": {"max-age=5"}, "Content-Encoding": {"br"}}
	for name, b := range bs {
		for _, method := range []string{"GET", "HEAD"} {
			for _, inm := range []string{b.etag, "W/" + b.etag, `"other", ` + b.etag, "*"} {
				w := write(method, b, app, "If-None-Match", inm)
				want := http.Header{"Etag": {b.etag}, "Vary": {"Accept-Encoding"}, "Cache-Control": {"max-age=5"}}
				if w.Code != http.StatusNotModified || w.Body.Len() != 0 || !reflect.DeepEqual(w.Header(), want) {
					t.Errorf("%s %s, If-None-Match %s: status %d, %d bytes, headers %v; want 304 with %v", method, name, inm, w.Code, w.Body.Len(), w.Header(), want)
				}
			}
			for other, ob := range bs {
				if other == name {
					continue
				}
				if w := write(method, b, nil, "If-None-Match", ob.etag); w.Code != http.StatusOK {
					t.Errorf("%s %s with the tag of %s: status %d, want 200", method, name, other, w.Code)
				}
			}
		}
	}
}

// TestWriteApplicationHeaders: what the application set before Write
// stays: its Vary joins Accept-Encoding (once), its Content-Type and
// Cache-Control are kept; a Content-Encoding of its own is not sent with
// an identity body.
func TestWriteApplicationHeaders(t *testing.T) {
	bs := bodies(t)
	for _, tc := range []struct {
		vary []string
		want []string
	}{
		{[]string{"Origin"}, []string{"Origin", "Accept-Encoding"}},
		{[]string{"Origin, accept-encoding"}, []string{"Origin, accept-encoding"}},
		{[]string{"Origin", "Accept-Encoding"}, []string{"Origin", "Accept-Encoding"}},
		{[]string{"*"}, []string{"*"}},
	} {
		set := http.Header{"Vary": tc.vary, "Cache-Control": {"public, max-age=5"}, "Content-Type": {"application/vnd.channel+json"}}
		h := write("GET", bs["gzip"], set).Header()
		if !reflect.DeepEqual(h["Vary"], tc.want) {
			t.Errorf("Vary %q: %q, want %q", tc.vary, h["Vary"], tc.want)
		}
		if h.Get("Cache-Control") != "public, max-age=5" || h.Get("Content-Type") != "application/vnd.channel+json" {
			t.Errorf("headers %v", h)
		}
	}
	w := write("GET", bs["identity"], http.Header{"Content-Encoding": {"gzip"}})
	if _, ok := w.Header()["Content-Encoding"]; ok || !bytes.Equal(w.Body.Bytes(), bs["identity"].b) {
		t.Errorf("identity with the application's Content-Encoding: %v", w.Header())
	}
}

// TestCheckMethod: GET and HEAD pass untouched; every other method is
// answered 405 with Allow.
func TestCheckMethod(t *testing.T) {
	for _, m := range []string{"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"} {
		w := httptest.NewRecorder()
		ok := CheckMethod(w, httptest.NewRequest(m, "/k", nil))
		if want := m == "GET" || m == "HEAD"; ok != want {
			t.Errorf("%s: %v, want %v", m, ok, want)
		}
		switch {
		case ok && (len(w.Header()) != 0 || w.Body.Len() != 0):
			t.Errorf("%s: wrote %v %q", m, w.Header(), w.Body)
		case !ok && (w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != "GET, HEAD"):
			t.Errorf("%s: status %d, Allow %q", m, w.Code, w.Header().Get("Allow"))
		}
	}
}

// TestWritePreconditions: If-Match, If-Unmodified-Since, If-None-Match and
// If-Modified-Since are evaluated as net/http's ServeContent evaluates
// them for the same entity tag and Last-Modified (RFC 9110, section
// 13.2.2): a failed If-Match, or without If-Match a failed
// If-Unmodified-Since, is 412 whatever If-None-Match says; then a
// matching If-None-Match is 304, and without If-None-Match a passed
// If-Modified-Since is too. The dates apply only when the application
// set Last-Modified, as ServeContent ignores them without a modification
// time.
func TestWritePreconditions(t *testing.T) {
	b := bodies(t)["zstd"]
	other := `"other"`
	mod := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	date := func(d time.Duration) string { return mod.Add(d).Format(http.TimeFormat) }
	values := map[string][]string{
		"If-Match":            {"", b.etag, "W/" + b.etag, other, other + ", " + b.etag, "*"},
		"If-None-Match":       {"", b.etag, "W/" + b.etag, other, "*"},
		"If-Unmodified-Since": {"", date(-time.Hour), date(0), date(time.Hour), "not a date"},
		"If-Modified-Since":   {"", date(-time.Hour), date(0), date(time.Hour)},
	}
	statuses := map[int]int{}
	for _, lastModified := range []string{"", date(0)} {
		for _, im := range values["If-Match"] {
			for _, inm := range values["If-None-Match"] {
				for _, ius := range values["If-Unmodified-Since"] {
					for _, ims := range values["If-Modified-Since"] {
						for _, method := range []string{"GET", "HEAD"} {
							var hdr []string
							for k, v := range map[string]string{"If-Match": im, "If-None-Match": inm, "If-Unmodified-Since": ius, "If-Modified-Since": ims} {
								if v != "" {
									hdr = append(hdr, k, v)
								}
							}
							set := http.Header{}
							if lastModified != "" {
								set.Set("Last-Modified", lastModified)
							}
							got := write(method, b, set, hdr...)

							// ServeContent with the same validators.
							r := httptest.NewRequest(method, "/k", nil)
							for i := 0; i+1 < len(hdr); i += 2 {
								r.Header.Set(hdr[i], hdr[i+1])
							}
							want := httptest.NewRecorder()
							want.Header().Set("Etag", b.etag)
							var modtime time.Time
							if lastModified != "" {
								modtime = mod
							}
							http.ServeContent(want, r, "", modtime, bytes.NewReader(b.b))
							statuses[want.Code]++
							if got.Code != want.Code {
								t.Errorf("%s, Last-Modified %q, %q: status %d, ServeContent's %d", method, lastModified, hdr, got.Code, want.Code)
								continue
							}
							if got.Code == http.StatusOK {
								continue
							}
							if got.Body.Len() != 0 || got.Header().Get("Etag") != b.etag || got.Header().Get("Content-Length") != "" ||
								got.Header().Get("Content-Encoding") != "" || got.Header().Get("Content-Type") != "" {
								t.Errorf("%s, %q: status %d with %d bytes and headers %v", method, hdr, got.Code, got.Body.Len(), got.Header())
							}
						}
					}
				}
			}
		}
	}
	if statuses[http.StatusPreconditionFailed] == 0 || statuses[http.StatusNotModified] == 0 || statuses[http.StatusOK] == 0 {
		t.Errorf("statuses seen: %v; want 200, 304 and 412 among them", statuses)
	}
}
