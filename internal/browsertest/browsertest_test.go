package browsertest

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(closesShared{m}) }

// closesShared runs the tests, then closes the shared browser, before
// goleak looks for goroutines left behind.
type closesShared struct{ m *testing.M }

func (c closesShared) Run() int {
	code := c.m.Run()
	if err := closeShared(); err != nil {
		fmt.Fprintf(os.Stderr, "browsertest: closing the shared browser: %v\n", err)
		code = 1
	}
	return code
}

// The browser the tests share (example.test mapped to 127.0.0.1, for
// TestAcceptEncoding): a launch costs several times an evaluation, and
// each test evaluates in a Tab of its own, a browser context, so that
// nothing one test loads is seen by another. The tests take turns on it,
// as on redistest's shared servers: a test holds it from shared until it
// ends, so its contexts' deadlines run from its turn, not from a wait
// behind another test's evaluations (a call cut short would break the
// browser for every test). Tests whose browser needs other flags, or that
// break or close it, start their own, and run beside the one holding it.
var sharedBrowser struct {
	sync.Mutex
	b   *Browser
	err error
}

// sharedTurn is held by the test using the shared browser.
var sharedTurn = make(chan struct{}, 1)

// shared waits for the shared browser, launching it on the first call
// (see Require for when it skips), and holds it for t until t ends. A
// test's subtests use what the test got; they must not call shared.
func shared(t *testing.T) *Browser {
	t.Helper()
	path := Require(t)
	sharedTurn <- struct{}{}
	t.Cleanup(func() { <-sharedTurn })
	sharedBrowser.Lock()
	defer sharedBrowser.Unlock()
	if sharedBrowser.b == nil && sharedBrowser.err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), launchTimeout)
		defer cancel()
		sharedBrowser.b, sharedBrowser.err = Launch(ctx, path, MapHost("example.test"))
	}
	if sharedBrowser.err != nil {
		t.Fatal(sharedBrowser.err)
	}
	return sharedBrowser.b
}

// closeShared closes the shared browser, if launched.
func closeShared() error {
	sharedBrowser.Lock()
	defer sharedBrowser.Unlock()
	if sharedBrowser.b == nil {
		return nil
	}
	return sharedBrowser.b.Close()
}

// evalTimeout bounds one page: a fetch of 128 KB on loopback takes well
// under a second, a cold renderer on a loaded machine a few.
const evalTimeout = 30 * time.Second

func evalContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), evalTimeout)
	t.Cleanup(cancel)
	return ctx
}

// channel is a generated JSON document of about 128 KB, all ASCII (so the
// page's UTF-16 code units are its bytes), and its zstd frame.
type channel struct {
	doc   []byte
	frame []byte
	items int
}

func newChannel(t *testing.T) channel {
	t.Helper()
	type item struct {
		ID     int     `json:"id"`
		Posted int64   `json:"posted"`
		Author string  `json:"author"`
		Title  string  `json:"title"`
		Score  float64 `json:"score"`
		Body   string  `json:"body"`
	}
	var doc struct {
		Channel string `json:"channel"`
		Items   []item `json:"items"`
	}
	doc.Channel = "physics-101"
	// A fixed seed: every run serves the same bytes. Random words and
	// numbers compress about as
	// well as channel text does (3x).
	rng := rand.New(rand.NewPCG(1, 2))
	vocabulary := make([]string, 400)
	for i := range vocabulary {
		const letters = "abcdefghijklmnopqrstuvwxyz"
		w := make([]byte, 2+rng.IntN(8))
		for j := range w {
			w[j] = letters[rng.IntN(len(letters))]
		}
		vocabulary[i] = string(w)
	}
	word := func() string { return vocabulary[rng.IntN(len(vocabulary))] }
	size := 0
	for i := 0; size < 128<<10; i++ {
		var body strings.Builder
		for range 20 + rng.IntN(40) {
			body.WriteString(word())
			body.WriteByte(' ')
		}
		it := item{
			ID: i, Posted: 1_760_000_000 + rng.Int64N(10_000_000), Author: word(),
			Title: word() + " " + word(), Score: float64(rng.IntN(1000)) / 10, Body: body.String(),
		}
		b, _ := json.Marshal(it)
		size += len(b) + 1
		doc.Items = append(doc.Items, it)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	return channel{doc: b, frame: enc.EncodeAll(b, nil), items: len(doc.Items)}
}

// handler serves Page at / and the channel at /channel: its zstd frame
// with Content-Encoding: zstd when the request offers zstd, else the JSON
// as it is. It is what a plain net/http service would write.
func (c channel) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", Page)
	mux.HandleFunc("GET /channel", func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Vary", "Accept-Encoding")
		body := c.doc
		if offers(r.Header.Get("Accept-Encoding"), "zstd") {
			h.Set("Content-Encoding", "zstd")
			body = c.frame
		}
		h.Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	})
	return mux
}

