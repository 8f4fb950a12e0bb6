package packcache_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// Serve: what it sends for each Accept-Encoding, the headers every
// response carries, the statuses of failures, what a hot key costs with
// the near cache, and that a Go client and curl decode it.

// serveOnce runs Serve for one request and returns the response recorded.
func serveOnce[T any](c *packcache.Cache[T], key, method string, header ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, "/"+key, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	c.Serve(rec, req, key)
	return rec
}

func unzstd(t *testing.T, b []byte) []byte {
	t.Helper()
	d, err := zstd.NewReader(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	out, err := d.DecodeAll(b, nil)
	if err != nil {
		t.Fatalf("zstd: %v", err)
	}
	return out
}

func ungzip(t *testing.T, b []byte) []byte {
	t.Helper()
	r, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("gzip: %v", err)
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("gzip: %v", err)
	}
	return out
}

// decoded returns the body of rec with its content coding undone.
func decoded(t *testing.T, rec *httptest.ResponseRecorder) []byte {
	t.Helper()
	switch ce := rec.Header().Get("Content-Encoding"); ce {
	case "zstd":
		return unzstd(t, rec.Body.Bytes())
	case "gzip":
		return ungzip(t, rec.Body.Bytes())
	case "":
		return rec.Body.Bytes()
	default:
		t.Fatalf("Content-Encoding %q", ce)
		return nil
	}
}

// checkHeaders checks what every 200 of Serve carries.
func checkHeaders(t *testing.T, rec *httptest.ResponseRecorder, contentType string) {
	t.Helper()
	h := rec.Header()
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d, want 200: %s", rec.Code, rec.Body)
	}
	if got := h.Get("Content-Type"); got != contentType {
		t.Errorf("Content-Type %q, want %q", got, contentType)
	}
	if got := h.Get("Vary"); got != "Accept-Encoding" {
		t.Errorf("Vary %q", got)
	}
	if n, err := strconv.Atoi(h.Get("Content-Length")); err != nil || n != rec.Body.Len() {
		t.Errorf("Content-Length %q for a body of %d bytes", h.Get("Content-Length"), rec.Body.Len())
	}
	if et := h.Get("Etag"); len(et) < 3 || et[0] != '"' || et[len(et)-1] != '"' || strings.HasPrefix(et, "W/") {
		t.Errorf("ETag %q is not a strong entity tag", et)
	}
}

// checkJSON checks that b is the JSON of want.
func checkJSON[T any](t *testing.T, b []byte, want T) {
	t.Helper()
	var got T
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("body is not JSON: %v (%.60q)", err, b)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatal("body decodes to another value")
	}
}

// TestServeCodings: what Accept-Encoding gets, end to end, for a zstd
// value of 128 KB: the stored frame for zstd, the JSON gzipped or as it
// is, 406 when nothing is acceptable. Every form of the field, q-values
// included, is internal/httpenc's TestPickCodings.
func TestServeCodings(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	// ZstdDefault: a frame smaller than the value gzipped, so that a tie
	// of the two goes to the frame (the other way is TestServeTieSmaller).
	c := mustNew[Channel](t, rdb, packcache.WithCodec(codec.ZstdDefault))
	ch := makeChannel(1, 128<<10)
	if err := c.Set(ctxT(t), "ch", ch); err != nil {
		t.Fatal(err)
	}
	stored := rawGet(t, rdb, "ch")
	if stored[0] != codec.HeaderZstd {
		t.Fatalf("stored with header %#x", stored[0])
	}
	for _, tc := range []struct {
		accept []string // nil: no Accept-Encoding
		want   string   // Content-Encoding, or "406"
	}{
		{nil, ""},
		{[]string{"gzip, deflate, br, zstd"}, "zstd"}, // Chromium's
		{[]string{"gzip"}, "gzip"},
		{[]string{"zstd;q=0.5, gzip;q=0.8"}, "gzip"},
		{[]string{"zstd;q=0", "gzip;q=0"}, ""},
		{[]string{"*"}, "zstd"},
		{[]string{"br, identity;q=0"}, "406"},
	} {
		var hdr []string
		for _, v := range tc.accept {
			hdr = append(hdr, "Accept-Encoding", v)
		}
		rec := serveOnce(c, "ch", "GET", hdr...)
		if tc.want == "406" {
			if rec.Code != http.StatusNotAcceptable {
				t.Errorf("Accept-Encoding %q: status %d, want 406", tc.accept, rec.Code)
			}
			continue
		}
		checkHeaders(t, rec, "application/json")
		if got := rec.Header().Get("Content-Encoding"); got != tc.want {
			t.Errorf("Accept-Encoding %q: Content-Encoding %q, want %q", tc.accept, got, tc.want)
			continue
		}
		if tc.want == "zstd" && !bytes.Equal(rec.Body.Bytes(), stored[1:]) {
			t.Errorf("Accept-Encoding %q: the body is not the stored frame", tc.accept)
		}
		checkJSON(t, decoded(t, rec), ch)
	}
}

