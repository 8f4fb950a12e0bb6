package httpenc

import (
	"bytes"
	"errors"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
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
				if n := src.serialized.Load(); n != 0 {
					t.Errorf("Accept-Encoding %q: the stored frame serialized the value %d times", tc.accept, n)
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
// browsers take (here: none, a value just loaded; and LZ4) gets gzip or
// identity, even from a client that prefers zstd.
func TestPickNotPassedThrough(t *testing.T) {
	plain := document(64 << 10)
	lz4 := append([]byte{0x02}, plain...)
	for _, stored := range [][]byte{nil, lz4} {
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
		{document(gzipMin - 1), ""},
		{document(gzipMin), "gzip"},
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