// offers reports whether an Accept-Encoding value allows coding: named
// with a q-value other than 0.
func offers(acceptEncoding, coding string) bool {
	for _, part := range strings.Split(acceptEncoding, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if !strings.EqualFold(strings.TrimSpace(name), coding) {
			continue
		}
		q, found := strings.CutPrefix(strings.TrimSpace(params), "q=")
		if !found {
			return true
		}
		v, err := strconv.ParseFloat(q, 64)
		return err == nil && v > 0
	}
	return false
}

// fetchChannel is the page's script: fetch the channel, parse it, and
// report what it decoded, with what the browser's resource timing says
// came over the wire. Awaiting the timing entry through an observer, not a
// timer, keeps it deterministic.
const fetchChannel = `(async () => {
	const url = new URL("/channel", location.href).href;
	const timing = new Promise(resolve => {
		new PerformanceObserver((list, observer) => {
			for (const e of list.getEntries()) {
				if (e.name === url) { observer.disconnect(); resolve(e); }
			}
		}).observe({type: "resource", buffered: true});
	});
	const r = await fetch(url, {cache: "no-store"});
	const text = await r.text();
	const doc = JSON.parse(text);
	let fnv = 0x811c9dc5;
	for (let i = 0; i < text.length; i++) {
		fnv = Math.imul(fnv ^ text.charCodeAt(i), 0x01000193) >>> 0;
	}
	const t = await timing;
	return {
		status: r.status,
		encoding: r.headers.get("content-encoding"),
		length: text.length,
		fnv: fnv,
		channel: doc.channel,
		items: doc.items.length,
		encodedBodySize: t.encodedBodySize,
		decodedBodySize: t.decodedBodySize,
	};
})()`

// decoded is what fetchChannel reports.
type decoded struct {
	Status          int    `json:"status"`
	Encoding        string `json:"encoding"`
	Length          int    `json:"length"`
	FNV             uint32 `json:"fnv"`
	Channel         string `json:"channel"`
	Items           int    `json:"items"`
	EncodedBodySize int    `json:"encodedBodySize"`
	DecodedBodySize int    `json:"decodedBodySize"`
}

// checkDecoded checks that the page decoded the channel to the original,
// and that the server sent it as coding ("zstd" or "" for identity).
func checkDecoded(t *testing.T, c channel, got decoded, rec *Recorder, coding string) {
	t.Helper()
	h := fnv.New32a()
	h.Write(c.doc)
	want := decoded{
		Status: 200, Encoding: coding, Length: len(c.doc), FNV: h.Sum32(),
		Channel: "physics-101", Items: c.items,
		EncodedBodySize: len(c.doc), DecodedBodySize: len(c.doc),
	}
	wantBody, what := c.doc, "JSON"
	if coding == "zstd" {
		want.EncodedBodySize = len(c.frame)
		wantBody, what = c.frame, "zstd frame"
	}
	if got != want {
		t.Errorf("the page decoded\n%+v\nwant\n%+v", got, want)
	}
	e, ok := rec.Last("/channel")
	if !ok {
		t.Fatal("the server saw no request for /channel")
	}
	if ce := e.Header.Get("Content-Encoding"); e.Status != 200 || ce != coding {
		t.Errorf("the server sent status %d, Content-Encoding %q; want 200, %q", e.Status, ce, coding)
	}
	if !bytes.Equal(e.Body, wantBody) {
		t.Errorf("the server sent a body of %d bytes, not the %d bytes of the %s", len(e.Body), len(wantBody), what)
	}
}