// TestServeETag: a strong ETag per value and coding; If-None-Match gets
// 304 without a body; a new value has a new ETag. The forms
// If-None-Match may take are internal/httpenc's TestWriteNotModified.
func TestServeETag(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	c := mustNew[Channel](t, rdb)
	ctx := ctxT(t)
	if err := c.Set(ctx, "ch", makeChannel(2, 64<<10)); err != nil {
		t.Fatal(err)
	}
	tags := map[string]string{}
	for _, ae := range []string{"zstd", "gzip", "identity"} {
		a := serveOnce(c, "ch", "GET", "Accept-Encoding", ae)
		b := serveOnce(c, "ch", "GET", "Accept-Encoding", ae)
		if a.Header().Get("Etag") != b.Header().Get("Etag") {
			t.Errorf("%s: ETag %s then %s for the same value", ae, a.Header().Get("Etag"), b.Header().Get("Etag"))
		}
		tags[ae] = a.Header().Get("Etag")
	}
	if tags["zstd"] == tags["gzip"] || tags["gzip"] == tags["identity"] || tags["zstd"] == tags["identity"] {
		t.Errorf("ETags not distinct per coding: %v", tags)
	}
	for ae, tag := range tags {
		for _, inm := range []string{tag, "*"} {
			rec := serveOnce(c, "ch", "GET", "Accept-Encoding", ae, "If-None-Match", inm)
			if rec.Code != http.StatusNotModified || rec.Body.Len() != 0 {
				t.Errorf("%s, If-None-Match %s: status %d with %d bytes, want 304 without a body", ae, inm, rec.Code, rec.Body.Len())
			}
			h := rec.Header()
			if h.Get("Etag") != tag || h.Get("Vary") != "Accept-Encoding" || h.Get("Content-Encoding") != "" || h.Get("Content-Length") != "" {
				t.Errorf("%s: 304 headers %v", ae, h)
			}
		}
		// Another coding's tag does not match this coding's body.
		for other, otag := range tags {
			if other != ae {
				if rec := serveOnce(c, "ch", "GET", "Accept-Encoding", ae, "If-None-Match", otag); rec.Code != http.StatusOK {
					t.Errorf("%s with the ETag of %s: status %d, want 200", ae, other, rec.Code)
				}
			}
		}
	}
	if err := c.Set(ctx, "ch", makeChannel(3, 64<<10)); err != nil {
		t.Fatal(err)
	}
	for ae, tag := range tags {
		rec := serveOnce(c, "ch", "GET", "Accept-Encoding", ae, "If-None-Match", tag)
		if rec.Code != http.StatusOK || rec.Header().Get("Etag") == tag {
			t.Errorf("%s after a Set: status %d, ETag %s (was %s)", ae, rec.Code, rec.Header().Get("Etag"), tag)
		}
	}
}

