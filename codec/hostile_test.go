package codec

import (
	"bytes"
	stdgzip "compress/gzip"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// zstdRLEFrame returns a Zstandard frame of RLE blocks that decodes to size
// zero bytes: the densest bomb the format allows, 4 bytes per 128 KiB. It
// records fcs as the content size unless fcs is negative, and declares the
// window with Window_Descriptor wd.
func zstdRLEFrame(size, fcs int64, wd byte) []byte {
	b := []byte{0x28, 0xb5, 0x2f, 0xfd}
	if fcs >= 0 {
		b = append(b, 0xc0, wd) // 8-byte Frame_Content_Size, not single-segment
		b = binary.LittleEndian.AppendUint64(b, uint64(fcs))
	} else {
		b = append(b, 0x00, wd)
	}
	if size == 0 {
		return append(b, 0x01, 0x00, 0x00) // last, raw, empty
	}
	for size > 0 {
		n := min(size, maxZstdBlock)
		size -= n
		bh := uint32(n)<<3 | 1<<1 // RLE_Block
		if size == 0 {
			bh |= 1
		}
		b = append(b, byte(bh), byte(bh>>8), byte(bh>>16), 0x00)
	}
	return b
}

func TestIsHeader(t *testing.T) {
	for b := range 256 {
		want := b <= 0x08 || b == 0x0b || b == 0x0c || (b >= 0x0e && b <= 0x1f) || b == 0x7f
		if IsHeader(byte(b)) != want {
			t.Errorf("IsHeader(0x%02x) = %v", b, !want)
		}
	}
	// Every byte JSON text can start with, as RFC 8259 and a BOM allow.
	for _, b := range []byte("\t\n\r {[\"-0123456789tfn\xef") {
		if IsHeader(b) {
			t.Errorf("IsHeader(%q) = true for a byte JSON can start with", b)
		}
	}
	if Plain(nil) || Plain([]byte{0x04}) || !Plain([]byte("{}")) || !Plain([]byte(" 1")) {
		t.Errorf("Plain is wrong")
	}
}

// TestEveryHeaderByte puts garbage behind every possible first byte:
// DecodeValue must treat non-header bytes as plain, reject unknown header
// bytes with a *HeaderError, and otherwise fail with a documented error.
func TestEveryHeaderByte(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	tails := [][]byte{nil, {0}, {0xff, 0xff, 0xff, 0xff, 0xff}, {0x8b}, bytes.Repeat([]byte{0}, 64)}
	for range 20 {
		tails = append(tails, randomBytes(r.IntN(200), r.Uint64()))
	}
	for b := range 256 {
		for _, tail := range tails {
			value := append([]byte{byte(b)}, tail...)
			out, err := DecodeValue(nil, value, 1<<20)
			_, registered := Lookup(byte(b))
			switch {
			case !IsHeader(byte(b)):
				if err != nil || !bytes.Equal(out, value) {
					t.Fatalf("0x%02x: plain value gave %v", b, err)
				}
			case b == 0x1f && (len(tail) == 0 || tail[0] != 0x8b), b != 0x1f && !registered:
				var he *HeaderError
				if !errors.As(err, &he) || he.Byte != byte(b) || !errors.Is(err, ErrUnknownHeader) {
					t.Fatalf("0x%02x % x: err %v, want a *HeaderError", b, tail, err)
				}
			case err != nil && !isSentinel(err):
				t.Fatalf("0x%02x: undocumented error %v", b, err)
			}
		}
	}
	if err := (&HeaderError{Byte: 0x7f}).Error(); err != "unknown header byte 0x7f" {
		t.Errorf("HeaderError message %q", err)
	}
}

// TestTruncated cuts a value of every format at every length: whatever is
// left must be refused (None has no integrity check and yields a prefix).
func TestTruncated(t *testing.T) {
	doc := chatDoc(6)
	var gz bytes.Buffer
	zw := stdgzip.NewWriter(&gz)
	zw.Write(doc)
	zw.Close()
	values := map[string][]byte{"gzip": gz.Bytes()}
	for _, c := range []Codec{None, LZ4, LZ4HC, Snappy, Zstd, ZstdBest} {
		values[codecLabel(c)] = mustAppendValue(t, c, doc)
	}
	for name, v := range values {
		for cut := 1; cut < len(v); cut++ {
			out, err := DecodeValue(nil, v[:cut], 1<<20)
			if name == "none" {
				if err != nil || !bytes.Equal(out, doc[:cut-1]) {
					t.Fatalf("none cut to %d: %v", cut, err)
				}
				continue
			}
			if err == nil {
				t.Fatalf("%s cut to %d of %d bytes decoded to %d bytes", name, cut, len(v), len(out))
			}
			if !isSentinel(err) {
				t.Fatalf("%s cut to %d: undocumented error %v", name, cut, err)
			}
		}
	}
}

// TestFlipped damages each byte of compressed values: decoding must not
// panic, and with zstd's checksum must never return wrong bytes.
func TestFlipped(t *testing.T) {
	doc := chatDoc(4)
	for _, c := range []Codec{LZ4, Snappy, Zstd} {
		v := mustAppendValue(t, c, doc)
		for i := 1; i < len(v); i++ {
			for _, x := range []byte{0x01, 0x80, 0xff} {
				bad := bytes.Clone(v)
				bad[i] ^= x
				out, err := DecodeValue(nil, bad, 1<<20)
				if err != nil && !isSentinel(err) {
					t.Fatalf("%s byte %d: undocumented error %v", c.Name(), i, err)
				}
				if err == nil && c == Zstd && !bytes.Equal(out, doc) {
					t.Fatalf("zstd byte %d ^ %#x: checksummed frame decoded to wrong bytes", i, x)
				}
			}
		}
	}
}

// The allocation bounds below are what the decoders are designed to. A
// size refused up front costs no allocation for it. A stream that has to be
// read to find it is over the limit costs its output, grown geometrically
// to the limit (under 2x limit in all), plus for zstd a window of limit +
// 128 KiB and 256 KiB of block space, plus the decoder's own state when the
// pool has none to reuse (under 1 MiB). Measured with a 1 MiB limit and a
// cold pool: about 4.1 MiB for a zstd bomb, 3 MiB for a gzip bomb.
const (
	limit1M   = 1 << 20
	smallLoss = 64 << 10             // refused before allocating for the claim
	bombBound = 3*limit1M + 1536<<10 // refused after reading limit bytes
)

func checkRefused(t *testing.T, name string, value []byte, limit int, want error, bound uint64) {
	t.Helper()
	checkRefusedWith(t, name, func() error { _, err := DecodeValue(nil, value, limit); return err }, want, bound)
}

// checkRefusedWith checks that decode fails with want, allocating at most
// bound bytes.
func checkRefusedWith(t *testing.T, name string, decode func() error, want error, bound uint64) {
	t.Helper()
	DecodeValue(nil, mustAppendValue(t, Zstd, chatJSON(3000)), 1<<20) // warm the decoders
	var err error
	got := allocated(func() { err = decode() })
	if !errors.Is(err, want) {
		t.Errorf("%s: err %v, want %v", name, err, want)
	}
	if got > bound {
		t.Errorf("%s: allocated %d bytes, bound %d", name, got, bound)
	}
	t.Logf("%s: %v; allocated %d bytes", name, err, got)
}

func TestHostileSizes(t *testing.T) {
	lz4Claim := []byte{HeaderLZ4, 0xff, 0xff, 0xff, 0xff, 0xf0, 0x00}
	snappyClaim := []byte{HeaderSnappy, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x00, 0x00}
	snappyOver := []byte{HeaderSnappy, 0x80, 0x80, 0x80, 0x80, 0x10, 0x00} // 1<<32: not a Snappy length
	zstdTB := append([]byte{HeaderZstd}, zstdRLEFrame(1000, 1<<40, 0x68)...)

	checkRefused(t, "lz4 claims 4 GiB", lz4Claim, limit1M, ErrTooLarge, smallLoss)
	checkRefused(t, "lz4 claims 4 GiB, no limit", lz4Claim, math.MaxInt, ErrCorrupt, smallLoss)
	checkRefused(t, "snappy claims 4 GiB", snappyClaim, limit1M, ErrTooLarge, smallLoss)
	checkRefused(t, "snappy claims 4 GiB, no limit", snappyClaim, math.MaxInt, ErrCorrupt, smallLoss)
	checkRefused(t, "snappy claims 4 GiB+", snappyOver, math.MaxInt, ErrCorrupt, smallLoss)
	checkRefused(t, "zstd claims 1 TB", zstdTB, limit1M, ErrTooLarge, smallLoss)
	checkRefused(t, "zstd claims 1 TB, no limit", zstdTB, math.MaxInt, ErrCorrupt, smallLoss)
	checkRefused(t, "none over limit", append([]byte{HeaderNone}, make([]byte, 2000)...), 1000, ErrTooLarge, smallLoss)
	checkRefused(t, "plain over limit", bytes.Repeat([]byte("1"), 2000), 1000, ErrTooLarge, smallLoss)
}

func TestZstdBombs(t *testing.T) {
	const bomb = 256 << 20
	noFCS := append([]byte{HeaderZstd}, zstdRLEFrame(bomb, -1, 0x68)...)
	withFCS := append([]byte{HeaderZstd}, zstdRLEFrame(bomb, bomb, 0x68)...)
	lyingFCS := append([]byte{HeaderZstd}, zstdRLEFrame(bomb, 512<<10, 0x68)...)
	// The largest window the reference decoder accepts, 2 GiB: decoding
	// must not allocate it.
	hugeWindow := append([]byte{HeaderZstd}, zstdRLEFrame(bomb, -1, 0xa8)...)
	t.Logf("RLE bomb: %d bytes decode to %d", len(noFCS), bomb)

	checkRefused(t, "zstd bomb without size", noFCS, limit1M, ErrTooLarge, bombBound)
	checkRefused(t, "zstd bomb without size, window 2 GiB", hugeWindow, limit1M, ErrTooLarge, bombBound)
	checkRefused(t, "zstd bomb with size", withFCS, limit1M, ErrTooLarge, smallLoss)
	// Holding more than it says, it overruns its buffer by a block at most.
	checkRefused(t, "zstd bomb with a size that lies", lyingFCS, limit1M, ErrCorrupt, 2*512<<10+512<<10)

	// A bomb from a real streaming encoder, which writes no content size.
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	zeros := make([]byte, 1<<20)
	for range 64 {
		zw.Write(zeros)
	}
	zw.Close()
	var h zstd.Header
	if err := h.Decode(buf.Bytes()); err != nil || h.HasFCS {
		t.Fatalf("streaming encoder wrote content size %v, %v", h.HasFCS, err)
	}
	real := append([]byte{HeaderZstd}, buf.Bytes()...)
	t.Logf("encoder bomb: %d bytes decode to %d", len(real), 64<<20)
	checkRefused(t, "zstd encoder bomb", real, limit1M, ErrTooLarge, bombBound)
	if out, err := DecodeValue(nil, real, 64<<20); err != nil || len(out) != 64<<20 {
		t.Errorf("encoder bomb within its size: %d bytes, %v", len(out), err)
	}
}

// TestZstdWindow checks that a frame without a content size costs memory
// for what it holds, not for the window it declares, and that windows over
// the reference decoder's 2 GiB are refused as it refuses them.
func TestZstdWindow(t *testing.T) {
	// 128 KiB, 1 MiB, 2 GiB: a window holds at least one full block.
	for _, wd := range []byte{0x38, 0x50, 0xa8} {
		for _, size := range []int64{0, 1000, 300 << 10} {
			for _, fcs := range []int64{-1, size} {
				value := append([]byte{HeaderZstd}, zstdRLEFrame(size, fcs, wd)...)
				var out []byte
				var err error
				got := allocated(func() { out, err = DecodeValue(nil, value, limit1M) })
				if err != nil || len(out) != int(size) {
					t.Errorf("window %d, %d bytes, size field %d: got %d bytes, %v", zstdWindowSize(wd), size, fcs, len(out), err)
				}
				if bound := uint64(3*size) + 2<<20; got > bound {
					t.Errorf("window %d, %d bytes, size field %d: allocated %d, bound %d", zstdWindowSize(wd), size, fcs, got, bound)
				}
			}
		}
	}
	for _, fcs := range []int64{-1, 1000} {
		value := append([]byte{HeaderZstd}, zstdRLEFrame(1000, fcs, 0xb0)...) // 4 GiB
		if _, err := DecodeValue(nil, value, limit1M); !errors.Is(err, ErrCorrupt) {
			t.Errorf("window 4 GiB, content size %d: %v, want ErrCorrupt", fcs, err)
		}
	}
	for wd := range 256 {
		if got := zstdWindowDescriptor(zstdWindowSize(byte(wd))); got != byte(wd) {
			t.Errorf("zstdWindowDescriptor(%d) = %#x, want %#x", zstdWindowSize(byte(wd)), got, wd)
		}
		if w := zstdWindowSize(byte(wd)); wd < 255 && zstdWindowSize(zstdWindowDescriptor(w+1)) < w+1 {
			t.Errorf("zstdWindowDescriptor(%d) is too small", w+1)
		}
	}
}

func TestZstdFrameRules(t *testing.T) {
	one := mustAppendValue(t, Zstd, []byte(`{"a":1}`))
	tests := []struct {
		name  string
		value []byte
	}{
		{"two frames", append(bytes.Clone(one), one[1:]...)},
		{"trailing byte", append(bytes.Clone(one), 0)},
		{"skippable frame", []byte{HeaderZstd, 0x50, 0x2a, 0x4d, 0x18, 0, 0, 0, 0}},
		{"dictionary", []byte{HeaderZstd, 0x28, 0xb5, 0x2f, 0xfd, 0x21, 0x07, 0x00, 0x01, 0x00, 0x00}},
		{"reserved block type", []byte{HeaderZstd, 0x28, 0xb5, 0x2f, 0xfd, 0x20, 0x00, 0x07, 0x00, 0x00}},
		{"bad magic", []byte{HeaderZstd, 0x28, 0xb5, 0x2f, 0xfe, 0x20, 0x00, 0x01, 0x00, 0x00}},
	}
	for _, tt := range tests {
		if _, err := DecodeValue(nil, tt.value, limit1M); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", tt.name, err)
		}
	}
}

