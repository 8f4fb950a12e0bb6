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

// Coding is the body's content coding, "zstd", "gzip" or "identity"; ""
// for none (a nil Body: nothing acceptable).
func (b *Body) Coding() string {
	switch {
	case b == nil:
		return ""
	case b.coding == "":
		return "identity"
	}
	return b.coding
}

// ETag is the body's strong entity tag, quoted; "" for a nil Body.
func (b *Body) ETag() string {
	if b == nil {
		return ""
	}
	return b.etag
}

// noBody is the answer for a body that cannot be made: a stored value
// that is not a zstd frame browsers take, or a serialized value too small
// to compress or that the coding does not shrink. An Edge keeps it like a body, so
// that the attempt is not made again.
var noBody = &Body{}

// compressMin is the smallest serialized value Serve compresses (gzip, or
// zstd for a value with no stored form): below it a response fits a
// packet or two either way, and the framing eats much of the gain. It is
// the cache's default compression threshold.
const compressMin = 1 << 10

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

// webZstd is the encoder of the zstd bodies made from a serialized value:
// frames browsers take (no dictionary, a window of at most
// webZstdWindow), at zstd's default level, which compresses about as fast
// as gzip's default and smaller.
var webZstd = sync.OnceValue(func() *zstd.Encoder {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithWindowSize(webZstdWindow),
		zstd.WithEncoderConcurrency(1))
	if err != nil {
		panic("httpenc: zstd encoder: " + err.Error()) // the options are constants
	}
	return enc
})

// zstdMade returns plain compressed with zstd as a body, for a value with
// no stored frame to pass on, or noBody if zstd does not make it smaller,
// and the bytes allocated.
func zstdMade(plain []byte) (*Body, int, error) {
	b := webZstd().EncodeAll(plain, make([]byte, 0, len(plain)/3+64))
	if len(b) >= len(plain) {
		return noBody, 0, nil
	}
	return &Body{b: b, coding: "zstd", etag: etag(b, "zstd")}, cap(b), nil
}
