package httpenc

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
)

// channel returns a JSON channel of about n bytes of messages whose texts
// are random words, and the same channel with one message more: v1 and
// v2 of a chat channel.
func channel(n int) (v1, v2 []byte) {
	r := rand.New(rand.NewPCG(3, 4))
	words := strings.Fields("the a cache server value delta message student course lecture note answer question redis zstd window browser")
	msg := func(i int) string {
		var t strings.Builder
		for range 8 + r.IntN(24) {
			t.WriteString(words[r.IntN(len(words))])
			t.WriteByte(' ')
		}
		return fmt.Sprintf(`{"id":%d,"author":"user%d","at":%d,"text":%q}`, i, r.IntN(5000), 1700000000+r.IntN(1e8), t.String())
	}
	var b strings.Builder
	b.WriteString(`{"id":"c1","messages":[`)
	i := 0
	for ; b.Len() < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(msg(i))
	}
	v1 = []byte(b.String() + "]}")
	v2 = []byte(b.String() + "," + msg(i) + "]}")
	return v1, v2
}

// versions is a Versions holding some versions, counting its calls.
type versions struct {
	mu    sync.Mutex
	m     map[Sum][]byte
	ttl   time.Duration
	err   error
	calls atomic.Int64
}

func newVersions(vs ...[]byte) *versions {
	v := &versions{m: map[Sum][]byte{}, ttl: time.Hour}
	for _, b := range vs {
		v.m[SumOf(b)] = b
	}
	return v
}

func (v *versions) Version(_ context.Context, sum Sum) ([]byte, time.Duration, error) {
	v.calls.Add(1)
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.err != nil {
		return nil, 0, v.err
	}
	b, ok := v.m[sum]
	if !ok {
		return nil, 0, nil
	}
	return b, v.ttl, nil
}

// dczRequest is a GET as Chromium sends it holding the version of Sum
// sum.
func dczRequest(sum Sum) *http.Request {
	r := httptest.NewRequest("GET", "/channel/1", nil)
	r.Header.Set("Accept-Encoding", "gzip, deflate, br, zstd, dcb, dcz")
	r.Header.Set("Available-Dictionary", ":"+base64.StdEncoding.EncodeToString(sum[:])+":")
	return r
}