func TestGzipBomb(t *testing.T) {
	// 16 members of 4 MiB of zeros each: one member of 64 MiB takes
	// seconds to compress under -race, and the limit applies across
	// members just the same.
	var member bytes.Buffer
	zw, _ := stdgzip.NewWriterLevel(&member, stdgzip.BestCompression)
	zw.Write(make([]byte, 4<<20))
	zw.Close()
	bomb := bytes.Repeat(member.Bytes(), 16)
	t.Logf("gzip bomb: %d bytes decode to %d", len(bomb), 64<<20)
	checkRefused(t, "gzip bomb", bomb, limit1M, ErrTooLarge, bombBound)
	checkRefused(t, "gzip bomb, one member", member.Bytes(), limit1M, ErrTooLarge, bombBound)

	// Concatenated members decode as one stream, as gunzip reads them.
	var two bytes.Buffer
	for _, s := range []string{`{"a":`, `1}`} {
		zw := stdgzip.NewWriter(&two)
		zw.Write([]byte(s))
		zw.Close()
	}
	if out, err := DecodeValue(nil, two.Bytes(), 100); err != nil || string(out) != `{"a":1}` {
		t.Errorf("two members: %q, %v", out, err)
	}
	if _, err := DecodeValue(nil, append(two.Bytes(), 0), 100); !errors.Is(err, ErrCorrupt) {
		t.Errorf("trailing byte: %v, want ErrCorrupt", err)
	}
}