// TestServeHead: HEAD gets GET's headers, Content-Length included, and no
// body; other methods get 405.
func TestServeHead(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	c := mustNew[Channel](t, rdb)
	if err := c.Set(ctxT(t), "ch", makeChannel(4, 32<<10)); err != nil {
		t.Fatal(err)
	}
	for _, ae := range []string{"zstd", "gzip", "identity"} {
		get := serveOnce(c, "ch", "GET", "Accept-Encoding", ae)
		head := serveOnce(c, "ch", "HEAD", "Accept-Encoding", ae)
		if head.Code != http.StatusOK || head.Body.Len() != 0 {
			t.Errorf("%s: HEAD status %d with %d bytes", ae, head.Code, head.Body.Len())
		}
		for _, k := range []string{"Content-Type", "Content-Length", "Content-Encoding", "Etag", "Vary"} {
			if head.Header().Get(k) != get.Header().Get(k) {
				t.Errorf("%s: HEAD %s %q, GET %q", ae, k, head.Header().Get(k), get.Header().Get(k))
			}
		}
	}
	for _, m := range []string{"POST", "PUT", "DELETE"} {
		rec := serveOnce(c, "ch", m)
		if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" {
			t.Errorf("%s: status %d, Allow %q", m, rec.Code, rec.Header().Get("Allow"))
		}
	}
}

// TestServeApplicationHeaders: what the application set before Serve
// stays: its Vary joins Accept-Encoding, its Content-Type and
// Cache-Control are kept.
func TestServeApplicationHeaders(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	c := mustNew[Channel](t, rdb)
	if err := c.Set(ctxT(t), "ch", makeChannel(5, 8<<10)); err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest("GET", "/ch", nil)
	req.Header.Set("Accept-Encoding", "gzip")
	rec := httptest.NewRecorder()
	rec.Header().Set("Vary", "Origin")
	rec.Header().Set("Cache-Control", "public, max-age=5")
	rec.Header().Set("Content-Type", "application/vnd.channel+json")
	c.Serve(rec, req, "ch")
	h := rec.Header()
	if got := h.Values("Vary"); !reflect.DeepEqual(got, []string{"Origin", "Accept-Encoding"}) {
		t.Errorf("Vary %q", got)
	}
	if h.Get("Cache-Control") != "public, max-age=5" || h.Get("Content-Type") != "application/vnd.channel+json" {
		t.Errorf("headers %v", h)
	}
}

// TestServeSmallNotGzipped: below 1 KiB gzip gains too little to be sent.
func TestServeSmallNotGzipped(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	c := mustNew[json.RawMessage](t, rdb)
	ctx := ctxT(t)
	for _, n := range []int{10, 1000, 2000} {
		v := json.RawMessage(jsonText(n))
		if err := c.Set(ctx, "v", v); err != nil {
			t.Fatal(err)
		}
		rec := serveOnce(c, "v", "GET", "Accept-Encoding", "gzip")
		checkHeaders(t, rec, "application/json")
		want := ""
		if n >= 1024 {
			want = "gzip"
		}
		if got := rec.Header().Get("Content-Encoding"); got != want {
			t.Errorf("%d bytes: Content-Encoding %q, want %q", n, got, want)
		}
		if !bytes.Equal(decoded(t, rec), v) {
			t.Errorf("%d bytes: body differs", n)
		}
	}
}

