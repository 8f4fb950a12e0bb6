package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
)

var roundTripSizes = []int{0, 1, 100, 1023, 1024, 1025, 128 << 10, 1 << 20}

// checkRoundTrip encodes src with c, checks the payload decodes back to src
// within a limit of exactly len(src), and that one byte less is refused.
func checkRoundTrip(t *testing.T, c Codec, src []byte) {
	t.Helper()
	prefix := []byte("prefix")
	enc, err := c.Encode(bytes.Clone(prefix), src)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	if !bytes.HasPrefix(enc, prefix) {
		t.Fatalf("Encode did not append to dst")
	}
	payload := enc[len(prefix):]

	dec, err := c.Decode(bytes.Clone(prefix), payload, len(src))
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if !bytes.HasPrefix(dec, prefix) {
		t.Fatalf("Decode did not append to dst")
	}
	equalOrDiff(t, "Decode", dec[len(prefix):], src)

	if len(src) > 0 {
		got, err := c.Decode(prefix, payload, len(src)-1)
		if !errors.Is(err, ErrTooLarge) {
			t.Fatalf("Decode with limit %d: err %v, want ErrTooLarge", len(src)-1, err)
		}
		if !bytes.Equal(got, prefix) {
			t.Fatalf("Decode error returned dst %q, want it unchanged", got)
		}
	}

	v := mustAppendValue(t, c, src)
	if v[0] != c.ID() || !bytes.Equal(v[1:], payload) {
		t.Fatalf("AppendValue is not the header byte then the payload")
	}
	out, err := DecodeValueDict(nil, v, len(src), dictionaryOf(c))
	if err != nil {
		t.Fatalf("DecodeValue: %v", err)
	}
	equalOrDiff(t, "DecodeValue", out, src)
}

func TestRoundTrip(t *testing.T) {
	for _, c := range allCodecs() {
		for _, size := range roundTripSizes {
			if size > 128<<10 && codecLabel(c) != "lz4hc" && c.ID() == HeaderLZ4 && c != LZ4 {
				// The HC levels differ only in search depth, which
				// 128 KiB exercises; 1 MiB each costs seconds under -race.
				continue
			}
			for _, kind := range []string{"json", "random"} {
				t.Run(fmt.Sprintf("%s/%s/%d", codecLabel(c), kind, size), func(t *testing.T) {
					t.Parallel()
					src := chatJSON(size)
					if kind == "random" {
						src = randomBytes(size, uint64(size))
					}
					checkRoundTrip(t, c, src)
				})
			}
		}
	}
}

// TestRoundTripLarge covers 8 MiB, past the zstd encoder's window and past
// LZ4's 64 KiB offsets, and all-zero input, where every codec reaches its
// highest ratio and so the ratio bounds Decode checks before allocating.
func TestRoundTripLarge(t *testing.T) {
	const size = 8 << 20
	json := chatJSON(size)
	zeros := make([]byte, size)
	random := randomBytes(size, 8)
	for _, c := range []Codec{None, LZ4, LZ4HC, Snappy, Zstd, ZstdBest} {
		if c != LZ4HC && c != ZstdBest {
			// The slow levels take 10-20 s at this size under -race,
			// and differ from the fast ones only in what they search.
			t.Run(codecLabel(c)+"/json", func(t *testing.T) {
				t.Parallel()
				checkRoundTrip(t, c, json)
			})
		}
		t.Run(codecLabel(c)+"/zeros", func(t *testing.T) {
			t.Parallel()
			checkRoundTrip(t, c, zeros)
		})
	}
	for _, c := range []Codec{LZ4, Snappy, Zstd} {
		t.Run(codecLabel(c)+"/random", func(t *testing.T) {
			t.Parallel()
			checkRoundTrip(t, c, random)
		})
	}
}

