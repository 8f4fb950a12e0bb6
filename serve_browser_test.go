package packcache_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/browsertest"
)

// TestBrowserServe drives headless Chromium to a page that fetches a
// channel through Serve and checks its JSON, over http on loopback and
// over https with a certificate the test makes, the two kinds of origin
// Chromium offers zstd to. The server side checks that what it sent was
// Content-Encoding: zstd with the stored frame as its body. Without
// Chromium the test is skipped, unless PACKCACHE_REQUIRE_BROWSER=1 (CI).
func TestBrowserServe(t *testing.T) {
	t.Parallel()
	// One tab for every page: a page of a site the tab showed last keeps
	// its renderer process, where a fresh browser context starts one.
	tab := browsertest.Start(t).Tab(t)
	_, rdb := single(t)
	ctx := ctxT(t)
	// ZstdDefault: the stored frame is smaller than the JSON gzipped, so
	// Chromium, which accepts zstd and gzip alike, gets the frame.
	c := mustNew[Channel](t, rdb, packcache.WithCodec(codec.ZstdDefault))
	ch := makeChannel(16, 128<<10)
	if err := c.Set(ctx, "channel:16", ch); err != nil {
		t.Fatal(err)
	}
	stored := rawGet(t, rdb, "channel:16")
	if stored[0] != codec.HeaderZstd {
		t.Fatalf("stored with header %#x, want zstd", stored[0])
	}
	// Two more of Serve's codings (issues 24 and 35): a frame of the
	// fastest level, larger than the JSON gzipped, wins Chromium's tie of
	// zstd and gzip as it is, byte for byte; and a value just loaded has
	// no frame to pass on, so one is made for the request.
	fast := mustNew[Channel](t, rdb, packcache.WithCodec(codec.Zstd))
	if err := fast.Set(ctx, "fast:16", ch); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(ch)
	if err != nil {
		t.Fatal(err)
	}
	if f, gz := len(rawGet(t, rdb, "fast:16"))-1, len(gzipBytes(t, js)); f <= gz {
		t.Fatalf("the fastest frame is %d bytes, gzip %d: the test needs it larger", f, gz)
	}
	loading := mustNew[Channel](t, rdb, packcache.WithLoader(packcache.LoaderFunc[Channel](func(context.Context, string) (Channel, error) {
		return ch, nil
	})))
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", browsertest.Page)
	mux.HandleFunc("GET /channel/{id}", func(w http.ResponseWriter, r *http.Request) {
		c.Serve(w, r, "channel:"+r.PathValue("id"))
	})
	mux.HandleFunc("GET /fast/{id}", func(w http.ResponseWriter, r *http.Request) {
		fast.Serve(w, r, "fast:"+r.PathValue("id"))
	})
	mux.HandleFunc("GET /loaded/{id}", func(w http.ResponseWriter, r *http.Request) {
		loading.Serve(w, r, "loaded:"+r.PathValue("id"))
	})
	rec := browsertest.Record(mux)
	for _, tc := range []struct {
		name string
		srv  *httptest.Server
	}{
		{"http://127.0.0.1", httptest.NewServer(rec)},
		{"https", browsertest.NewTLSServer(t, rec)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer tc.srv.Close()
			ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			// The page parses the JSON itself and reports what it found.
			var seen struct {
				Encoding string `json:"encoding"`
				ID       string `json:"id"`
				Messages int    `json:"messages"`
				Last     string `json:"last"`
				Text     string `json:"text"`
			}
			err := tab.Eval(ectx, tc.srv.URL+"/", fmt.Sprintf(`fetch(%q, {cache: "no-store"}).then(async r => {
	if (!r.ok) throw new Error("status " + r.status);
	const text = await r.text();
	const doc = JSON.parse(text);
	return {encoding: r.headers.get("content-encoding"), id: doc.id, messages: doc.messages.length,
		last: doc.messages[doc.messages.length - 1].text, text: text};
})`, tc.srv.URL+"/channel/16"), &seen)
			if err != nil {
				t.Fatal(err)
			}
			last := ch.Messages[len(ch.Messages)-1].Text
			if seen.Encoding != "zstd" || seen.ID != ch.ID || seen.Messages != len(ch.Messages) || seen.Last != last {
				t.Errorf("the page saw encoding %q, channel %q with %d messages ending %q; want zstd, %q, %d, %q",
					seen.Encoding, seen.ID, seen.Messages, seen.Last, ch.ID, len(ch.Messages), last)
			}
			var got Channel
			if err := json.Unmarshal([]byte(seen.Text), &got); err != nil || !reflect.DeepEqual(got, ch) {
				t.Errorf("the text the page decoded is not the channel's JSON (%v)", err)
			}

			e, ok := rec.Last("/channel/16")
			if !ok {
				t.Fatal("the server saw no request for the channel")
			}
			if ae := e.RequestHeader.Get("Accept-Encoding"); !strings.Contains(ae, "zstd") {
				t.Errorf("Chromium sent Accept-Encoding %q, without zstd", ae)
			}
			if e.Status != http.StatusOK || e.Header.Get("Content-Encoding") != "zstd" {
				t.Errorf("the server sent status %d, Content-Encoding %q; want 200, zstd", e.Status, e.Header.Get("Content-Encoding"))
			}
			if !bytes.Equal(e.Body, stored[1:]) {
				t.Errorf("the server sent %d bytes, not the stored frame (%d bytes)", len(e.Body), len(stored)-1)
			}
			if e.Header.Get("Content-Type") != "application/json" || e.Header.Get("Vary") != "Accept-Encoding" || e.Header.Get("Etag") == "" {
				t.Errorf("headers sent: %v", e.Header)
			}

			// Browsertest's own Fetch: the body as the page decoded it.
			resp, err := tab.Fetch(ectx, tc.srv.URL+"/", tc.srv.URL+"/channel/16")
			if err != nil {
				t.Fatal(err)
			}
			if resp.Status != 200 || resp.Header["content-encoding"] != "zstd" || resp.Body != seen.Text {
				t.Errorf("Fetch: status %d, content-encoding %q, %d bytes of body", resp.Status, resp.Header["content-encoding"], len(resp.Body))
			}

			// The fastest frame on a tie with gzip, and a value just loaded
			// (a key of its own per origin): what the server sent, and
			// what Chromium decoded.
			for _, path := range []string{"/fast/16", "/loaded/" + strings.TrimPrefix(tc.name, "http://")} {
				resp, err := tab.Fetch(ectx, tc.srv.URL+"/", tc.srv.URL+path)
				if err != nil {
					t.Fatal(err)
				}
				e, ok := rec.Last(path)
				if !ok {
					t.Fatalf("the server saw no request for %s", path)
				}
				if e.Status != 200 || e.Header.Get("Content-Encoding") != "zstd" || resp.Header["content-encoding"] != "zstd" {
					t.Errorf("%s: the server sent status %d, Content-Encoding %q, Chromium saw %q; want 200, zstd",
						path, e.Status, e.Header.Get("Content-Encoding"), resp.Header["content-encoding"])
				}
				if path == "/fast/16" && !bytes.Equal(e.Body, rawGet(t, rdb, "fast:16")[1:]) {
					t.Errorf("%s: %d bytes sent, not the stored frame of %d", path, len(e.Body), len(rawGet(t, rdb, "fast:16"))-1)
				}
				if len(e.Body) >= len(js)/2 {
					t.Errorf("%s: %d bytes sent for %d of JSON", path, len(e.Body), len(js))
				}
				var got Channel
				if err := json.Unmarshal([]byte(resp.Body), &got); err != nil || !reflect.DeepEqual(got, ch) {
					t.Errorf("%s: the text Chromium decoded is not the channel's JSON (%v)", path, err)
				}
			}
		})
	}
}