// TestServeNotPassedThrough: values that are not zstd frames a browser
// takes are served as JSON, gzipped for a client that takes gzip: LZ4,
// Snappy, plain, a zstd frame declaring a 16 MiB window, and a value just
// loaded (the next request gets the stored frame).
func TestServeNotPassedThrough(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	ch := makeChannel(6, 64<<10)
	js, _ := json.Marshal(ch)
	for _, cd := range []codec.Codec{codec.LZ4, codec.Snappy, codec.None} {
		c := mustNew[Channel](t, rdb, packcache.WithCodec(cd))
		if err := c.Set(ctx, "ch:"+cd.Name(), ch); err != nil {
			t.Fatal(err)
		}
		rec := serveOnce(c, "ch:"+cd.Name(), "GET", "Accept-Encoding", "zstd, gzip")
		checkHeaders(t, rec, "application/json")
		if got := rec.Header().Get("Content-Encoding"); got != "gzip" {
			t.Errorf("%s: Content-Encoding %q, want gzip", cd.Name(), got)
		}
		checkJSON(t, decoded(t, rec), ch)
		if rec := serveOnce(c, "ch:"+cd.Name(), "GET", "Accept-Encoding", "zstd"); rec.Code != http.StatusOK || rec.Header().Get("Content-Encoding") != "" {
			t.Errorf("%s, zstd only: status %d, Content-Encoding %q, want identity", cd.Name(), rec.Code, rec.Header().Get("Content-Encoding"))
		}
	}

	// A frame with a window browsers refuse, as another writer may store.
	enc, err := zstd.NewWriter(nil, zstd.WithWindowSize(16<<20), zstd.WithSingleSegment(false))
	if err != nil {
		t.Fatal(err)
	}
	wide := append([]byte{codec.HeaderZstd}, enc.EncodeAll(js, nil)...)
	// The encoder shrinks the window to the value: declare 16 MiB, as
	// a writer that keeps its window would (Window_Descriptor, byte 5 of
	// a frame that is not single-segment; exponent 14 is 2^24).
	wide[1+5] = 14 << 3
	var h zstd.Header
	if err := h.Decode(wide[1:]); err != nil || h.SingleSegment || h.WindowSize != 16<<20 {
		t.Fatalf("test frame: %+v, %v", h, err)
	}
	if err := rdb.Set(ctx, "wide", wide, 0).Err(); err != nil {
		t.Fatal(err)
	}
	c := mustNew[Channel](t, rdb)
	rec := serveOnce(c, "wide", "GET", "Accept-Encoding", "zstd, gzip")
	checkHeaders(t, rec, "application/json")
	if got := rec.Header().Get("Content-Encoding"); got != "gzip" {
		t.Errorf("16 MiB window: Content-Encoding %q, want gzip", got)
	}
	checkJSON(t, decoded(t, rec), ch)

	// A value just loaded, then the same value read from Redis.
	var loads atomic.Int64
	lc := mustNew[Channel](t, rdb, packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
		loads.Add(1)
		return ch, nil
	})))
	// Just loaded: no stored frame to pass on, so the body is made, in
	// the smaller of zstd and gzip (TestServeMadeOnTheFly).
	first := serveOnce(lc, "loaded", "GET", "Accept-Encoding", "zstd, gzip")
	checkHeaders(t, first, "application/json")
	if got := first.Header().Get("Content-Encoding"); got != "zstd" || bytes.Equal(first.Body.Bytes(), rawGet(t, rdb, "loaded")[1:]) {
		t.Errorf("just loaded: Content-Encoding %q, want a zstd frame made for the request", got)
	}
	checkJSON(t, decoded(t, first), ch)
	time.Sleep(20 * time.Millisecond) // past the share window
	second := serveOnce(lc, "loaded", "GET", "Accept-Encoding", "zstd")
	if got := second.Header().Get("Content-Encoding"); got != "zstd" || !bytes.Equal(second.Body.Bytes(), rawGet(t, rdb, "loaded")[1:]) {
		t.Errorf("read after the load: Content-Encoding %q, want the stored frame", got)
	}
	if loads.Load() != 1 {
		t.Errorf("%d loads, want 1", loads.Load())
	}
}