// decodeDcz checks b is a dcz body against dict and returns what it
// decodes to, with a decoder that refuses a window larger than RFC 9842
// allows.
func decodeDcz(t *testing.T, b, dict []byte) []byte {
	t.Helper()
	sum := SumOf(dict)
	// A skippable frame of 32 bytes holding the SHA-256 (RFC 9842,
	// section 4.2), spelled out rather than taken from dczMagic.
	head := append([]byte{0x5e, 0x2a, 0x4d, 0x18, 0x20, 0x00, 0x00, 0x00}, sum[:]...)
	if !bytes.HasPrefix(b, head) {
		t.Fatalf("the body does not begin with the magic and the dictionary's SHA-256: % x", b[:min(len(b), len(head))])
	}
	frame := b[len(head):]
	var h zstd.Header
	if err := h.Decode(frame); err != nil {
		t.Fatal(err)
	}
	limit := max(uint64(8<<20), uint64(len(dict))*5/4)
	if h.DictionaryID != 0 || h.WindowSize > limit {
		t.Fatalf("frame: dictionary id %d, window %d; want none, at most %d", h.DictionaryID, h.WindowSize, limit)
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderDictRaw(0, dict), zstd.WithDecoderMaxWindow(limit), zstd.WithDecoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	out, err := dec.DecodeAll(frame, nil)
	if err != nil {
		t.Fatalf("decoding the dcz frame with the dictionary: %v", err)
	}
	return out
}

// TestDeltaDecodes: a client holding v1 of a 128 KB channel gets v2 (one
// message more) as dcz, in at most 0.05x the zstd frame it would get
// otherwise, and the body decodes to v2 with v1 as a raw dictionary.
func TestDeltaDecodes(t *testing.T) {
	forgetLone()
	v1, v2 := channel(128 << 10)
	stored := storedZstd(t, v2)
	src := &source{plain: v2}
	r := dczRequest(SumOf(v1))
	fallback, err := Pick(r, stored, nil, src)
	if err != nil || fallback.Coding() != "zstd" {
		t.Fatalf("Pick: %v, %v", fallback.Coding(), err)
	}
	b, err := Delta(r, fallback, stored, nil, src, newVersions(v1))
	if err != nil {
		t.Fatal(err)
	}
	if b.Coding() != "dcz" {
		t.Fatalf("coding %q, want dcz", b.Coding())
	}
	if got := decodeDcz(t, b.b, v1); !bytes.Equal(got, v2) {
		t.Fatal("the dcz body does not decode to v2")
	}
	if ratio := float64(len(b.b)) / float64(len(fallback.b)); ratio > 0.05 {
		t.Errorf("dcz body %d bytes, the zstd frame %d: %.3fx, want at most 0.05x", len(b.b), len(fallback.b), ratio)
	}
	if b.etag == fallback.etag || !strings.HasSuffix(b.etag, `-dcz"`) {
		t.Errorf("dcz ETag %s (the frame's %s)", b.etag, fallback.etag)
	}
	t.Logf("v2 %d bytes, zstd frame %d, dcz %d", len(v2), len(fallback.b), len(b.b))
}

// TestDeltaFallback: every request that does not ask for a delta in
// full, or names a version that cannot be had, or whose delta would not
// be smaller, gets the body Pick chose, never an error but a Versions'
// own.
func TestDeltaFallback(t *testing.T) {
	v1, v2 := channel(32 << 10)
	stored := storedZstd(t, v2)
	sum1 := SumOf(v1)
	b64 := base64.StdEncoding.EncodeToString(sum1[:])
	boom := errors.New("boom")
	for _, tc := range []struct {
		name      string
		accept    string
		available []string
		vs        *versions
		fallback  *Body // nil: Pick's
		err       error
	}{
		{name: "no dcz", accept: "gzip, br, zstd", available: []string{":" + b64 + ":"}, vs: newVersions(v1)},
		{name: "dcz;q=0", accept: "zstd, dcz;q=0", available: []string{":" + b64 + ":"}, vs: newVersions(v1)},
		{name: "star", accept: "*", available: []string{":" + b64 + ":"}, vs: newVersions(v1)},
		{name: "no Available-Dictionary", accept: "zstd, dcz", vs: newVersions(v1)},
		{name: "not a byte sequence", accept: "zstd, dcz", available: []string{b64}, vs: newVersions(v1)},
		{name: "not base64", accept: "zstd, dcz", available: []string{":" + b64[:20] + "!" + b64[21:] + ":"}, vs: newVersions(v1)},
		{name: "31 bytes", accept: "zstd, dcz", available: []string{":" + base64.StdEncoding.EncodeToString(sum1[:31]) + ":"}, vs: newVersions(v1)},
		{name: "two fields", accept: "zstd, dcz", available: []string{":" + b64 + ":", ":" + b64 + ":"}, vs: newVersions(v1)},
		{name: "unknown version", accept: "zstd, dcz", available: []string{":" + b64 + ":"}, vs: newVersions(v2)},
		{name: "expired version", accept: "zstd, dcz", available: []string{":" + b64 + ":"}, vs: func() *versions { v := newVersions(v1); v.ttl = 0; return v }()},
		{name: "bytes of another sum", accept: "zstd, dcz", available: []string{":" + b64 + ":"}, vs: &versions{m: map[Sum][]byte{sum1: v2}, ttl: time.Hour}},
		{name: "the value itself", accept: "zstd, dcz", available: []string{":" + base64.StdEncoding.EncodeToString(func() []byte { s := SumOf(v2); return s[:] }()) + ":"}, vs: newVersions(v2)},
		{name: "no smaller", accept: "zstd, dcz", available: []string{":" + b64 + ":"}, vs: newVersions(v1), fallback: &Body{b: []byte("{}"), etag: `"x"`}},
		{name: "Versions fails", accept: "zstd, dcz", available: []string{":" + b64 + ":"}, vs: func() *versions { v := newVersions(v1); v.err = boom; return v }(), err: boom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forgetLone()
			r := httptest.NewRequest("GET", "/channel/1", nil)
			r.Header.Set("Accept-Encoding", tc.accept)
			for _, a := range tc.available {
				r.Header.Add("Available-Dictionary", a)
			}
			src := &source{plain: v2}
			fallback := tc.fallback
			if fallback == nil {
				var err error
				if fallback, err = Pick(r, stored, nil, src); err != nil {
					t.Fatal(err)
				}
			}
			b, err := Delta(r, fallback, stored, nil, src, tc.vs)
			if !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
				t.Errorf("error %v, want %v", err, tc.err)
			}
			if b != fallback {
				t.Errorf("got a %s body of %d bytes, not the fallback (%s)", b.Coding(), len(b.b), fallback.Coding())
			}
		})
	}
}