// TestZstdToBrowser is the proof the harness works: Chromium offers zstd
// to loopback http and to https with the test's own certificate, the
// server sends the stored frame as it is, and the page decodes it to the
// original JSON.
func TestZstdToBrowser(t *testing.T) {
	t.Parallel()
	start := time.Now()
	b := shared(t)
	tab := b.Tab(t)
	t.Logf("%s ready in %v", b.Version(), time.Since(start))
	c := newChannel(t)
	t.Logf("channel: %d bytes of JSON, a zstd frame of %d", len(c.doc), len(c.frame))

	for _, tc := range []struct {
		name string
		srv  func(*testing.T, http.Handler) *httptest.Server
	}{
		{"http loopback", func(t *testing.T, h http.Handler) *httptest.Server {
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)
			return srv
		}},
		{"https", func(t *testing.T, h http.Handler) *httptest.Server { return NewTLSServer(t, h) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := Record(c.handler())
			srv := tc.srv(t, rec)
			start := time.Now()
			var got decoded
			if err := tab.Eval(evalContext(t), srv.URL+"/", fetchChannel, &got); err != nil {
				t.Fatal(err)
			}
			t.Logf("page evaluated in %v", time.Since(start))
			e, _ := rec.Last("/channel")
			t.Logf("%s %s: Accept-Encoding %q", srv.URL, e.Proto, e.RequestHeader.Get("Accept-Encoding"))
			checkDecoded(t, c, got, rec, "zstd")

			// Fetch hands back the decoded text itself.
			r, err := tab.Fetch(evalContext(t), srv.URL+"/", srv.URL+"/channel")
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != 200 || r.Header["content-encoding"] != "zstd" || r.Body != string(c.doc) {
				t.Errorf("Fetch: status %d, content-encoding %q, body of %d bytes equal to the JSON: %v",
					r.Status, r.Header["content-encoding"], len(r.Body), r.Body == string(c.doc))
			}
			if e, _ := rec.Last("/channel"); !bytes.Equal(e.Body, c.frame) {
				t.Error("Fetch: the server did not send the frame")
			}
		})
	}
}

// withHost is u with its host name replaced, its port kept.
func withHost(t *testing.T, u, host string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	p.Host = net.JoinHostPort(host, p.Port())
	return p.String()
}

// serveOn starts an http server for h on addr ("127.0.0.2:0"), or skips.
func serveOn(t *testing.T, addr string, h http.Handler) *httptest.Server {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s: %v", addr, err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// TestAcceptEncoding records which origins Chromium offers zstd to: https,
// and http on loopback addresses and localhost names, but not plain http of
// another name (example.test, resolved to 127.0.0.1 by the browser alone).
// Where zstd is not offered, the handler's identity fallback reaches the
// page intact.
func TestAcceptEncoding(t *testing.T) {
	t.Parallel()
	tab := shared(t).Tab(t) // example.test mapped to 127.0.0.1
	c := newChannel(t)
	rec := Record(c.handler())
	plain := httptest.NewServer(rec)
	t.Cleanup(plain.Close)
	secure := NewTLSServer(t, rec)

	for _, tc := range []struct {
		name string
		url  func(t *testing.T) string
		zstd bool
	}{
		{"http 127.0.0.1", func(t *testing.T) string { return plain.URL }, true},
		{"http 127.0.0.2", func(t *testing.T) string { return serveOn(t, "127.0.0.2:0", rec).URL }, true},
		{"http [::1]", func(t *testing.T) string { return serveOn(t, "[::1]:0", rec).URL }, true},
		{"http localhost", func(t *testing.T) string { return withHost(t, plain.URL, "localhost") }, true},
		{"http app.localhost", func(t *testing.T) string { return withHost(t, plain.URL, "app.localhost") }, true},
		{"http example.test", func(t *testing.T) string { return withHost(t, plain.URL, "example.test") }, false},
		{"https 127.0.0.1", func(t *testing.T) string { return secure.URL }, true},
		{"https localhost", func(t *testing.T) string { return withHost(t, secure.URL, "localhost") }, true},
		{"https example.test", func(t *testing.T) string { return withHost(t, secure.URL, "example.test") }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := tc.url(t)
			var got decoded
			if err := tab.Eval(evalContext(t), u+"/", fetchChannel, &got); err != nil {
				t.Fatal(err)
			}
			e, _ := rec.Last("/channel")
			ae := e.RequestHeader.Get("Accept-Encoding")
			t.Logf("%s (%s): Accept-Encoding %q", u, e.Proto, ae)
			if offers(ae, "zstd") != tc.zstd {
				t.Errorf("Chromium offers zstd to %s: %v, want %v", u, !tc.zstd, tc.zstd)
			}
			coding := ""
			if tc.zstd {
				coding = "zstd"
			}
			checkDecoded(t, c, got, rec, coding)
		})
	}
}