// TestServeContentType: application/json for the JSON serializers and
// json.RawMessage; a serializer's own ContentType; octet-stream for the
// rest and for []byte.
func TestServeContentType(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	raw := mustNew[json.RawMessage](t, rdb)
	if err := raw.Set(ctx, "raw", json.RawMessage(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	bs := mustNew[[]byte](t, rdb)
	if err := bs.Set(ctx, "bytes", []byte("some bytes")); err != nil {
		t.Fatal(err)
	}
	typed := mustNew[Channel](t, rdb, packcache.WithSerializer(textSerializer{}))
	if err := typed.Set(ctx, "own", Channel{ID: "x"}); err != nil {
		t.Fatal(err)
	}
	binary := mustNew[Channel](t, rdb, packcache.WithSerializer(binarySerializer{}))
	if err := binary.Set(ctx, "binary", Channel{ID: "y"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rec  *httptest.ResponseRecorder
		want string
		body string
	}{
		{serveOnce(raw, "raw", "GET"), "application/json", `{"a":1}`},
		{serveOnce(bs, "bytes", "GET"), "application/octet-stream", "some bytes"},
		{serveOnce(typed, "own", "GET"), "text/x-channel", "x"},
		{serveOnce(binary, "binary", "GET"), "application/octet-stream", "\x00y"},
	} {
		checkHeaders(t, tc.rec, tc.want)
		if tc.rec.Body.String() != tc.body {
			t.Errorf("%s: body %q, want %q", tc.want, tc.rec.Body, tc.body)
		}
	}
}

// textSerializer writes a channel as its ID and names its media type.
type textSerializer struct{}

func (textSerializer) Marshal(dst []byte, v any) ([]byte, error) {
	return append(dst, v.(*Channel).ID...), nil
}
func (textSerializer) Unmarshal(data []byte, v any) error {
	*v.(*Channel) = Channel{ID: string(data)}
	return nil
}
func (textSerializer) Text() bool          { return true }
func (textSerializer) ContentType() string { return "text/x-channel" }

// binarySerializer writes a channel as 0x00 and its ID, and names no media
// type.
type binarySerializer struct{}

func (binarySerializer) Marshal(dst []byte, v any) ([]byte, error) {
	return append(append(dst, 0), v.(*Channel).ID...), nil
}
func (binarySerializer) Unmarshal(data []byte, v any) error {
	*v.(*Channel) = Channel{ID: string(data[1:])}
	return nil
}
func (binarySerializer) Text() bool { return false }

// errorRecorder keeps what the error handler was given.
type errorRecorder struct {
	mu   sync.Mutex
	errs []error
}

func (e *errorRecorder) handle(_ context.Context, _ string, err error) {
	e.mu.Lock()
	e.errs = append(e.errs, err)
	e.mu.Unlock()
}

func (e *errorRecorder) take() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	errs := e.errs
	e.errs = nil
	return errs
}

// checkFailure checks a failure's status, that its body names neither the
// key nor the error, and what the error handler was told (want: one
// error it accepts; nil: nothing).
func checkFailure(t *testing.T, what string, rec *httptest.ResponseRecorder, status int, key string, er *errorRecorder, want func(error) bool) {
	t.Helper()
	if rec.Code != status {
		t.Errorf("%s: status %d, want %d (%s)", what, rec.Code, status, rec.Body)
	}
	if body := rec.Body.String(); body != http.StatusText(status)+"\n" || strings.Contains(body, key) {
		t.Errorf("%s: body %q, want the status text alone", what, body)
	}
	if got := rec.Header().Get("Content-Type"); !strings.HasPrefix(got, "text/plain") {
		t.Errorf("%s: Content-Type %q", what, got)
	}
	errs := er.take()
	switch {
	case want == nil && len(errs) != 0:
		t.Errorf("%s: error handler told %v, want nothing", what, errs)
	case want != nil && (len(errs) != 1 || !want(errs[0])):
		t.Errorf("%s: error handler told %v, want one error of its kind", what, errs)
	}
}

// is returns a predicate for errors matching target.
func is(target error) func(error) bool {
	return func(err error) bool { return errors.Is(err, target) }
}

// TestServeStatuses: every failure's status, what the error handler is
// told, and bodies that tell the client nothing of the key or the error
// unless WithServeError says otherwise.
func TestServeStatuses(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	ctx := ctxT(t)
	er := &errorRecorder{}
	const key = "secret-key-42"
	plain := mustNew[Channel](t, rdb, packcache.WithErrorHandler(er.handle), packcache.WithCircuitBreaker(2, time.Hour),
		packcache.WithRedisTimeout(300*time.Millisecond))
	boom := errors.New("internal detail: db password wrong")
	loading := mustNew[Channel](t, rdb, packcache.WithErrorHandler(er.handle), packcache.WithPrefix("absent", packcache.Policy{NegativeTTL: time.Minute}),
		packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
			switch {
			case strings.HasPrefix(key, "absent"):
				return Channel{}, packcache.ErrNotFound
			case strings.HasPrefix(key, "boom"):
				return Channel{}, boom
			}
			panic("loader of " + key)
		})))

	checkFailure(t, "miss without loader", serveOnce(plain, key, "GET"), 404, key, er, nil)
	checkFailure(t, "loader: not found", serveOnce(loading, "absent-"+key, "GET"), 404, key, er, nil)
	checkFailure(t, "tombstone", serveOnce(loading, "absent-"+key, "GET"), 404, key, er, nil)
	checkFailure(t, "loader error", serveOnce(loading, "boom-"+key, "GET"), 500, key, er, is(boom))
	checkFailure(t, "loader panic", serveOnce(loading, "panic-"+key, "GET"), 500, key, er, func(err error) bool {
		var pe *packcache.PanicError
		return errors.As(err, &pe)
	})
	if err := rdb.Set(ctx, "bad-"+key, "\x07unknown header", 0).Err(); err != nil {
		t.Fatal(err)
	}
	checkFailure(t, "undecodable without loader", serveOnce(plain, "bad-"+key, "GET"), 500, key, er, is(packcache.ErrUnknownHeader))

	// A request whose context is over: the client went away.
	req := httptest.NewRequest("GET", "/", nil)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	rec := httptest.NewRecorder()
	plain.Serve(rec, req.WithContext(cctx), key)
	checkFailure(t, "request cancelled", rec, 503, key, er, nil)

	s.Stop(t)
	checkFailure(t, "Redis down, without loader", serveOnce(plain, key, "GET"), 503, key, er, is(packcache.ErrRedis))
	serveOnce(plain, key, "GET") // the second failure opens the breaker
	er.take()
	checkFailure(t, "breaker open, without loader", serveOnce(plain, key, "GET"), 503, key, er, nil)

	// The application asks for the error.
	custom := mustNew[Channel](t, rdb, packcache.WithRedisTimeout(300*time.Millisecond), packcache.WithServeError(func(w http.ResponseWriter, r *http.Request, status int, err error) {
		http.Error(w, "custom: "+err.Error(), status)
	}))
	if rec := serveOnce(custom, key, "GET"); rec.Code != 503 || !strings.Contains(rec.Body.String(), key) || !strings.Contains(rec.Body.String(), "redis") {
		t.Errorf("WithServeError: status %d, body %q", rec.Code, rec.Body)
	}

	plain.Close()
	checkFailure(t, "closed", serveOnce(plain, key, "GET"), 503, key, er, nil)
}

