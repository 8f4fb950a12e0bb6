package codec

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"

	"github.com/pierrec/lz4/v4"
)

// LZ4 compresses with LZ4's fast block compressor. Its payload is the
// uncompressed size as 4 bytes little-endian followed by one LZ4 block, the
// layout LZ4 bindings call size-prepended.
var LZ4 Codec = lz4Codecs[0]

// LZ4HC compresses with LZ4's high-compression block compressor at its
// highest level, 9: slower to write than LZ4, as fast to read, and smaller.
var LZ4HC Codec = lz4Codecs[9]

// LZ4Level returns the LZ4 codec for level: 0 is the fast compressor, 1 to 9
// are the high-compression levels. Levels outside 0 to 9 are clamped. Every
// level writes the same format, so any of them reads what the others wrote.
func LZ4Level(level int) Codec {
	return lz4Codecs[min(max(level, 0), 9)]
}

var lz4Codecs = [10]*lz4Codec{
	{lz4.Fast}, {lz4.Level1}, {lz4.Level2}, {lz4.Level3}, {lz4.Level4},
	{lz4.Level5}, {lz4.Level6}, {lz4.Level7}, {lz4.Level8}, {lz4.Level9},
}

// maxLZ4Input is LZ4_MAX_INPUT_SIZE of the reference implementation. The
// size field could say more, but no other LZ4 library would read it.
const maxLZ4Input = 0x7E000000

// maxLZ4Ratio bounds how much one byte of LZ4 block can decode to: a match
// length extension byte adds at most 255 bytes of output and every other
// byte of a sequence adds less. A size beyond that is a lie we can reject
// before allocating for it.
const maxLZ4Ratio = 255

// The compressors keep large hash tables and are not safe for concurrent
// use, so they are pooled rather than made per call. One pool serves every
// HC level because the level is a field set before each use.
var (
	lz4Fast sync.Pool // *lz4.Compressor
	lz4HC   sync.Pool // *lz4.CompressorHC
)

type lz4Codec struct {
	level lz4.CompressionLevel
}

func (*lz4Codec) ID() byte     { return HeaderLZ4 }
func (*lz4Codec) Name() string { return "lz4" }

func (c *lz4Codec) Encode(dst, src []byte) ([]byte, error) {
	if len(src) > maxLZ4Input {
		return dst, fmt.Errorf("codec lz4: input of %d bytes is over the format's %d", len(src), maxLZ4Input)
	}
	bound := lz4.CompressBlockBound(len(src))
	start := len(dst)
	dst = slices.Grow(dst, 4+bound)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(src)))
	out := dst[len(dst) : len(dst)+bound]

	var n int
	var err error
	if c.level == lz4.Fast {
		comp, _ := lz4Fast.Get().(*lz4.Compressor)
		if comp == nil {
			comp = new(lz4.Compressor)
		}
		n, err = comp.CompressBlock(src, out)
		lz4Fast.Put(comp)
	} else {
		comp, _ := lz4HC.Get().(*lz4.CompressorHC)
		if comp == nil {
			comp = new(lz4.CompressorHC)
		}
		comp.Level = c.level
		n, err = comp.CompressBlock(src, out)
		lz4HC.Put(comp)
	}
	if err != nil || n <= 0 || n > bound {
		// The library promises not to fail with a buffer of
		// CompressBlockBound, but a block of literals is always valid, so
		// a broken promise costs size, never a value nobody can read.
		return appendLZ4Literals(dst, src), nil
	}
	return dst[:start+4+n], nil
}

// appendLZ4Literals appends src as one LZ4 sequence of literals and no
// match, which is how the block format ends and so a complete block.
func appendLZ4Literals(dst, src []byte) []byte {
	n := len(src)
	if n < 15 {
		dst = append(dst, byte(n<<4))
	} else {
		dst = append(dst, 0xF0)
		for n -= 15; n >= 255; n -= 255 {
			dst = append(dst, 255)
		}
		dst = append(dst, byte(n))
	}
	return append(dst, src...)
}

func (c *lz4Codec) Decode(dst, src []byte, limit int) ([]byte, error) {
	if len(src) < 4 {
		return dst, corruptf("lz4", "payload of %d bytes is shorter than its size field", len(src))
	}
	size := uint64(binary.LittleEndian.Uint32(src))
	block := src[4:]
	if size > uint64(clampLimit(limit)) {
		return dst, tooLargef("lz4", size, limit)
	}
	if size > maxLZ4Ratio*uint64(len(block)) {
		return dst, corruptf("lz4", "block of %d bytes cannot hold %d", len(block), size)
	}
	if size == 0 {
		// The library's assembly decoder writes through a nil buffer
		// (pierrec/lz4 v4.1.33 faults on UncompressBlock(block, nil) for
		// a non-empty block), and an empty result allows exactly two
		// blocks anyway: none at all, or the lone empty-literals token
		// the reference compressor writes for empty input.
		if len(block) == 0 || len(block) == 1 && block[0] == 0 {
			return dst, nil
		}
		return dst, corruptf("lz4", "block of %d bytes for an empty value", len(block))
	}
	start := len(dst)
	dst = slices.Grow(dst, int(size))
	out := dst[start : start+int(size)]
	n, err := lz4.UncompressBlock(block, out)
	if err != nil {
		return dst[:start], corruptErr("lz4", err)
	}
	if uint64(n) != size {
		return dst[:start], corruptf("lz4", "block decoded to %d bytes, size field says %d", n, size)
	}
	return dst[:start+n], nil
}
