package codec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/golang/snappy"
)

// Snappy compresses with Snappy. Its payload is one Snappy block: the
// uncompressed length as a varint, then the compressed data. It is not the
// framed format that Snappy stream readers expect.
var Snappy Codec = snappyCodec{}

// A Snappy block decodes to at most 64/3 times its size: a copy with a
// 2-byte offset spends 3 bytes on at most 64 bytes of output, and no element
// does better. A length beyond that is rejected before allocating for it.
const (
	maxSnappyRatioNum = 64
	maxSnappyRatioDen = 3
)

type snappyCodec struct{}

func (snappyCodec) ID() byte     { return HeaderSnappy }
func (snappyCodec) Name() string { return "snappy" }

func (snappyCodec) Encode(dst, src []byte) ([]byte, error) {
	bound := snappy.MaxEncodedLen(len(src))
	if bound < 0 {
		// snappy.Encode would panic.
		return dst, fmt.Errorf("codec snappy: input of %d bytes is over the format's 4 GiB", len(src))
	}
	start := len(dst)
	dst = slices.Grow(dst, bound)
	out := snappy.Encode(dst[start:start+bound], src)
	return dst[:start+len(out)], nil
}

func (snappyCodec) Decode(dst, src []byte, limit int) ([]byte, error) {
	n, err := snappy.DecodedLen(src)
	if err != nil {
		if errors.Is(err, snappy.ErrTooLarge) {
			// Only on 32-bit platforms: the length fits the format but
			// not an int.
			v, _ := binary.Uvarint(src)
			return dst, tooLargef("snappy", v, limit)
		}
		return dst, corruptErr("snappy", err)
	}
	if n > clampLimit(limit) {
		return dst, tooLargef("snappy", uint64(n), limit)
	}
	_, k := binary.Uvarint(src)
	if body := uint64(len(src) - k); uint64(n)*maxSnappyRatioDen > body*maxSnappyRatioNum {
		return dst, corruptf("snappy", "block of %d bytes cannot hold %d", body, n)
	}
	if n == 0 {
		// Every element decodes to at least one byte, so only an empty
		// body is valid, and the library need not see a nil buffer.
		if len(src) != k {
			return dst, corruptf("snappy", "block of %d bytes for an empty value", len(src)-k)
		}
		return dst, nil
	}
	start := len(dst)
	dst = slices.Grow(dst, n)
	if _, err := snappy.Decode(dst[start:start+n], src); err != nil {
		return dst[:start], corruptErr("snappy", err)
	}
	return dst[:start+n], nil
}