// TestCertificateTrust checks that a certificate the browser was not told
// of does not load, and that --ignore-certificate-errors, the other way of
// trusting it, keeps the origin secure (zstd offered) as the SPKI list does.
func TestCertificateTrust(t *testing.T) {
	t.Parallel()
	c := newChannel(t)
	other, err := newCertificate() // not the package's: no SPKI list names it
	if err != nil {
		t.Fatal(err)
	}
	rec := Record(c.handler())
	srv := httptest.NewUnstartedServer(rec)
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{other}}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake
	srv.StartTLS()
	t.Cleanup(srv.Close)

	t.Run("unknown certificate", func(t *testing.T) {
		b := shared(t)
		err := b.Eval(evalContext(t), srv.URL+"/", "1", nil)
		if err == nil || !strings.Contains(err.Error(), "ERR_CERT_AUTHORITY_INVALID") {
			t.Fatalf("Eval on a server with an unknown certificate: %v, want net::ERR_CERT_AUTHORITY_INVALID", err)
		}
	})
	t.Run("--ignore-certificate-errors", func(t *testing.T) {
		b := Start(t, Flag("--ignore-certificate-errors"))
		var got decoded
		if err := b.Eval(evalContext(t), srv.URL+"/", fetchChannel, &got); err != nil {
			t.Fatal(err)
		}
		e, _ := rec.Last("/channel")
		t.Logf("Accept-Encoding %q", e.RequestHeader.Get("Accept-Encoding"))
		checkDecoded(t, c, got, rec, "zstd")
	})
}

// TestEvalErrors checks that what goes wrong in the page comes back as an
// error that says what, that the tab still evaluates afterwards, and not
// once closed.
func TestEvalErrors(t *testing.T) {
	t.Parallel()
	tab := shared(t).Tab(t)
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", Page)
	mux.HandleFunc("GET /broken", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusInternalServerError) })
	mux.HandleFunc("GET /away", func(w http.ResponseWriter, r *http.Request) {
		_, port, _ := net.SplitHostPort(r.Host)
		http.Redirect(w, r, "http://localhost:"+port+"/", http.StatusFound) // another origin
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	closed := httptest.NewServer(mux)
	closed.Close()

	for _, tc := range []struct {
		name, page, expr, want string
		out                    any
	}{
		{"exception", srv.URL + "/", `Promise.reject(new Error("boom"))`, "the expression threw: Error: boom", nil},
		{"undefined", srv.URL + "/", `void 0`, "the expression's value is undefined", new(int)},
		{"wrong type", srv.URL + "/", `"text"`, "cannot unmarshal string", new(int)},
		{"error status without a body", srv.URL + "/broken", `1`, "net::ERR_HTTP_RESPONSE_CODE_FAILURE", nil},
		{"connection refused", closed.URL + "/", `1`, "net::ERR_CONNECTION_REFUSED", nil},
		{"redirected to another origin", srv.URL + "/away", `1`, "not the one asked for", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tab.Eval(evalContext(t), tc.page, tc.expr, tc.out)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Eval(%s) = %v, want an error containing %q", tc.expr, err, tc.want)
			}
		})
	}
	var two int
	if err := tab.Eval(evalContext(t), srv.URL+"/", `1 + 1`, &two); err != nil || two != 2 {
		t.Fatalf("after the errors, Eval(1 + 1) = %d, %v", two, err)
	}
	if err := tab.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tab.Eval(evalContext(t), srv.URL+"/", `1`, nil); err == nil || !strings.Contains(err.Error(), "the tab is closed") {
		t.Fatalf("Eval on a closed tab: %v, want an error saying it is closed", err)
	}
}