// TestRoundTripConcurrent shares every codec between goroutines; with -race
// it checks the pooled compressors and shared encoders and decoders.
func TestRoundTripConcurrent(t *testing.T) {
	srcs := [][]byte{chatJSON(100), chatJSON(5000), chatJSON(70000), randomBytes(3000, 3)}
	var wg sync.WaitGroup
	for _, c := range allCodecs() {
		for g := range 4 {
			wg.Go(func() {
				for i := range 8 {
					src := srcs[(g+i)%len(srcs)]
					v, err := AppendValue(nil, c, src)
					if err != nil {
						t.Errorf("%s: %v", codecLabel(c), err)
						return
					}
					out, err := DecodeValue(nil, v, len(src))
					if err != nil || !bytes.Equal(out, src) {
						t.Errorf("%s: round trip failed: %v", codecLabel(c), err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
}

func TestCodecIdentity(t *testing.T) {
	tests := []struct {
		c    Codec
		id   byte
		name string
	}{
		{None, 0x01, "none"},
		{LZ4, 0x02, "lz4"},
		{LZ4HC, 0x02, "lz4"},
		{Snappy, 0x03, "snappy"},
		{Zstd, 0x04, "zstd"},
		{ZstdDefault, 0x04, "zstd"},
		{ZstdBetter, 0x04, "zstd"},
		{ZstdBest, 0x04, "zstd"},
	}
	for _, tt := range tests {
		if tt.c.ID() != tt.id || tt.c.Name() != tt.name {
			t.Errorf("%s: ID %#x Name %q, want %#x %q", codecLabel(tt.c), tt.c.ID(), tt.c.Name(), tt.id, tt.name)
		}
	}
	distinct := map[Codec]bool{}
	for _, c := range allCodecs() {
		distinct[c] = true
	}
	if len(distinct) != len(allCodecs()) {
		t.Errorf("allCodecs has %d distinct codecs, want %d", len(distinct), len(allCodecs()))
	}
}

func TestLevels(t *testing.T) {
	zstdTests := []struct {
		level int
		want  Codec
	}{
		{-5, Zstd}, {0, Zstd}, {1, Zstd}, {2, Zstd},
		{3, ZstdDefault}, {5, ZstdDefault},
		{6, ZstdBetter}, {9, ZstdBetter},
		{10, ZstdBest}, {19, ZstdBest}, {22, ZstdBest}, {1000, ZstdBest},
	}
	for _, tt := range zstdTests {
		if got := ZstdLevel(tt.level); got != tt.want {
			t.Errorf("ZstdLevel(%d) = %s, want %s", tt.level, codecLabel(got), codecLabel(tt.want))
		}
	}
	if LZ4Level(0) != LZ4 || LZ4Level(-1) != LZ4 || LZ4Level(9) != LZ4HC || LZ4Level(100) != LZ4HC {
		t.Errorf("LZ4Level does not clamp to LZ4 and LZ4HC")
	}
	want := []lz4.CompressionLevel{lz4.Fast, lz4.Level1, lz4.Level2, lz4.Level3, lz4.Level4, lz4.Level5, lz4.Level6, lz4.Level7, lz4.Level8, lz4.Level9}
	for l, w := range want {
		if got := LZ4Level(l).(*lz4Codec).level; got != w {
			t.Errorf("LZ4Level(%d) compresses at %v, want %v", l, got, w)
		}
		if LZ4Level(l) != LZ4Level(l) {
			t.Errorf("LZ4Level(%d) is not one shared value", l)
		}
	}
	// Higher levels must actually compress harder, or the levels are not
	// wired to the compressors.
	src := chatJSON(256 << 10)
	size := func(c Codec) int {
		p, err := c.Encode(nil, src)
		if err != nil {
			t.Fatal(err)
		}
		return len(p)
	}
	if a, b := size(LZ4), size(LZ4HC); b >= a {
		t.Errorf("LZ4HC %d bytes, not smaller than LZ4 %d", b, a)
	}
	if a, b := size(Zstd), size(ZstdBest); b >= a {
		t.Errorf("ZstdBest %d bytes, not smaller than Zstd %d", b, a)
	}
}

// TestZstdRecordsContentSize checks the promise that every frame we write
// records its size, including below 256 bytes, where the encoder leaves it
// out unless the frame is rewritten as single-segment.
func TestZstdRecordsContentSize(t *testing.T) {
	dec, err := zstd.NewReader(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	for _, c := range []Codec{Zstd, ZstdDefault, ZstdBetter, ZstdBest} {
		sizes := []int{0, 1, 2, 100, 255, 256, 257, 1023, 1024, 1025, 5000}
		if c == Zstd {
			sizes = append(sizes, 9<<20) // past the window: not single-segment
		}
		for _, n := range sizes {
			src := chatJSON(n)
			p, err := c.Encode(nil, src)
			if err != nil {
				t.Fatal(err)
			}
			var h zstd.Header
			if err := h.Decode(p); err != nil {
				t.Fatal(err)
			}
			if !h.HasFCS || h.FrameContentSize != uint64(n) {
				t.Errorf("%s, %d bytes: HasFCS %v, FrameContentSize %d", codecLabel(c), n, h.HasFCS, h.FrameContentSize)
			}
			if !h.HasCheckSum && n > 0 {
				t.Errorf("%s, %d bytes: no content checksum", codecLabel(c), n)
			}
			// A stock decoder reads it, so the rewrite keeps the frame valid.
			out, err := dec.DecodeAll(p, nil)
			if err != nil || !bytes.Equal(out, src) {
				t.Errorf("%s, %d bytes: stock decoder: %v", codecLabel(c), n, err)
			}
		}
	}
}

// TestLZ4Literals checks the fallback block Encode writes should the
// compressor ever fail, with a stock decoder, at the lengths where the
// literal length encoding changes.
func TestLZ4Literals(t *testing.T) {
	for _, n := range []int{0, 1, 14, 15, 16, 269, 270, 271, 524, 525, 70000} {
		src := randomBytes(n, uint64(n))
		block := appendLZ4Literals(nil, src)
		if len(block) > lz4.CompressBlockBound(n) {
			t.Errorf("%d: literal block of %d bytes over the bound", n, len(block))
		}
		out := make([]byte, n)
		k, err := lz4.UncompressBlock(block, out)
		if err != nil || k != n || !bytes.Equal(out, src) {
			t.Errorf("%d: stock decoder: %d bytes, %v", n, k, err)
		}
		payload := binary.LittleEndian.AppendUint32(nil, uint32(n))
		got, err := LZ4.Decode(nil, append(payload, block...), n)
		if err != nil || !bytes.Equal(got, src) {
			t.Errorf("%d: Decode: %v", n, err)
		}
	}
}

func TestEmptyPayloads(t *testing.T) {
	// What other writers produce for empty input must decode too.
	tests := []struct {
		name    string
		c       Codec
		payload []byte
	}{
		{"none", None, nil},
		{"lz4 with a token", LZ4, []byte{0, 0, 0, 0, 0}},
		{"lz4 without a block", LZ4, []byte{0, 0, 0, 0}},
		{"snappy", Snappy, []byte{0}},
		{"zstd single segment", Zstd, []byte{0x28, 0xb5, 0x2f, 0xfd, 0x20, 0x00, 0x01, 0x00, 0x00}},
	}
	for _, tt := range tests {
		out, err := tt.c.Decode(nil, tt.payload, 0)
		if err != nil || len(out) != 0 {
			t.Errorf("%s: %q, %v", tt.name, out, err)
		}
	}
}
