package httpenc

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/packcache/packcache/codec"
)

// document returns n bytes of JSON that compress well, as the cached
// documents do.
func document(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"items":[`)
	for i := 0; b.Len() < n-64; i++ {
		fmt.Fprintf(&b, `{"id":%d,"title":"item %d","tags":["a","b"]},`, i, i%97)
	}
	b.WriteString(`{}]}`)
	for b.Len() < n {
		b.WriteByte(' ')
	}
	return []byte(b.String()[:n])
}

// farRepeats returns n bytes of JSON made of one string of 4 KiB of
// base64 noise, repeated: gzip's 32 KiB window finds the repeats, a zstd
// window of 1 KiB does not.
func farRepeats(n int) []byte {
	chunk := `"` + base64.StdEncoding.EncodeToString(noise(3<<10)) + `",`
	var b strings.Builder
	b.WriteString("[")
	for b.Len() < n-len(chunk)-2 {
		b.WriteString(chunk)
	}
	b.WriteString(`""]`)
	return []byte(b.String())
}

// noise returns n bytes gzip cannot shrink.
func noise(n int) []byte {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// storedZstd returns plain as packcache stores it with zstd: header 0x04
// and one frame, made with opts.
func storedZstd(t testing.TB, plain []byte, opts ...zstd.EOption) []byte {
	t.Helper()
	enc, err := zstd.NewWriter(nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	return enc.EncodeAll(plain, []byte{codec.HeaderZstd})
}

// decode returns b's bytes with its content coding undone.
func decode(t testing.TB, b *Body) []byte {
	t.Helper()
	out, err := b.b, error(nil)
	switch b.coding {
	case "zstd":
		var d *zstd.Decoder
		if d, err = zstd.NewReader(nil); err == nil {
			out, err = d.DecodeAll(b.b, nil)
			d.Close()
		}
	case "gzip":
		var r *gzip.Reader
		if r, err = gzip.NewReader(bytes.NewReader(b.b)); err == nil {
			out, err = io.ReadAll(r)
		}
	}
	if err != nil {
		t.Fatalf("%s: %v", b.coding, err)
	}
	return out
}

// TestZstdBody: the stored frame itself, for a zstd value browsers decode,
// and noBody for every other stored value.
func TestZstdBody(t *testing.T) {
	plain := document(64 << 10)
	good := storedZstd(t, plain)
	b := zstdBody(good)
	if b == noBody || b.coding != "zstd" || b.etag != etag(good[1:], "zstd") {
		t.Fatalf("zstd value: body %+.40v", b)
	}
	if &b.b[0] != &good[1] || len(b.b) != len(good)-1 {
		t.Error("the body is not the stored frame itself")
	}
	if !bytes.Equal(decode(t, b), plain) {
		t.Error("the frame does not decode to the value")
	}

	// A frame declaring a 16 MiB window, as a writer that keeps its window
	// would store: the encoder shrinks the window to the value, so the
	// test sets Window_Descriptor (byte 5 of a frame that is not
	// single-segment; exponent 14 is 2^24).
	wide := storedZstd(t, plain, zstd.WithWindowSize(16<<20), zstd.WithSingleSegment(false))
	wide[1+5] = 14 << 3
	var h zstd.Header
	if err := h.Decode(wide[1:]); err != nil || h.SingleSegment || h.WindowSize != 16<<20 {
		t.Fatalf("test frame: %+v, %v", h, err)
	}
	at8 := storedZstd(t, plain, zstd.WithWindowSize(8<<20), zstd.WithSingleSegment(false))
	at8[1+5] = 13 << 3 // 2^23: the largest window browsers take
	if err := h.Decode(at8[1:]); err != nil || h.WindowSize != 8<<20 {
		t.Fatalf("test frame: %+v, %v", h, err)
	}
	if zstdBody(at8) == noBody {
		t.Error("a frame with an 8 MiB window: noBody, want the frame")
	}

	// A single-segment frame's window is its content: 9 MiB is too wide.
	big := storedZstd(t, bytes.Repeat([]byte("x"), 9<<20), zstd.WithSingleSegment(true))
	if err := h.Decode(big[1:]); err != nil || !h.SingleSegment {
		t.Fatalf("test frame: %+v, %v", h, err)
	}

	dict := storedZstd(t, plain, zstd.WithEncoderDictRaw(1234, document(4<<10)))
	if err := h.Decode(dict[1:]); err != nil || h.DictionaryID != 1234 {
		t.Fatalf("test frame: %+v, %v", h, err)
	}

	skippable := []byte{codec.HeaderZstd, 0x50, 0x2a, 0x4d, 0x18}
	skippable = binary.LittleEndian.AppendUint32(skippable, 4)
	skippable = append(skippable, "abcd"...)

	for _, tc := range []struct {
		name   string
		stored []byte
	}{
		{"nothing stored (a value just loaded)", nil},
		{"header alone", []byte{codec.HeaderZstd}},
		{"plain", append([]byte{codec.HeaderNone}, plain...)},
		{"JSON stored verbatim", plain},
		{"LZ4", append([]byte{codec.HeaderLZ4}, good[1:]...)},
		{"zstd with a dictionary (0x05)", append([]byte{codec.HeaderZstdDict}, good[1:]...)},
		{"a 16 MiB window", wide},
		{"a single segment of 9 MiB", big},
		{"a frame naming a dictionary", dict},
		{"a skippable frame", skippable},
		{"not a frame", []byte{codec.HeaderZstd, 1, 2, 3, 4, 5, 6, 7, 8}},
	} {
		if b := zstdBody(tc.stored); b != noBody {
			t.Errorf("%s: a body of %d bytes, want noBody", tc.name, len(b.b))
		}
	}
}

// TestGzipBody: the value gzipped with the bytes allocated, or noBody
// when gzip does not shrink it; the writers pooled serve goroutines at
// once. (Run with -race.)
func TestGzipBody(t *testing.T) {
	if b, n, err := gzipBody(noise(4 << 10)); err != nil || b != noBody || n != 0 {
		t.Errorf("noise: %v, %d bytes, %v; want noBody", b == noBody, n, err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 10 {
				plain := document(2<<10 + 1000*i + j)
				b, n, err := gzipBody(plain)
				if err != nil || b == noBody {
					t.Errorf("%d bytes: %v, noBody %v", len(plain), err, b == noBody)
					return
				}
				if b.coding != "gzip" || b.etag != etag(b.b, "gzip") || n != cap(b.b) || len(b.b) >= len(plain) {
					t.Errorf("%d bytes: coding %q, %d bytes of %d allocated", len(plain), b.coding, len(b.b), n)
				}
				if !bytes.Equal(decode(t, b), plain) {
					t.Errorf("%d bytes: gzip does not give the value back", len(plain))
				}
			}
		})
	}
	wg.Wait()
}

// TestIdentityBody: the serialized value itself, with its tag.
func TestIdentityBody(t *testing.T) {
	plain := document(100)
	b := identityBody(plain)
	if &b.b[0] != &plain[0] || len(b.b) != len(plain) || b.coding != "" || b.etag != etag(plain, "") {
		t.Errorf("body %+v", b)
	}
}