// TestServeErrorCountsServesStatus: WithServeError's f gets the status
// Serve chose and the read's error, and writes what it likes; Stats.Served
// counts the status Serve chose, not f's; and f changes nothing of what
// the error handler hears (a loader's error, not a miss).
func TestServeErrorCountsServesStatus(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	er := &errorRecorder{}
	boom := errors.New("database down")
	type call struct {
		status int
		err    error
	}
	var calls []call
	c := mustNew[Channel](t, rdb, packcache.WithErrorHandler(er.handle),
		packcache.WithServeError(func(w http.ResponseWriter, r *http.Request, status int, err error) {
			calls = append(calls, call{status, err})
			w.WriteHeader(http.StatusTeapot)
		}),
		packcache.WithPrefix("boom:", packcache.Policy{Loader: packcache.LoaderFunc[Channel](func(context.Context, string) (Channel, error) {
			return Channel{}, boom
		})}))
	if rec := serveOnce(c, "absent", "GET"); rec.Code != http.StatusTeapot {
		t.Errorf("a miss: status %d, want f's 418", rec.Code)
	}
	if rec := serveOnce(c, "boom:k", "GET"); rec.Code != http.StatusTeapot {
		t.Errorf("a loader's error: status %d, want f's 418", rec.Code)
	}
	if len(calls) != 2 || calls[0].status != 404 || !errors.Is(calls[0].err, packcache.ErrMiss) || calls[1].status != 500 || !errors.Is(calls[1].err, boom) {
		t.Errorf("f called with %+v; want 404 with ErrMiss, then 500 with the loader's error", calls)
	}
	served := c.Stats().Served
	if served[packcache.ServeResponse{Status: 404}].Responses != 1 || served[packcache.ServeResponse{Status: 500}].Responses != 1 || served[packcache.ServeResponse{Status: http.StatusTeapot}].Responses != 0 {
		t.Errorf("Stats.Served %v; want one 404 and one 500, the statuses Serve chose", served)
	}
	if errs := er.take(); len(errs) != 1 || !errors.Is(errs[0], boom) {
		t.Errorf("the error handler heard %v; want the loader's error alone", errs)
	}
}