// TestBrowserDeltas drives headless Chromium over http://127.0.0.1
// through RFC 9842 with Policy.Deltas: the page fetches a channel, which
// Serve offers as a dictionary; the server adds a message; the page
// fetches again with cache: 'no-cache', and that request carries
// Available-Dictionary naming the first version, is answered with dcz by
// another cache instance over a client of its own (another process of
// the fleet), and the page reads the new version. Without Chromium the
// test is skipped, unless PACKCACHE_REQUIRE_BROWSER=1 (CI).
func TestBrowserDeltas(t *testing.T) {
	t.Parallel()
	browser := browsertest.Start(t)
	tab := browser.Tab(t)
	s, rdb := single(t)
	ctx := ctxT(t)
	deltas := packcache.WithPrefix("channel:", packcache.Policy{Deltas: time.Hour})
	first := mustNew[Channel](t, rdb, packcache.WithCodec(codec.ZstdDefault), deltas)
	second := mustNew[Channel](t, s.Universal(t), packcache.WithCodec(codec.ZstdDefault), deltas)
	v1 := makeChannel(17, 150<<10)
	if err := first.Set(ctx, "channel:17", v1); err != nil {
		t.Fatal(err)
	}
	j1, _ := storedPlain(t, rdb, "channel:17")
	var served atomic.Pointer[packcache.Cache[Channel]]
	served.Store(first)
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", browsertest.Page)
	mux.HandleFunc("GET /channel/{id}", func(w http.ResponseWriter, r *http.Request) {
		served.Load().Serve(w, r, "channel:"+r.PathValue("id"))
	})
	rec := browsertest.Record(mux)
	srv := httptest.NewServer(rec)
	defer srv.Close()
	ectx, cancel := context.WithTimeout(ctx, 50*time.Second)
	defer cancel()
	type seen struct {
		Encoding string `json:"encoding"`
		Messages int    `json:"messages"`
		Last     string `json:"last"`
		Text     string `json:"text"`
	}
	fetchJS := func(mode string) string {
		return fmt.Sprintf(`fetch(%q, {cache: %q}).then(async r => {
	if (!r.ok) throw new Error("status " + r.status);
	const text = await r.text();
	const doc = JSON.parse(text);
	return {encoding: r.headers.get("content-encoding"), messages: doc.messages.length,
		last: doc.messages[doc.messages.length - 1].text, text: text};
})`, srv.URL+"/channel/17", mode)
	}
	var got seen
	if err := tab.Eval(ectx, srv.URL+"/", fetchJS("default"), &got); err != nil {
		t.Fatal(err)
	}
	if got.Messages != len(v1.Messages) || got.Encoding != "zstd" {
		t.Fatalf("first fetch: %d messages, encoding %q", got.Messages, got.Encoding)
	}
	// Chromium names dcz only in a request it holds a dictionary for.
	e, _ := rec.Last("/channel/17")
	if e.Header.Get("Use-As-Dictionary") == "" || e.Header.Get("Cache-Control") != "max-age=3600" {
		t.Fatalf("first exchange: Use-As-Dictionary %q, Cache-Control %q", e.Header.Get("Use-As-Dictionary"), e.Header.Get("Cache-Control"))
	}
	// Chromium keeps the dictionary once the body is read, in the
	// background: revalidate v1 until a request names it.
	waitFor(t, 40*time.Second, "a request naming v1 in Available-Dictionary", func() bool {
		if err := tab.Eval(ectx, srv.URL+"/", fetchJS("no-cache"), &got); err != nil {
			t.Fatal(err)
		}
		e, _ := rec.Last("/channel/17")
		return e.RequestHeader.Get("Available-Dictionary") == dictionaryOf(j1)
	})
	waitVersion(t, rdb, "channel:17", j1)

	v2 := withMessage(v1, "the exam room is 204, not 201")
	if err := first.Set(ctx, "channel:17", v2); err != nil {
		t.Fatal(err)
	}
	j2, stored2 := storedPlain(t, rdb, "channel:17")
	served.Store(second)
	err := tab.Eval(ectx, srv.URL+"/", fetchJS("no-cache"), &got)
	e, _ = rec.Last("/channel/17")
	if err != nil {
		t.Fatalf("%v\nthe exchange: request %v; response %d %v, %d bytes", err, e.RequestHeader, e.Status, e.Header, len(e.Body))
	}
	if ad, ae := e.RequestHeader.Get("Available-Dictionary"), e.RequestHeader.Get("Accept-Encoding"); ad != dictionaryOf(j1) || !strings.Contains(ae, "dcz") {
		t.Errorf("the second fetch's Available-Dictionary %q, Accept-Encoding %q; want v1's %q, and dcz", ad, ae, dictionaryOf(j1))
	}
	if e.Status != 200 || e.Header.Get("Content-Encoding") != "dcz" {
		t.Fatalf("the second fetch was answered %d, Content-Encoding %q; want 200, dcz", e.Status, e.Header.Get("Content-Encoding"))
	}
	if got.Messages != len(v2.Messages) || got.Last != v2.Messages[len(v2.Messages)-1].Text || got.Text != string(j2) {
		t.Errorf("the page read %d messages ending %q, want v2's %d", got.Messages, got.Last, len(v2.Messages))
	}
	if got := undcz(t, e.Body, j1); !bytes.Equal(got, j2) {
		t.Error("the dcz body sent does not decode to v2 with v1")
	}
	t.Logf("Chromium %s: v2 %d bytes of JSON, stored frame %d bytes, sent as dcz in %d", browser.Version(), len(j2), len(stored2)-1, len(e.Body))

	// Revalidated again, v2 unchanged: the request names the dcz body's
	// ETag and, at once or once Chromium keeps it, v2 as its dictionary;
	// it is answered 304, not the whole value, and the page reads v2.
	dczTag := e.Header.Get("Etag")
	waitFor(t, 40*time.Second, "a revalidation naming v2 in Available-Dictionary", func() bool {
		if err := tab.Eval(ectx, srv.URL+"/", fetchJS("no-cache"), &got); err != nil {
			t.Fatal(err)
		}
		e, _ = rec.Last("/channel/17")
		return e.RequestHeader.Get("Available-Dictionary") == dictionaryOf(j2)
	})
	if e.RequestHeader.Get("If-None-Match") != dczTag || e.Status != http.StatusNotModified || got.Text != string(j2) {
		t.Errorf("revalidating v2: If-None-Match %q (the dcz ETag %s), status %d, the page read v2: %v",
			e.RequestHeader.Get("If-None-Match"), dczTag, e.Status, got.Text == string(j2))
	}
}
