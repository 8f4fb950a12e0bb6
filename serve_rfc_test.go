package packcache_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// Serve by the RFC and by its doc (issue 24, item 1), against a real
// redis-server: the smaller body on a tie of q-values, If-Match and
// If-Unmodified-Since, a plain value that is not JSON, and a body made on
// the fly.

// farRepeats returns a JSON array of n/4 KiB copies of one string of 4 KiB
// of base64 noise: gzip's 32 KiB window finds the repeats, a zstd frame
// with a 1 KiB window does not.
func farRepeats(n int) []string {
	r := rand.New(rand.NewPCG(7, 8))
	noise := make([]byte, 3<<10)
	for i := range noise {
		noise[i] = byte(r.Uint32())
	}
	s := base64.StdEncoding.EncodeToString(noise)
	out := make([]string, n/len(s))
	for i := range out {
		out[i] = s
	}
	return out
}

// TestServeTieStoredFrame: Accept-Encoding "zstd, gzip" (and Chromium's)
// gets the stored frame as it is, even one larger than the value gzipped,
// as Serve's doc says, with and without a near cache (a value stored
// otherwise gets gzip: TestPickTieStoredFrame).
func TestServeTieStoredFrame(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	ctx := ctxT(t)
	doc := farRepeats(96 << 10)
	plain, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	gz := gzipBytes(t, plain)
	frame := func(opts ...zstd.EOption) []byte {
		enc, err := zstd.NewWriter(nil, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer enc.Close()
		return enc.EncodeAll(plain, nil)
	}
	poor, good := frame(zstd.WithWindowSize(zstd.MinWindowSize)), frame(zstd.WithEncoderLevel(zstd.SpeedBestCompression))
	if len(poor) <= len(gz) || len(good) >= len(gz) {
		t.Fatalf("frames of %d and %d bytes, gzip %d: the test needs one larger than gzip, one smaller", len(poor), len(good), len(gz))
	}
	for key, f := range map[string][]byte{"poor": poor, "good": good} {
		if err := rdb.Set(ctx, key, append([]byte{codec.HeaderZstd}, f...), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	opts := [][]packcache.Option{nil}
	if s.Real() {
		opts = append(opts, []packcache.Option{packcache.WithLocalCache(packcache.LocalCache{MaxBytes: 16 << 20, MaxLag: 10 * time.Second})})
	}
	for _, o := range opts {
		c := mustNew[[]string](t, rdb, o...)
		for _, accept := range []string{"zstd, gzip", "gzip, deflate, br, zstd", "*"} {
			for key, want := range map[string]string{"poor": "zstd", "good": "zstd"} {
				for range 2 { // the second from the near cache's edge
					rec := serveOnce(c, key, "GET", "Accept-Encoding", accept)
					checkHeaders(t, rec, "application/json")
					if got := rec.Header().Get("Content-Encoding"); got != want {
						t.Errorf("near cache %v, frame %s (%d bytes, gzip %d), Accept-Encoding %q: %q of %d bytes, want %s",
							o != nil, key, map[string]int{"poor": len(poor), "good": len(good)}[key], len(gz), accept, got, rec.Body.Len(), want)
						continue
					}
					if !bytes.Equal(decoded(t, rec), plain) {
						t.Errorf("frame %s, Accept-Encoding %q: the body does not decode to the value", key, accept)
					}
				}
			}
		}
	}
}

// TestServePreconditions: If-Match and If-Unmodified-Since fail with 412,
// before If-None-Match is looked at, as net/http's ServeContent answers
// (every combination is internal/httpenc's TestWritePreconditions).
func TestServePreconditions(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	c := mustNew[Channel](t, rdb, packcache.WithCodec(codec.Zstd))
	if err := c.Set(ctxT(t), "ch", makeChannel(3, 16<<10)); err != nil {
		t.Fatal(err)
	}
	tag := serveOnce(c, "ch", "GET", "Accept-Encoding", "zstd").Header().Get("Etag")
	modified := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	before, after := modified.Add(-time.Hour).Format(http.TimeFormat), modified.Add(time.Hour).Format(http.TimeFormat)
	for _, tc := range []struct {
		lastModified bool // the application sets Last-Modified
		header       []string
		want         int
	}{
		{false, []string{"If-Match", tag}, 200},
		{false, []string{"If-Match", "*"}, 200},
		{false, []string{"If-Match", `"other"`}, 412},
		{false, []string{"If-Match", "W/" + tag}, 412}, // strong comparison
		{false, []string{"If-Match", `"other"`, "If-None-Match", tag}, 412},
		{false, []string{"If-Match", tag, "If-None-Match", tag}, 304},
		{false, []string{"If-Unmodified-Since", before}, 200}, // no Last-Modified: ignored
		{true, []string{"If-Unmodified-Since", before}, 412},
		{true, []string{"If-Unmodified-Since", after}, 200},
		{true, []string{"If-Unmodified-Since", before, "If-None-Match", tag}, 412},
		{true, []string{"If-Unmodified-Since", before, "If-Match", tag}, 200}, // If-Match wins
		{true, []string{"If-Modified-Since", after}, 304},
		{true, []string{"If-Modified-Since", after, "If-None-Match", `"other"`}, 200}, // If-None-Match wins
	} {
		req := httptest.NewRequest("GET", "/ch", nil)
		req.Header.Set("Accept-Encoding", "zstd")
		for i := 0; i+1 < len(tc.header); i += 2 {
			req.Header.Set(tc.header[i], tc.header[i+1])
		}
		rec := httptest.NewRecorder()
		if tc.lastModified {
			rec.Header().Set("Last-Modified", modified.Format(http.TimeFormat))
		}
		c.Serve(rec, req, "ch")
		if rec.Code != tc.want {
			t.Errorf("Last-Modified %v, %q: status %d, want %d", tc.lastModified, tc.header, rec.Code, tc.want)
		}
		if tc.want != 200 && (rec.Body.Len() != 0 || rec.Header().Get("Etag") != tag || rec.Header().Get("Content-Type") != "") {
			t.Errorf("%q: status %d with %d bytes, headers %v", tc.header, rec.Code, rec.Body.Len(), rec.Header())
		}
	}
}

// TestServeNotJSON: a plain value that is not JSON (one written by
// redis-cli SET) is a 500 through the error handler, matching
// ErrSerialization, for every Cache whose bodies are application/json,
// json.RawMessage's included, whatever the coding; never a 200 sent as
// application/json. A Cache of []byte sends the bytes as they are.
func TestServeNotJSON(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	notJSON := strings.Repeat("written by redis-cli SET, not JSON; ", 64)
	if err := rdb.Set(ctx, "cli", notJSON, 0).Err(); err != nil {
		t.Fatal(err)
	}
	er := &errorRecorder{}
	raw := mustNew[json.RawMessage](t, rdb, packcache.WithErrorHandler(er.handle))
	typed := mustNew[Channel](t, rdb, packcache.WithErrorHandler(er.handle))
	anyc := mustNew[any](t, rdb, packcache.WithErrorHandler(er.handle))
	for _, accept := range []string{"", "gzip", "zstd", "zstd, gzip"} {
		var hdr []string
		if accept != "" {
			hdr = []string{"Accept-Encoding", accept}
		}
		checkFailure(t, "json.RawMessage, Accept-Encoding "+accept, serveOnce(raw, "cli", "GET", hdr...), 500, "cli", er, is(packcache.ErrSerialization))
		checkFailure(t, "Channel, Accept-Encoding "+accept, serveOnce(typed, "cli", "GET", hdr...), 500, "cli", er, is(packcache.ErrSerialization))
		checkFailure(t, "any, Accept-Encoding "+accept, serveOnce(anyc, "cli", "GET", hdr...), 500, "cli", er, is(packcache.ErrSerialization))
	}
	// A JSON value written the same way is served.
	if err := rdb.Set(ctx, "cli-json", `{"id":"x"}`, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if rec := serveOnce(raw, "cli-json", "GET"); rec.Code != 200 || rec.Body.String() != `{"id":"x"}` {
		t.Errorf("a JSON value: status %d, body %q", rec.Code, rec.Body)
	}
	bytesc := mustNew[[]byte](t, rdb)
	rec := serveOnce(bytesc, "cli", "GET", "Accept-Encoding", "gzip")
	checkHeaders(t, rec, "application/octet-stream")
	if string(decoded(t, rec)) != notJSON {
		t.Error("a Cache of []byte: the body is not the bytes stored")
	}
}

// TestServeMadeOnTheFly: a value just loaded, and one loaded while Redis
// is down, have no stored frame to pass on; a client that accepts zstd
// alone gets them as a zstd frame made for it (a fifth of the JSON here),
// not as 90 KB of identity body; one that accepts gzip alone gets gzip.
func TestServeMadeOnTheFly(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	ch := makeChannel(5, 90<<10)
	plain, err := json.Marshal(ch)
	if err != nil {
		t.Fatal(err)
	}
	c := mustNew[Channel](t, rdb, packcache.WithRedisTimeout(300*time.Millisecond),
		packcache.WithLoader(packcache.LoaderFunc[Channel](func(context.Context, string) (Channel, error) { return ch, nil })))
	check := func(what, key, accept, want string) {
		t.Helper()
		rec := serveOnce(c, key, "GET", "Accept-Encoding", accept)
		checkHeaders(t, rec, "application/json")
		if got := rec.Header().Get("Content-Encoding"); got != want || rec.Body.Len() >= len(plain)/2 {
			t.Errorf("%s, Accept-Encoding %q: %q of %d bytes (the JSON: %d), want %s", what, accept, got, rec.Body.Len(), len(plain), want)
			return
		}
		checkJSON(t, decoded(t, rec), ch)
	}
	check("just loaded", "a", "zstd", "zstd")
	check("just loaded", "b", "gzip", "gzip")
	check("stored by the load", "a", "zstd", "zstd")
	redistest.RequireReal(t, s, "stops the server")
	s.Stop(t)
	check("loaded with Redis down", "c", "zstd", "zstd")
	check("loaded with Redis down", "d", "zstd;q=0.5, gzip;q=0.5", "zstd") // a tie: zstd is the smaller here
	if st := c.Stats(); st.RedisErrors == 0 {
		t.Errorf("Stats: %d Redis errors, want some: Redis was down", st.RedisErrors)
	}
}