// TestServeNearHotKey: with the near cache a hot key served to many
// clients costs no Redis GET, and the entry weighs the stored frame and
// the bodies made; a write by anyone reaches the clients.
func TestServeNearHotKey(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	redistest.RequireReal(t, s, "the near cache needs CLIENT TRACKING, which miniredis lacks")
	ctx := ctxT(t)
	// A MaxLag of 10 s: the count of GETs below is the near cache's, and a
	// machine loaded enough to miss the default lag (-race beside the other
	// tests) empties it, rightly, and sends the Serves to Redis.
	// ZstdDefault: a frame smaller than the value gzipped, so that the
	// clients below, which accept both alike, get the frame.
	c := mustNew[Channel](t, rdb, packcache.WithCodec(codec.ZstdDefault),
		packcache.WithLocalCache(packcache.LocalCache{MaxBytes: 16 << 20, TTL: time.Minute, MaxLag: 10 * time.Second}))
	ch := makeChannel(7, 128<<10)
	if err := c.Set(ctx, "hot", ch); err != nil {
		t.Fatal(err)
	}
	stored := rawGet(t, rdb, "hot")
	waitNear(t, c, "hot")
	before := c.Stats().NearBytes
	// The entry predates the first Serve: it is read again, once, and
	// then holds the stored frame.
	serveOnce(c, "hot", "GET", "Accept-Encoding", "zstd")
	waitFor(t, 5*time.Second, "a near hit with the stored frame", func() bool {
		hits := c.Stats().NearHits
		rec := serveOnce(c, "hot", "GET", "Accept-Encoding", "zstd")
		return rec.Header().Get("Content-Encoding") == "zstd" && c.Stats().NearHits > hits
	})
	// The entry weighs the stored frame. Each poll serves again: should
	// anything have emptied the near cache meanwhile (a loaded machine's
	// invalidation connection timing out empties it), the entry is made
	// again, with the frame.
	var withFrame uint64
	waitFor(t, 5*time.Second, "the near cache weighing the stored frame", func() bool {
		serveOnce(c, "hot", "GET", "Accept-Encoding", "zstd")
		withFrame = c.Stats().NearBytes
		return withFrame >= before+uint64(len(stored))
	})
	s.ResetStats(t)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 50 {
				rec := serveOnce(c, "hot", "GET", "Accept-Encoding", "gzip, deflate, br, zstd")
				if rec.Code != 200 || !bytes.Equal(rec.Body.Bytes(), stored[1:]) {
					t.Errorf("status %d, %d bytes: not the stored frame", rec.Code, rec.Body.Len())
					return
				}
			}
		})
	}
	wg.Wait()
	if n := s.CommandCount(t, "get"); n != 0 {
		t.Errorf("800 Serves of a hot key made %d Redis GETs, want 0", n)
	}
	// The JSON and gzip bodies are made once, and weighed.
	gz := serveOnce(c, "hot", "GET", "Accept-Encoding", "gzip")
	checkJSON(t, decoded(t, gz), ch)
	id := serveOnce(c, "hot", "GET")
	checkJSON(t, decoded(t, id), ch)
	waitFor(t, 5*time.Second, "the near cache weighing the gzip and identity bodies", func() bool {
		return c.Stats().NearBytes >= withFrame+uint64(id.Body.Len()+gz.Body.Len())
	})
	if n := s.CommandCount(t, "get"); n != 0 {
		t.Errorf("Serves in gzip and identity made %d Redis GETs, want 0", n)
	}

	// Another process writes: the next Serves send the new value.
	ch2 := makeChannel(8, 128<<10)
	other := mustNew[Channel](t, s.Universal(t))
	if err := other.Set(ctx, "hot", ch2); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the new value served", func() bool {
		rec := serveOnce(c, "hot", "GET", "Accept-Encoding", "zstd")
		return bytes.Equal(rec.Body.Bytes(), rawGet(t, rdb, "hot")[1:])
	})
	checkJSON(t, decoded(t, serveOnce(c, "hot", "GET", "Accept-Encoding", "gzip")), ch2)
}

