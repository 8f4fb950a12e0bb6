// Package brotli is a packcache codec that compresses with Brotli
// (RFC 7932), using github.com/andybalholm/brotli. It is the worked example
// of a user codec: a module of its own, registered by the application, under
// a header byte from the user range 0x10 to 0x1E.
//
// Register it on every reader before any writer uses it, then write with
// it:
//
//	bc := brotli.New(1) // quality 0-11
//	if err := codec.Register(bc); err != nil {
//		return err
//	}
//	c, err := packcache.New[Channel](rdb, packcache.WithCodec(bc))
//
// The payload after the header byte is one standard Brotli stream, which
// the brotli command line tool decodes, with nothing after it.
package brotli

import (
	"errors"
	"fmt"
	"io"
	"sync"

	brotlilib "github.com/andybalholm/brotli"

	"github.com/packcache/packcache/codec"
)

// DefaultHeader is the header byte New uses: the first of the user range,
// codec.FirstUserHeader. An application that already stores values under
// 0x10 with another codec picks a free byte with WithHeader, and keeps it
// for as long as values written with it may exist.
const DefaultHeader byte = 0x10

// DefaultQuality is the quality recommended for large JSON documents:
// published comparisons of compressed JSON in Redis report quality 1 as
// the best trade for documents of about 20 MB, and qualities above 9 as
// slower than storing them uncompressed. The README has this module's own
// measurements.
const DefaultQuality = 1

// Window is the base-2 logarithm of the window Encode writes with, 4 MiB,
// fixed so that what is written does not change with the library's
// defaults. Readers accept every standard window, 1 KiB to 16 MiB.
const Window = 22

// Codec is a Brotli codec of one quality. It implements codec.Codec and is
// safe for concurrent use. Codecs of every quality under the same header
// byte write the same format, and any of them decodes what the others
// wrote, so a reader registers one of them.
type Codec struct {
	id      byte
	quality int
	// writers holds Writers for reuse, one pool per size class (see
	// sizeClass): a Writer keeps, across Reset, what it chose for the
	// first input it compressed, and one first used for a small value
	// wrote values of 1 MiB and more 3-8% larger at qualities 4 to 9, or
	// smaller ones up to 7% larger when first used for a large value
	// (TestEncodeIndependentOfHistory).
	writers [2]sync.Pool // *encoder
}

// sizeClass is the pool of writers an input of n bytes is encoded by: the
// library tunes an encoder to its first input's size, by whether it is 1
// MiB or more.
func sizeClass(n int) int {
	if n >= 1<<20 {
		return 1
	}
	return 0
}

// An Option configures a Codec.
type Option func(*Codec)

// WithHeader sets the header byte the codec takes, instead of
// DefaultHeader. It must be from codec.FirstUserHeader to
// codec.LastUserHeader; codec.Register refuses any other.
func WithHeader(b byte) Option {
	return func(c *Codec) { c.id = b }
}

// New returns a Brotli codec writing at the given quality, 0 (fastest) to
// 11 (smallest); qualities outside that range are clamped to it. It
// registers nothing: pass it to codec.Register on every reader.
func New(quality int, opts ...Option) *Codec {
	c := &Codec{id: DefaultHeader, quality: min(max(quality, brotlilib.BestSpeed), brotlilib.BestCompression)}
	for _, o := range opts {
		o(c)
	}
	return c
}

// ID returns the codec's header byte.
func (c *Codec) ID() byte { return c.id }

// Name returns "brotli", whatever the quality and header byte.
func (*Codec) Name() string { return "brotli" }

// Quality returns the quality Encode writes at.
func (c *Codec) Quality() int { return c.quality }

// encoder is a pooled Writer with the slice it appends to. Writer.Reset
// keeps the encoder's hash tables and ring buffer, which at the higher
// qualities are most of the cost of a small value.
type encoder struct {
	w   *brotlilib.Writer
	out appendWriter
}

// Encode appends src compressed as one Brotli stream to dst.
func (c *Codec) Encode(dst, src []byte) ([]byte, error) {
	pool := &c.writers[sizeClass(len(src))]
	e, _ := pool.Get().(*encoder)
	if e == nil {
		e = &encoder{}
		e.w = brotlilib.NewWriterOptions(&e.out, brotlilib.WriterOptions{Quality: c.quality, LGWin: Window})
	} else {
		e.w.Reset(&e.out)
	}
	start := len(dst)
	e.out.b = dst
	_, err := e.w.Write(src)
	if cerr := e.w.Close(); err == nil {
		err = cerr
	}
	dst, e.out.b = e.out.b, nil
	pool.Put(e)
	if err != nil {
		return dst[:start], fmt.Errorf("codec brotli: %w", err)
	}
	return dst, nil
}