// TestDeltaKeptOnce: with an Edge, 16 requests at once for the delta
// against one version make it once, all get that one body, and the
// Source is told of its bytes once; a later request reads Versions no
// more.
func TestDeltaKeptOnce(t *testing.T) {
	v1, v2 := channel(64 << 10)
	stored := storedZstd(t, v2)
	eg := NewEdge(stored)
	src := &source{plain: v2}
	vs := newVersions(v1)
	vs.mu.Lock() // the first caller waits here, holding the slot: the others come meanwhile
	var wg sync.WaitGroup
	bodies := make([]*Body, 16)
	started := make(chan struct{}, 16)
	for i := range bodies {
		wg.Go(func() {
			r := dczRequest(SumOf(v1))
			fallback, err := Pick(r, nil, eg, src)
			if err != nil {
				t.Error(err)
				return
			}
			started <- struct{}{}
			b, err := Delta(r, fallback, nil, eg, src, vs)
			if err != nil {
				t.Error(err)
			}
			bodies[i] = b
		})
	}
	for range bodies {
		<-started
	}
	vs.mu.Unlock()
	wg.Wait()
	for _, b := range bodies {
		if b == nil || b.Coding() != "dcz" || b != bodies[0] {
			t.Fatalf("the requests got different bodies, or not dcz: %v", bodies)
		}
	}
	b, err := Delta(dczRequest(SumOf(v1)), eg.kept(codingZstd), nil, eg, src, vs)
	if err != nil || b != bodies[0] {
		t.Fatalf("a later request: %v, %v", b, err)
	}
	// Requests that came after the first had made it found it kept and
	// did not call Versions; those that came while it was made waited.
	if n := vs.calls.Load(); n != 1 {
		t.Errorf("Versions read %d times, want once", n)
	}
	if got := src.keptBytes.Load(); got < int64(len(bodies[0].b)) {
		t.Errorf("Kept told of %d bytes, the delta has %d", got, len(bodies[0].b))
	}
}

// TestDeltaKeptBounded: an Edge keeps the deltas against maxDeltas
// versions; against one more, each request makes its own.
func TestDeltaKeptBounded(t *testing.T) {
	_, v2 := channel(16 << 10)
	stored := storedZstd(t, v2)
	eg := NewEdge(stored)
	src := &source{plain: v2}
	var olds [][]byte
	for i := range maxDeltas + 1 {
		olds = append(olds, append([]byte(nil), v2[:len(v2)-100-i]...))
	}
	vs := newVersions(olds...)
	for range 2 {
		for _, old := range olds {
			r := dczRequest(SumOf(old))
			b, err := Delta(r, &Body{b: v2}, nil, eg, src, vs)
			if err != nil || b.Coding() != "dcz" {
				t.Fatalf("%v, %v", b.Coding(), err)
			}
		}
	}
	if n, want := vs.calls.Load(), int64(maxDeltas+2); n != want {
		t.Errorf("Versions read %d times, want %d (%d kept, the last made twice)", n, want, maxDeltas)
	}
	if len(eg.deltas.m) != maxDeltas {
		t.Errorf("%d deltas kept, want %d", len(eg.deltas.m), maxDeltas)
	}
}

