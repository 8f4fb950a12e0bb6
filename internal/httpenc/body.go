package httpenc

import (
	"bytes"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/packcache/packcache/codec"
)

// A Body is one response body, with its content coding and entity tag.
// Its bytes are read only: a Body may be a view of the stored value and
// may be sent to many clients at once.
type Body struct {
	b      []byte
	coding string // the Content-Encoding; "" for identity
	etag   string
}

// noBody is the answer for a body that cannot be made: a stored value
// that is not a zstd frame browsers take, or a serialized value too small
// to gzip or that gzip does not shrink. An Edge keeps it like a body, so
// that the attempt is not made again.
var noBody = &Body{}

// gzipMin is the smallest serialized value sent gzipped: below it a
// response fits a packet or two either way, and gzip's 18 bytes of
// framing eat much of the gain.
const gzipMin = 1 << 10

// webZstdWindow is the largest window a zstd frame sent as
// Content-Encoding may need: RFC 9659 lets decoders refuse more, and
// browsers do.
const webZstdWindow = 8 << 20

// zstdBody returns the frame of stored as a body, or noBody if stored is
// not a zstd value (header 0x04, see FORMAT.md) whose frame browsers take:
// one without a dictionary whose window is at most webZstdWindow. The
// body is a view of stored.
func zstdBody(stored []byte) *Body {
	if len(stored) < 2 || stored[0] != codec.HeaderZstd {
		return noBody
	}
	frame := stored[1:]
	var h zstd.Header
	if h.Decode(frame) != nil || h.Skippable || h.DictionaryID != 0 {
		return noBody
	}
	window := h.WindowSize
	if h.SingleSegment {
		window = h.FrameContentSize // the window of a single-segment frame
	}
	if window > webZstdWindow {
		return noBody
	}
	return &Body{b: frame, coding: "zstd", etag: etag(frame, "zstd")}
}

// identityBody returns the serialized value plain as a body, a view of it.
func identityBody(plain []byte) *Body {
	return &Body{b: plain, etag: etag(plain, "")}
}

var gzipWriters sync.Pool // *gzip.Writer

// gzipBody returns plain gzipped, or noBody if gzip does not make it
// smaller, and the bytes allocated.
func gzipBody(plain []byte) (*Body, int, error) {
	var buf bytes.Buffer
	buf.Grow(len(plain)/3 + 64)
	zw, _ := gzipWriters.Get().(*gzip.Writer)
	if zw == nil {
		zw, _ = gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	} else {
		zw.Reset(&buf)
	}
	zw.Write(plain)
	err := zw.Close()
	zw.Reset(nil)
	gzipWriters.Put(zw)
	if err != nil {
		return nil, 0, err
	}
	if buf.Len() >= len(plain) {
		return noBody, 0, nil
	}
	b := buf.Bytes()
	return &Body{b: b, coding: "gzip", etag: etag(b, "gzip")}, cap(b), nil
}