// decoders holds Readers for reuse. A Reader keeps its ring buffer, its
// Huffman tables and its 32 KiB input buffer across Reset.
var decoders sync.Pool // *decoder

type decoder struct {
	r    *brotlilib.Reader
	head [1]byte
	src  codec.HeadReader // head, the stream's first byte rewritten, then the rest
}

// maxPooledWindow is the largest window whose Reader goes back to the
// pool: a Reader keeps its ring buffer, up to the window, and a rare value
// with a 16 MiB window should not pin that much for every later one.
const maxPooledWindow = 8 << 20

// Decode appends the decompression of src, one Brotli stream, to dst,
// producing at most limit bytes. A stream that holds more returns an error
// matching codec.ErrTooLarge after limit bytes have been decoded; anything
// that is not exactly one valid stream returns an error matching
// codec.ErrCorrupt. On error dst is returned with its original length.
//
// Brotli records no size and no checksum: a stream is decoded until it ends
// or passes the limit, and a damaged stream that still parses decodes to
// wrong bytes rather than to an error.
func (*Codec) Decode(dst, src []byte, limit int) (out []byte, err error) {
	limit = max(limit, 0)
	if len(src) == 0 {
		return dst, corruptf("empty payload")
	}
	d, _ := decoders.Get().(*decoder)
	if d == nil {
		d = &decoder{r: brotlilib.NewReader(nil)}
	}
	var window int
	d.head[0], window = shrinkWindow(src[0], limit)
	d.src = codec.HeadReader{Head: d.head[:], Rest: src[1:]}
	start := len(dst)
	pool := window <= maxPooledWindow
	defer func() {
		if p := recover(); p != nil {
			// Not expected of the decoder, but a hostile value must
			// not take the process down. The Reader's state is
			// unknown: drop it.
			out, err = dst[:start], corruptf("decoder panicked: %v", p)
			pool = false
		}
		d.src = codec.HeadReader{}
		if pool {
			_ = d.r.Reset(nil) // drop the reference to src
			decoders.Put(d)
		}
	}()
	_ = d.r.Reset(&d.src) // never fails
	// A hint, not a claim: Brotli records no size. JSON compresses about 5
	// to 15 times.
	out, err = codec.ReadLimited(dst, d.r, limit, 8*len(src))
	if err != nil {
		if errors.Is(err, codec.ErrTooLarge) {
			return out, fmt.Errorf("codec brotli: %w: stream decodes to more than %d bytes", codec.ErrTooLarge, limit)
		}
		if err == io.ErrUnexpectedEOF || err == io.EOF {
			return out, corruptf("truncated stream")
		}
		return out, fmt.Errorf("codec brotli: %w: %w", codec.ErrCorrupt, err)
	}
	return out, nil
}

// shrinkWindow returns the first byte of a stream, b, with the window it
// declares lowered to what the first limit bytes of output can use, and
// that window's size.
//
// The decoder allocates a ring buffer of up to the declared window, 16 MiB
// at most, whatever the limit. A window enters decoding only through the
// greatest backward distance, min(window - 16, bytes decoded so far)
// (RFC 7932, section 4): a command that begins within the first limit
// bytes sees the same greatest distance under any window of at least
// limit + 16, so decodes to the same bytes. A stream that fits the limit
// therefore decodes identically; one that does not is refused whatever it
// holds past the limit (as too large, or as corrupt if the smaller window
// makes something past the limit invalid).
//
// The window is the first 1, 4 or 7 bits of the stream (section 9.1). Only
// the 4-bit codes, windows of 256 KiB to 16 MiB, are rewritten, to another
// 4-bit code, so that no other bit moves; the others declare 128 KiB at
// most. The large-window extension's code is left for the decoder to
// refuse.
func shrinkWindow(b byte, limit int) (byte, int) {
	if b&1 == 0 {
		return b, 1 << 16
	}
	n := b >> 1 & 7
	if n == 0 {
		return b, 1 << 17 // 1 KiB to 128 KiB
	}
	bits := 17 + int(n) // 18 to 24
	need := 18
	for need < bits && 1<<need-16 < limit {
		need++
	}
	if need < bits {
		b = b&^0x0e | byte(need-17)<<1
		bits = need
	}
	return b, 1 << bits
}

func corruptf(format string, args ...any) error {
	return fmt.Errorf("codec brotli: %w: %s", codec.ErrCorrupt, fmt.Sprintf(format, args...))
}

// appendWriter is an io.Writer that appends to a slice.
type appendWriter struct{ b []byte }

func (w *appendWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

var _ codec.Codec = (*Codec)(nil)
