package httpenc

import (
	"bytes"
	"errors"
	"fmt"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// source is a Source that counts what Pick asks of it.
type source struct {
	plain []byte
	alloc int   // the bytes Serialized says it allocated
	err   error // Serialized's error, if any

	serialized atomic.Int64 // calls of Serialized
	kept       atomic.Int64 // calls of Kept
	keptBytes  atomic.Int64
	edge       atomic.Pointer[Edge] // the Edge Kept was last told of
}

func (s *source) Serialized() ([]byte, int, error) {
	s.serialized.Add(1)
	if s.err != nil {
		return nil, 0, s.err
	}
	return s.plain, s.alloc, nil
}

func (s *source) Kept(eg *Edge, n int) {
	s.kept.Add(1)
	s.keptBytes.Add(int64(n))
	s.edge.Store(eg)
}

// pick runs Pick for a GET with the Accept-Encoding field values given
// (none: no field).
func pick(t *testing.T, stored []byte, eg *Edge, src Source, accept ...string) *Body {
	t.Helper()
	r := httptest.NewRequest("GET", "/k", nil)
	for _, v := range accept {
		r.Header.Add("Accept-Encoding", v)
	}
	b, err := Pick(r, stored, eg, src)
	if err != nil {
		t.Fatalf("Accept-Encoding %q: %v", accept, err)
	}
	return b
}

// TestPickCodings: what each Accept-Encoding gets, q-values honoured, for
// a zstd value of 128 KB; the zstd body is the stored frame, and each
// body decodes to the value.
func TestPickCodings(t *testing.T) {
	plain := document(128 << 10)
	stored := storedZstd(t, plain)
	for _, tc := range []struct {
		accept []string // nil: no Accept-Encoding
		want   string   // Content-Encoding, or "406"
	}{
		{nil, ""},
		{[]string{""}, ""},
		{[]string{"zstd"}, "zstd"},
		{[]string{"gzip, deflate, br, zstd"}, "zstd"}, // Chromium's
		{[]string{"gzip"}, "gzip"},
		{[]string{"x-gzip"}, "gzip"},
		{[]string{"GZIP"}, "gzip"},
		{[]string{"br"}, ""},
		{[]string{"identity"}, ""},
		{[]string{"zstd;q=0, gzip"}, "gzip"},
		{[]string{"zstd;q=0", "gzip;q=0"}, ""},
		{[]string{"zstd; q=0.000"}, ""},
		{[]string{"zstd;q=0.5, gzip;q=0.8"}, "gzip"},
		{[]string{"zstd;q=0.8, gzip;q=0.5"}, "zstd"},
		{[]string{"zstd;q=0.5, gzip;q=0.5"}, "zstd"},
		{[]string{"zstd;q=0.5, identity"}, ""},
		{[]string{"zstd;q=1.0, identity"}, "zstd"},
		{[]string{"zstd;q=2, gzip"}, "gzip"}, // a malformed q: the element is ignored
		{[]string{"zstd;q=abc, gzip"}, "gzip"},
		{[]string{"*"}, "zstd"},
		{[]string{"*;q=0.5, gzip"}, "gzip"},
		{[]string{"*;q=0, gzip"}, "gzip"},
		{[]string{"gzip;q=0, *"}, "zstd"},
		{[]string{"identity;q=0, gzip"}, "gzip"},
		{[]string{"identity;q=0"}, "406"},
		{[]string{"*;q=0"}, "406"},
		{[]string{"br, identity;q=0"}, "406"},
	} {
		for _, eg := range []*Edge{nil, NewEdge(stored)} {
			src := &source{plain: plain}
			b := pick(t, stored, eg, src, tc.accept...)
			if tc.want == "406" {
				if b != nil {
					t.Errorf("Accept-Encoding %q: a body in %q, want none (406)", tc.accept, b.coding)
				}
				continue
			}
			if b == nil || b.coding != tc.want {
				t.Errorf("Accept-Encoding %q: %+.20v, want a body in %q", tc.accept, b, tc.want)
				continue
			}
			if b.coding == "zstd" {
				if !bytes.Equal(b.b, stored[1:]) {
					t.Errorf("Accept-Encoding %q: the body is not the stored frame", tc.accept)
				}
				// The stored frame, on a tie with gzip too, costs no
				// serialization.
				if n := src.serialized.Load(); n != 0 {
					t.Errorf("Accept-Encoding %q: the stored frame serialized the value %d times", tc.accept, n)
				}
				if again := pick(t, stored, eg, src, tc.accept...); again.coding != "zstd" {
					t.Errorf("Accept-Encoding %q: %s the second time", tc.accept, describe(again))
				}
				if n := src.serialized.Load(); n != 0 {
					t.Errorf("Accept-Encoding %q: a second pick serialized the value (%d times in all)", tc.accept, n)
				}
			}
			got := decode(t, b)
			if !bytes.Equal(got, plain) {
				t.Errorf("Accept-Encoding %q: the body does not decode to the value", tc.accept)
			}
		}
	}
}

// TestPickNotPassedThrough: a stored value that is not a zstd frame
// browsers take (here LZ4) gets gzip or identity, even from a client that
// prefers zstd. (A value with no stored form is TestPickMadeOnTheFly.)
func TestPickNotPassedThrough(t *testing.T) {
	plain := document(64 << 10)
	lz4 := append([]byte{0x02}, plain...)
	for _, stored := range [][]byte{lz4} {
		src := &source{plain: plain}
		if b := pick(t, stored, nil, src, "zstd, gzip"); b == nil || b.coding != "gzip" {
			t.Errorf("stored %.1q, zstd and gzip: %+.20v, want gzip", stored, b)
		}
		if b := pick(t, stored, nil, src, "zstd"); b == nil || b.coding != "" {
			t.Errorf("stored %.1q, zstd alone: %+.20v, want identity", stored, b)
		}
		if b := pick(t, stored, nil, src, "zstd, identity;q=0"); b != nil {
			t.Errorf("stored %.1q, zstd alone and identity refused: %+.20v, want none", stored, b)
		}
	}
}

// TestPickGzipMin: below 1 KiB gzip gains too little to be sent; a value
// gzip does not shrink is sent as it is.
func TestPickGzipMin(t *testing.T) {
	for _, tc := range []struct {
		plain []byte
		want  string
	}{
		{document(10), ""},
		{document(1000), ""},
		{document(compressMin - 1), ""},
		{document(compressMin), "gzip"},
		{document(2000), "gzip"},
		{noise(4 << 10), ""},
	} {
		for _, eg := range []*Edge{nil, NewEdge(nil)} {
			b := pick(t, nil, eg, &source{plain: tc.plain}, "gzip")
			if b == nil || b.coding != tc.want {
				t.Errorf("%d bytes: %+.20v, want a body in %q", len(tc.plain), b, tc.want)
			}
		}
	}
}

// TestPickEdge: an Edge's bodies are made once and then shared, each body
// made anew is weighed once through Kept, views are not, and Pick takes
// the stored value from the Edge.
func TestPickEdge(t *testing.T) {
	plain := document(64 << 10)
	stored := storedZstd(t, plain)
	eg := NewEdge(stored)
	src := &source{plain: plain, alloc: 70000}
	first := map[string]*Body{}
	for range 3 {
		for _, ae := range []string{"zstd", "gzip", "identity"} {
			b := pick(t, nil, eg, src, ae) // stored: eg's
			if b == nil {
				t.Fatalf("%s: no body", ae)
			}
			if first[ae] == nil {
				first[ae] = b
			} else if b != first[ae] {
				t.Errorf("%s: another body the second time", ae)
			}
		}
	}
	if first["zstd"].coding != "zstd" || first["gzip"].coding != "gzip" || first["identity"].coding != "" {
		t.Fatalf("codings %q %q %q", first["zstd"].coding, first["gzip"].coding, first["identity"].coding)
	}
	if n := src.serialized.Load(); n != 1 {
		t.Errorf("the value serialized %d times, want once", n)
	}
	// Kept: the serialized value and its gzip; the frame is stored's.
	if n, sum := src.kept.Load(), src.keptBytes.Load(); n != 2 || sum != int64(src.alloc+cap(first["gzip"].b)) {
		t.Errorf("Kept %d times for %d bytes, want 2 for %d", n, sum, src.alloc+cap(first["gzip"].b))
	}
	if src.edge.Load() != eg {
		t.Error("Kept told of another Edge")
	}

	// A serialized value that is a view of memory held is not weighed;
	// a stored value that is not zstd is kept as noBody, and not tried
	// again.
	eg = NewEdge([]byte{0x01, '{', '}'})
	src = &source{plain: document(10)}
	for range 2 {
		if b := pick(t, nil, eg, src, "zstd, identity"); b == nil || b.coding != "" {
			t.Fatalf("%+.20v, want identity", b)
		}
	}
	if eg.kept(codingZstd) != noBody || src.kept.Load() != 0 || src.serialized.Load() != 1 {
		t.Errorf("zstd kept %v, Kept %d times, serialized %d times", eg.kept(codingZstd), src.kept.Load(), src.serialized.Load())
	}

	// Without an Edge nothing is kept and Kept is never called.
	src = &source{plain: plain, alloc: 1}
	for range 2 {
		pick(t, stored, nil, src, "gzip")
	}
	if src.serialized.Load() != 2 || src.kept.Load() != 0 {
		t.Errorf("without an Edge: serialized %d times, Kept %d times; want 2, 0", src.serialized.Load(), src.kept.Load())
	}
}

// TestPickError: the Source's error is Pick's, and nothing is kept for it:
// the next Pick tries again.
func TestPickError(t *testing.T) {
	boom := errors.New("boom")
	plain := document(4 << 10)
	eg := NewEdge(nil)
	src := &source{plain: plain, err: boom}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Accept-Encoding", "gzip")
	if b, err := Pick(r, nil, eg, src); !errors.Is(err, boom) || b != nil {
		t.Fatalf("Pick: %v, %v; want the Source's error", b, err)
	}
	if eg.kept(codingIdentity) != nil || eg.kept(codingGzip) != nil {
		t.Error("a body was kept for a failure")
	}
	src.err = nil
	if b, err := Pick(r, nil, eg, src); err != nil || b == nil || b.coding != "gzip" {
		t.Fatalf("Pick again: %v, %v", b, err)
	}
	if n := src.serialized.Load(); n != 2 {
		t.Errorf("serialized %d times, want 2", n)
	}
}

// TestPickEdgeConcurrent: Picks of every coding racing on one Edge, as a
// near-cache entry's first Serves do: every one gets the body kept, and
// each body kept is weighed once. (Run with -race.)
func TestPickEdgeConcurrent(t *testing.T) {
	plain := document(32 << 10)
	stored := storedZstd(t, plain)
	eg := NewEdge(stored)
	src := &source{plain: plain, alloc: 40000}
	var wg sync.WaitGroup
	got := make([][3]*Body, 12)
	for i := range got {
		wg.Go(func() {
			for j := range 3 {
				k := (i + j) % 3
				ae := [...]string{codingZstd: "zstd", codingGzip: "gzip", codingIdentity: "identity"}[k]
				r := httptest.NewRequest("GET", "/", nil)
				r.Header.Set("Accept-Encoding", ae)
				b, err := Pick(r, nil, eg, src)
				if err != nil || b == nil {
					t.Errorf("%s: %v, %v", ae, b, err)
					return
				}
				got[i][k] = b
			}
		})
	}
	wg.Wait()
	for k := range 3 {
		for i := range got {
			if got[i][k] != eg.kept(k) {
				t.Errorf("coding %d: goroutine %d got a body that is not the one kept", k, i)
			}
		}
	}
	if n, sum := src.kept.Load(), src.keptBytes.Load(); n != 2 || sum != int64(src.alloc+cap(eg.kept(codingGzip).b)) {
		t.Errorf("Kept %d times for %d bytes, want 2 for %d", n, sum, src.alloc+cap(eg.kept(codingGzip).b))
	}
}

// BenchmarkPick: the choice of a body kept in an Edge, as a Serve of a
// near-cache hit makes it, for Chromium's Accept-Encoding.
func BenchmarkPick(b *testing.B) {
	plain := document(128 << 10)
	stored := storedZstd(b, plain)
	eg := NewEdge(stored)
	src := &source{plain: plain}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Accept-Encoding", "gzip, deflate, br, zstd")
	b.ReportAllocs()
	for b.Loop() {
		if body, err := Pick(r, nil, eg, src); err != nil || body.coding != "zstd" {
			b.Fatal(body, err)
		}
	}
}

// TestPickTieStoredFrame: among codings of equal q (every browser's
// Accept-Encoding), a stored frame is sent as it is, even one larger than
// the value gzipped (here one with a 1 KiB window), and nothing is
// serialized or gzipped to compare it with; with or without an Edge. A
// coding of higher q still wins, and a value stored otherwise gets gzip.
func TestPickTieStoredFrame(t *testing.T) {
	plain := farRepeats(64 << 10)
	gz, _, err := gzipBody(plain)
	if err != nil || gz == noBody {
		t.Fatalf("gzip: %v", err)
	}
	// A window of 1 KiB cannot reach repeats 4 KiB apart, which gzip's
	// 32 KiB window finds.
	poor := storedZstd(t, plain, zstd.WithWindowSize(zstd.MinWindowSize))
	if len(poor)-1 <= len(gz.b) {
		t.Fatalf("a frame of %d bytes against gzip's %d: the test needs one larger", len(poor)-1, len(gz.b))
	}
	lz4 := append([]byte{0x02}, plain...)
	for _, tc := range []struct {
		stored     []byte
		accept     string
		want       string
		serialized bool // the value serialized (a gzip or identity body made)
	}{
		{poor, "zstd, gzip", "zstd", false},
		{poor, "gzip, deflate, br, zstd", "zstd", false}, // Chromium's
		{poor, "*", "zstd", false},
		{poor, "zstd;q=0.5, gzip;q=0.5, identity;q=0.5", "zstd", false},
		{poor, "gzip, zstd;q=0.9", "gzip", true}, // a higher q wins
		{lz4, "gzip, deflate, br, zstd", "gzip", true},
	} {
		for _, eg := range []*Edge{nil, NewEdge(tc.stored)} {
			src := &source{plain: plain}
			b := pick(t, tc.stored, eg, src, tc.accept)
			if b == nil || b.coding != tc.want {
				t.Errorf("frame of %d bytes, gzip %d, Accept-Encoding %q, edge %v: %s, want %s", len(tc.stored)-1, len(gz.b), tc.accept, eg != nil, describe(b), tc.want)
				continue
			}
			if n := src.serialized.Load(); (n > 0) != tc.serialized {
				t.Errorf("Accept-Encoding %q, edge %v: the value serialized %d times, want serialized=%v", tc.accept, eg != nil, n, tc.serialized)
			}
			if !bytes.Equal(decode(t, b), plain) {
				t.Errorf("Accept-Encoding %q: the body does not decode to the value", tc.accept)
			}
		}
	}
}

// TestPickMadeOnTheFly: a value with no stored form (just loaded, or read
// while Redis fails) is compressed for the client: zstd when it asks for
// zstd alone, a frame browsers take (no dictionary, window within 8 MiB),
// from the threshold on; below it, or for noise zstd cannot shrink, the
// value as it is. A stored value that is not a zstd frame is still never
// re-encoded as zstd.
func TestPickMadeOnTheFly(t *testing.T) {
	for _, tc := range []struct {
		plain []byte
		want  string
	}{
		{document(90 << 10), "zstd"},
		{bytes.Repeat(document(1<<20), 9), "zstd"}, // over a browser's window
		{document(compressMin), "zstd"},
		{document(compressMin - 1), ""},
		{noise(8 << 10), ""},
	} {
		for _, eg := range []*Edge{nil, NewEdge(nil)} {
			src := &source{plain: tc.plain, alloc: len(tc.plain)}
			b := pick(t, nil, eg, src, "zstd")
			if b == nil || b.coding != tc.want {
				t.Errorf("%d bytes: %s, want a body in %q", len(tc.plain), describe(b), tc.want)
				continue
			}
			if !bytes.Equal(decode(t, b), tc.plain) {
				t.Errorf("%d bytes: the body does not decode to the value", len(tc.plain))
			}
			if b.coding != "zstd" {
				continue
			}
			if len(b.b) >= len(tc.plain) || b.etag != etag(b.b, "zstd") {
				t.Errorf("%d bytes: a zstd body of %d bytes, tag %s", len(tc.plain), len(b.b), b.etag)
			}
			// The browsers' rule, as zstdBody applies it to stored frames.
			if zstdBody(append([]byte{0x04}, b.b...)) == noBody {
				t.Errorf("%d bytes: a frame browsers refuse", len(tc.plain))
			}
			if eg != nil {
				if again := pick(t, nil, eg, src, "zstd"); again != b {
					t.Errorf("%d bytes: the Edge did not keep the zstd body", len(tc.plain))
				}
			}
		}
	}
	plain := document(64 << 10)
	lz4 := append([]byte{0x02}, plain...)
	if b := pick(t, lz4, nil, &source{plain: plain}, "zstd"); b == nil || b.coding != "" {
		t.Errorf("an LZ4 value, zstd alone: %s, want identity", describe(b))
	}
}

// describe names a body for a test's message: its coding and size.
func describe(b *Body) string {
	if b == nil {
		return "no body"
	}
	return fmt.Sprintf("%d bytes in %q", len(b.b), b.coding)
}