// TestDeltaExpires: a kept delta is used only while Versions said its
// version may be; past that, Versions is asked again.
func TestDeltaExpires(t *testing.T) {
	v1, v2 := channel(16 << 10)
	eg := NewEdge(storedZstd(t, v2))
	src := &source{plain: v2}
	vs := newVersions(v1)
	vs.ttl = time.Nanosecond
	for range 2 {
		if _, err := Delta(dczRequest(SumOf(v1)), &Body{b: v2}, nil, eg, src, vs); err != nil {
			t.Fatal(err)
		}
	}
	if n := vs.calls.Load(); n != 2 {
		t.Errorf("Versions read %d times, want 2", n)
	}
}

// TestOffer: the headers that offer a body as a dictionary.
func TestOffer(t *testing.T) {
	for _, tc := range []struct {
		path, match string
		cache       string // Cache-Control set by the application
		want        string // Cache-Control sent
	}{
		{"/channel/16", `match="/channel/16", id="abc"`, "", "max-age=90"},
		{"/a:b/c*(d)+e", `match="/a\\:b/c\\*\\(d\\)\\+e", id="abc"`, "", "max-age=90"},
		{"/x", `match="/x", id="abc"`, "private, max-age=5", "private, max-age=5"},
	} {
		r := httptest.NewRequest("GET", tc.path, nil)
		h := http.Header{}
		if tc.cache != "" {
			h.Set("Cache-Control", tc.cache)
		}
		h.Set("Vary", "Origin")
		Offer(h, r, "abc", 90*time.Second)
		if got := h.Get("Use-As-Dictionary"); got != tc.match {
			t.Errorf("%s: Use-As-Dictionary %s, want %s", tc.path, got, tc.match)
		}
		if got := h.Get("Cache-Control"); got != tc.want {
			t.Errorf("%s: Cache-Control %q, want %q", tc.path, got, tc.want)
		}
		if got := strings.Join(h["Vary"], ", "); got != "Origin, Available-Dictionary" {
			t.Errorf("%s: Vary %q", tc.path, got)
		}
	}
	h := http.Header{}
	Offer(h, httptest.NewRequest("GET", "/", nil), `"q"`, time.Millisecond)
	if h.Get("Cache-Control") != "max-age=1" || h.Get("Use-As-Dictionary") != `match="/", id="\"q\""` {
		t.Errorf("headers %v", h)
	}
}

// forgetLone empties the deltas kept without an Edge, for a test that
// makes its own.
func forgetLone() {
	for _, s := range []*deltaSet{&loneDeltas, &sentDeltas} {
		s.mu.Lock()
		clear(s.m)
		s.mu.Unlock()
	}
}