// TestServeClients: a Go client (which asks for gzip and undoes it
// itself), a Go client asking for zstd, and curl --compressed all decode
// what Serve sends, over a real connection, to the original JSON.
func TestServeClients(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[Channel](t, rdb)
	ch := makeChannel(9, 128<<10)
	if err := c.Set(ctx, "ch", ch); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.Serve(w, r, "ch")
	}))
	defer srv.Close()

	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Uncompressed {
		t.Error("the Go client's default request did not get gzip")
	}
	checkJSON(t, b, ch)

	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
	req.Header.Set("Accept-Encoding", "zstd")
	resp, err = srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get("Content-Encoding") != "zstd" || !bytes.Equal(b, rawGet(t, rdb, "ch")[1:]) {
		t.Errorf("zstd request: Content-Encoding %q, not the stored frame", resp.Header.Get("Content-Encoding"))
	}
	checkJSON(t, unzstd(t, b), ch)

	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("no curl")
	}
	for _, args := range [][]string{
		{"--compressed"}, // whatever this curl offers
		{"--compressed", "-H", "Accept-Encoding: zstd"},     // zstd, if this curl decodes it
		{"--compressed", "-H", "Accept-Encoding: gzip"},     // gzip
		{"--compressed", "-H", "Accept-Encoding: zstd;q=0"}, // identity
	} {
		out, err := exec.CommandContext(ctx, curl, append([]string{"-sS", "--fail", "-D", "/dev/stderr", srv.URL}, args...)...).Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				t.Logf("curl stderr: %s", ee.Stderr)
			}
			t.Fatalf("curl %q: %v", args, err)
		}
		checkJSON(t, out, ch)
	}
}

// TestServeConcurrentEdge: Serves of every coding at once, as a near-cache
// entry's bodies are first made, and a write meanwhile: every response is
// a whole value, old or new. (Run with -race.)
func TestServeConcurrentEdge(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	redistest.RequireReal(t, s, "the near cache needs CLIENT TRACKING, which miniredis lacks")
	ctx := ctxT(t)
	c := mustNew[Channel](t, rdb, nearOpts(packcache.TrackPrefixes)...)
	a, b := makeChannel(10, 16<<10), makeChannel(11, 16<<10)
	if err := c.Set(ctx, "k", a); err != nil {
		t.Fatal(err)
	}
	waitNear(t, c, "k")
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() {
			ae := []string{"zstd", "gzip", "identity"}[i%3]
			for range 40 {
				rec := serveOnce(c, "k", "GET", "Accept-Encoding", ae)
				var got Channel
				if err := json.Unmarshal(decoded(t, rec), &got); err != nil || got.ID != a.ID && got.ID != b.ID {
					t.Errorf("%s: %v, channel %q", ae, err, got.ID)
					return
				}
			}
		})
	}
	if err := c.Set(ctx, "k", b); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	checkJSON(t, decoded(t, serveOnce(c, "k", "GET", "Accept-Encoding", "gzip")), b)
}