// TestEmptyWithGarbage declares an empty result and follows it with bytes,
// decoding into nil: the buffer the libraries get then has no address,
// which made the LZ4 assembly decoder fault before Decode checked for it.
func TestEmptyWithGarbage(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	heads := [][]byte{
		{HeaderLZ4, 0, 0, 0, 0},
		{HeaderSnappy, 0},
		{HeaderZstd, 0x28, 0xb5, 0x2f, 0xfd, 0x20, 0x00},
		{HeaderZstd, 0x28, 0xb5, 0x2f, 0xfd, 0x24, 0x00},
	}
	for _, head := range heads {
		for i := range 2000 {
			tail := randomBytes(1+r.IntN(100), uint64(i))
			if i%2 == 0 {
				tail = bytes.Repeat([]byte{byte(i / 2)}, 1+r.IntN(100))
			}
			out, err := DecodeValue(nil, append(bytes.Clone(head), tail...), 1<<20)
			if err != nil && !isSentinel(err) {
				t.Fatalf("% x % x: undocumented error %v", head, tail, err)
			}
			if err == nil && len(out) != 0 {
				t.Fatalf("% x % x: an empty value decoded to %d bytes", head, tail, len(out))
			}
		}
	}
}

// TestTrailingBytes checks every format is exact: a payload with anything
// after its block, frame or last member is corrupt, not silently cut.
func TestTrailingBytes(t *testing.T) {
	doc := []byte(`{"user":"alice","text":"hello hello hello hello"}`)
	var gz bytes.Buffer
	zw := stdgzip.NewWriter(&gz)
	zw.Write(doc)
	zw.Close()
	values := map[string][]byte{"gzip": gz.Bytes()}
	for _, c := range []Codec{LZ4, Snappy, Zstd} {
		values[c.Name()] = mustAppendValue(t, c, doc)
	}
	for name, v := range values {
		for _, extra := range [][]byte{{0}, {0x10, 'x'}, {0xff}} {
			if _, err := DecodeValue(nil, append(bytes.Clone(v), extra...), 1000); !errors.Is(err, ErrCorrupt) {
				t.Errorf("%s + % x: %v, want ErrCorrupt", name, extra, err)
			}
		}
	}
}

// TestNoLimit decodes every format with the largest limit there is, where
// arithmetic on the limit could overflow.
func TestNoLimit(t *testing.T) {
	doc := chatDoc(3)
	var gz bytes.Buffer
	zw := stdgzip.NewWriter(&gz)
	zw.Write(doc)
	zw.Close()
	var zs bytes.Buffer
	enc, _ := zstd.NewWriter(&zs)
	enc.Write(doc)
	enc.Close()
	values := map[string][]byte{
		"gzip":             gz.Bytes(),
		"zstd stream":      append([]byte{HeaderZstd}, zs.Bytes()...),
		"plain":            doc,
		"zstd RLE no size": append([]byte{HeaderZstd}, zstdRLEFrame(int64(len(doc)), -1, 0x68)...),
	}
	for _, c := range allCodecs() {
		values[codecLabel(c)] = mustAppendValue(t, c, doc)
	}
	for name, v := range values {
		out, err := DecodeValue([]byte("x"), v, math.MaxInt)
		if err != nil || (name != "zstd RLE no size" && !bytes.HasSuffix(out, doc)) || len(out) < len(doc) {
			t.Errorf("%s: %d bytes, %v", name, len(out), err)
		}
	}
}