// TestDeltaLone: without an Edge, the delta against a version is made
// once for a value in one coding, and a request naming the value itself
// costs one serialization, not one per request.
func TestDeltaLone(t *testing.T) {
	forgetLone()
	v1, v2 := channel(64 << 10)
	stored := storedZstd(t, v2)
	src := &source{plain: v2}
	vs := newVersions(v1)
	var wg sync.WaitGroup
	bodies := make([]*Body, 16)
	for i := range bodies {
		wg.Go(func() {
			r := dczRequest(SumOf(v1))
			fallback, err := Pick(r, stored, nil, src)
			if err != nil {
				t.Error(err)
				return
			}
			if bodies[i], err = Delta(r, fallback, stored, nil, src, vs); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for _, b := range bodies {
		if b.Coding() != "dcz" || b != bodies[0] {
			t.Fatalf("the requests got different bodies, or not dcz")
		}
	}
	if n := vs.calls.Load(); n != 1 {
		t.Errorf("Versions read %d times, want once", n)
	}
	before := src.serialized.Load()
	for range 10 {
		r := dczRequest(SumOf(v2))
		fallback, _ := Pick(r, stored, nil, src)
		if b, err := Delta(r, fallback, stored, nil, src, vs); err != nil || b != fallback {
			t.Fatalf("a request naming the value itself: %v, %v", b.Coding(), err)
		}
	}
	if n := src.serialized.Load() - before; n != 1 {
		t.Errorf("10 requests naming the value itself serialized it %d times, want once", n)
	}
}

// TestDeltaRevalidate: a client that got the value as dcz, and holds it
// now, revalidating with that body's entity tag, gets that body (Write
// answers it 304), with an Edge and without; without If-None-Match, or
// with another tag, it gets the fallback.
func TestDeltaRevalidate(t *testing.T) {
	forgetLone()
	v1, v2 := channel(32 << 10)
	stored := storedZstd(t, v2)
	for _, eg := range []*Edge{NewEdge(stored), nil} {
		src := &source{plain: v2}
		vs := newVersions(v1)
		r := dczRequest(SumOf(v1))
		fallback, _ := Pick(r, stored, eg, src)
		d, err := Delta(r, fallback, stored, eg, src, vs)
		if err != nil || d.Coding() != "dcz" {
			t.Fatalf("edge %v: %v, %v", eg != nil, d.Coding(), err)
		}
		for _, tc := range []struct {
			inm  string
			want *Body
		}{{d.etag, d}, {"W/" + d.etag, d}, {"", fallback}, {`"other"`, fallback}} {
			r := dczRequest(SumOf(v2))
			if tc.inm != "" {
				r.Header.Set("If-None-Match", tc.inm)
			}
			b, err := Delta(r, fallback, stored, eg, src, vs)
			if err != nil || b != tc.want {
				t.Errorf("edge %v, If-None-Match %q: got a %s body, want %s", eg != nil, tc.inm, b.Coding(), tc.want.Coding())
			}
			if tc.want == d {
				w := httptest.NewRecorder()
				if status, _ := Write(w, r, b, "application/json"); status != http.StatusNotModified {
					t.Errorf("edge %v: Write answered %d, want 304", eg != nil, status)
				}
			}
		}
	}
}

// TestDeltaRevalidateOtherEdge: a client that got a dcz body through one
// Edge of the value, or through none, and revalidates it holding the
// value, gets the dcz body (a 304) through another Edge of the same value
// (the near cache made its entry again), or through none.
func TestDeltaRevalidateOtherEdge(t *testing.T) {
	v1, v2 := channel(32 << 10)
	stored := storedZstd(t, v2)
	for _, first := range []*Edge{NewEdge(stored), nil} {
		forgetLone()
		src := &source{plain: v2}
		vs := newVersions(v1)
		r := dczRequest(SumOf(v1))
		fallback, _ := Pick(r, stored, first, src)
		d, err := Delta(r, fallback, stored, first, src, vs)
		if err != nil || d.Coding() != "dcz" {
			t.Fatalf("%v, %v", d.Coding(), err)
		}
		for _, eg := range []*Edge{NewEdge(stored), nil} {
			r := dczRequest(SumOf(v2))
			r.Header.Set("If-None-Match", d.etag)
			fb, _ := Pick(r, stored, eg, src)
			b, err := Delta(r, fb, stored, eg, src, vs)
			if err != nil || b.etag != d.etag {
				t.Fatalf("sent with an edge %v, revalidated with another %v: a %s body (%v), want the dcz body", first != nil, eg != nil, b.Coding(), err)
			}
			if status, _ := Write(httptest.NewRecorder(), r, b, "application/json"); status != http.StatusNotModified {
				t.Errorf("sent with an edge %v, revalidated with another %v: Write answered %d, want 304", first != nil, eg != nil, status)
			}
		}
	}
}