// TestEvalCutShort checks that a call cut short by its context leaves the
// browser failing fast rather than hanging, and still closing (Start's
// cleanup). It breaks its browser, so the browser is its own.
func TestEvalCutShort(t *testing.T) {
	t.Parallel()
	b := Start(t)
	srv := httptest.NewServer(Page)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	err := b.Eval(ctx, srv.URL+"/", `new Promise(() => {})`, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Eval of a promise that never settles, with a deadline: %v, want context.DeadlineExceeded", err)
	}
	start := time.Now()
	if err := b.Eval(evalContext(t), srv.URL+"/", `1`, nil); err == nil || time.Since(start) > time.Second {
		t.Fatalf("Eval after one cut short: %v after %v, want a prompt error", err, time.Since(start))
	}
}

// TestFind checks that PACKCACHE_BROWSER names the browser, and that a
// wrong one is an error, not a fallback to PATH.
func TestFind(t *testing.T) {
	t.Setenv(BrowserEnv, "no-such-browser")
	if p, err := Find(); err == nil {
		t.Fatalf("Find with %s=no-such-browser = %q, want an error", BrowserEnv, p)
	}
}

// TestRecorder checks what the Recorder keeps in the cases net/http
// treats specially, without a browser.
func TestRecorder(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.HandleFunc("/implicit", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"a":`))
		w.Header().Set("X-Late", "not sent") // after the header went out
		w.Write([]byte(`1}`))
	})
	mux.HandleFunc("/interim", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("made"))
	})
	mux.HandleFunc("/flush", func(w http.ResponseWriter, r *http.Request) {
		w.(http.Flusher).Flush()
		w.Write([]byte("after"))
	})
	rec := Record(mux)
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)

	for _, tc := range []struct {
		method, path string
		status       int
		body         string
		header       http.Header
	}{
		{"GET", "/implicit", 200, `{"a":1}`, http.Header{"Content-Type": {"application/json"}}},
		{"HEAD", "/implicit", 200, "", http.Header{"Content-Type": {"application/json"}}},
		{"GET", "/interim", 201, "made", http.Header{"Link": {"</style.css>; rel=preload"}}},
		{"GET", "/flush", 200, "after", http.Header{}},
	} {
		req, err := http.NewRequestWithContext(t.Context(), tc.method, srv.URL+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Accept-Encoding", "zstd")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		e, ok := rec.Last(tc.path)
		if !ok {
			t.Fatalf("%s %s: not recorded", tc.method, tc.path)
		}
		if e.Method != tc.method || e.Status != tc.status || string(e.Body) != tc.body ||
			!reflect.DeepEqual(e.Header, tc.header) || e.RequestHeader.Get("Accept-Encoding") != "zstd" {
			t.Errorf("%s %s: recorded %s, status %d, body %q, header %v, Accept-Encoding %q; want status %d, body %q, header %v, Accept-Encoding \"zstd\"",
				tc.method, tc.path, e.Method, e.Status, e.Body, e.Header, e.RequestHeader.Get("Accept-Encoding"), tc.status, tc.body, tc.header)
		}
	}
	if n := len(rec.Exchanges()); n != 4 {
		t.Errorf("%d exchanges recorded, want 4", n)
	}
}

func TestOriginOf(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8080/x": "http://127.0.0.1:8080",
		"https://LocalHost:443/":  "https://localhost",
		"http://example.test:80":  "http://example.test",
		"http://[::1]:9000/a?b=c": "http://[::1]:9000",
		"https://app.localhost/":  "https://app.localhost",
	} {
		u, err := url.Parse(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := originOf(u); got != want {
			t.Errorf("originOf(%s) = %s, want %s", in, got, want)
		}
	}
}
