package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// TestZstdDecodeSlack checks how a frame with a recorded size uses dst: in
// place whenever it has room for the value, writing at most zstdOverAlloc
// bytes of scratch past it, and, when it has to grow, with that slack, so
// that the grown buffer decodes the next value at full speed.
func TestZstdDecodeSlack(t *testing.T) {
	const sentinel = 0xAA
	for _, doc := range [][]byte{chatJSON(128 << 10), chatJSON(235 << 10), chatDoc(3), {}} {
		value := mustAppendValue(t, Zstd, doc)
		n := len(doc)
		for _, prefix := range []int{0, 5} {
			for _, extra := range []int{0, 1, zstdOverAlloc - 1, zstdOverAlloc, zstdOverAlloc + 1, 1000} {
				name := fmt.Sprintf("%d bytes after %d, %d spare", n, prefix, extra)
				buf := bytes.Repeat([]byte{sentinel}, prefix+n+extra)
				copy(buf, "hello")
				out, err := DecodeValue(buf[:prefix], value, n)
				if err != nil || !bytes.Equal(out[:prefix], buf[:prefix]) || !bytes.Equal(out[prefix:], doc) {
					t.Fatalf("%s: %v", name, err)
				}
				if cap(out) != cap(buf) || (len(out) > 0 && &out[0] != &buf[0]) {
					t.Errorf("%s: decoded into a new buffer, not dst's room", name)
				}
				for i := prefix + n + zstdOverAlloc; i < len(buf); i++ {
					if buf[i] != sentinel {
						t.Fatalf("%s: wrote byte %d, past the value and its %d bytes of slack", name, i-prefix-n, zstdOverAlloc)
					}
				}
			}
			// Too little room: the grown buffer keeps the prefix and has
			// the slack.
			small := append(make([]byte, 0, prefix+n/2), "hello"[:prefix]...)
			out, err := DecodeValue(small, value, n)
			if err != nil || string(out[:prefix]) != "hello"[:prefix] || !bytes.Equal(out[prefix:], doc) {
				t.Fatalf("%d bytes after %d, grown: %v", n, prefix, err)
			}
			if n > 0 && cap(out) < prefix+n+zstdOverAlloc {
				t.Errorf("%d bytes after %d: grown to capacity %d, want %d at least", n, prefix, cap(out), prefix+n+zstdOverAlloc)
			}
		}
	}
}

// zstdRawFrame returns a Zstandard frame of raw blocks holding size zero
// bytes and recording fcs as its content size.
func zstdRawFrame(size, fcs int64) []byte {
	b := []byte{0x28, 0xb5, 0x2f, 0xfd, 0xc0, 0x68}
	b = binary.LittleEndian.AppendUint64(b, uint64(fcs))
	for size > 0 {
		n := min(size, maxZstdBlock)
		size -= n
		bh := uint32(n) << 3 // Raw_Block
		if size == 0 {
			bh |= 1
		}
		b = append(b, byte(bh), byte(bh>>8), byte(bh>>16))
		b = append(b, make([]byte, n)...)
	}
	return b
}

// withContentSize returns a copy of frame recording fcs as its content
// size, which must fit the frame's Frame_Content_Size field.
func withContentSize(t *testing.T, frame []byte, fcs uint64) []byte {
	t.Helper()
	var h zstd.Header
	if err := h.Decode(frame); err != nil || !h.HasFCS {
		t.Fatalf("frame without a content size: %v", err)
	}
	f := bytes.Clone(frame)
	fhd := f[4]
	off := 5 + [4]int{0, 1, 2, 4}[fhd&3]
	if fhd&(1<<5) == 0 {
		off++ // Window_Descriptor
	}
	switch fhd >> 6 {
	case 0:
		f[off] = byte(fcs)
	case 1:
		binary.LittleEndian.PutUint16(f[off:], uint16(fcs-256))
	case 2:
		binary.LittleEndian.PutUint32(f[off:], uint32(fcs))
	case 3:
		binary.LittleEndian.PutUint64(f[off:], fcs)
	}
	if err := h.Decode(f); err != nil || h.FrameContentSize != fcs {
		t.Fatalf("content size %d does not fit the frame's field: %d, %v", fcs, h.FrameContentSize, err)
	}
	return f
}

// TestZstdLyingContentSize feeds frames whose content is not the size they
// record to DecodeValue with the recorded size as the limit: each must be
// refused as corrupt, and cost no more than the buffer for the recorded
// size plus, for a frame that holds more than it records, the one growth
// of that buffer by the block that overruns it, under 3x the limit in all.
// klauspost/compress appends raw, RLE and literal-only blocks to the
// output and checks the frame's size after each block, so the growth is
// the same with or without WithDecodeAllCapLimit.
func TestZstdLyingContentSize(t *testing.T) {
	const limit = limit1M
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithEncoderCRC(false))
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	chat := enc.EncodeAll(chatJSON(limit+300<<10), nil)
	random := enc.EncodeAll(randomBytes(limit+300<<10, 3), nil)
	for _, c := range []struct {
		name  string
		frame []byte
		grows bool // whether the frame may grow the buffer
	}{
		// The slack is no room for a lie: the decoder may fill it, but
		// the frame is then refused, and the buffer never grows.
		{"RLE, 10 bytes more, within the slack", zstdRLEFrame(limit+10, limit, 0x68), false},
		{"RLE, 10 bytes less", zstdRLEFrame(limit-10, limit, 0x68), false},
		{"raw, 10 bytes less", zstdRawFrame(limit-10, limit), false},
		{"RLE, a block more", zstdRLEFrame(limit+maxZstdBlock, limit, 0x68), true},
		{"RLE, twice as much", zstdRLEFrame(2*limit, limit, 0x68), true},
		{"raw, a block more", zstdRawFrame(limit+maxZstdBlock, limit), true},
		{"encoder, JSON, 300 KiB more", withContentSize(t, chat, limit), true},
		{"encoder, JSON, 1 byte more", withContentSize(t, chat, limit+300<<10-1), true},
		{"encoder, random, 300 KiB more", withContentSize(t, random, limit), true},
		{"encoder, random, 1 byte less", withContentSize(t, random, limit+300<<10+1), false},
	} {
		value := append([]byte{HeaderZstd}, c.frame...)
		var h zstd.Header
		if err := h.Decode(c.frame); err != nil {
			t.Fatal(err)
		}
		fcs := h.FrameContentSize
		bound := smallLoss + fcs + zstdOverAlloc
		if c.grows {
			bound = 3 * fcs
		}
		checkRefused(t, c.name, value, int(fcs), ErrCorrupt, bound)
		// A caller's buffer with room for the recorded size but no slack
		// is used as it is, and the frame refused all the same.
		dst := make([]byte, 0, fcs)
		if _, err := DecodeValue(dst, value, int(fcs)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s, into a buffer without slack: %v, want ErrCorrupt", c.name, err)
		}
	}
}
