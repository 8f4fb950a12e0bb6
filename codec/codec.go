// Package codec holds the compression codecs packcache stores values with and
// the one-byte header that makes every stored value self-describing.
//
// A stored value is either plain (the serialized bytes verbatim, as a JSON
// serializer writes them) or framed: one header byte naming the codec, then
// the codec's payload in its standard format. The header bytes are chosen so
// that none can begin JSON text, so a reader tells the two cases apart from
// the first byte alone. FORMAT.md at the root of the module describes the
// bytes precisely.
//
// Every built-in codec is registered before any user code runs, so every
// reader decodes every built-in format whatever codec it writes with.
package codec

import "errors"

// A Codec compresses and decompresses payloads. Implementations must be safe
// for concurrent use by multiple goroutines.
type Codec interface {
	// ID returns the header byte that names the codec in stored values.
	// Codecs that differ only in level share an ID: they produce the same
	// format and one decoder reads them all.
	ID() byte

	// Name returns a short lower-case name, such as "zstd", for stats and
	// messages. Codecs that share an ID share a name.
	Name() string

	// Encode appends the compressed form of src to dst and returns the
	// extended slice. It does not write the header byte.
	Encode(dst, src []byte) ([]byte, error)

	// Decode appends the decompressed form of src (a payload without its
	// header byte) to dst and returns the extended slice. It produces at most
	// limit bytes: a payload that would decode to more returns an error
	// matching ErrTooLarge, found before allocating for it wherever the
	// format declares its size. A payload that is not valid returns an error
	// matching ErrCorrupt; one that needs a dictionary the codec does not
	// have, an error matching ErrUnknownDictionary.
	Decode(dst, src []byte, limit int) ([]byte, error)
}

// Header bytes of the built-in formats. See FORMAT.md.
const (
	HeaderNone     byte = 0x01 // payload stored uncompressed
	HeaderLZ4      byte = 0x02 // LZ4 block preceded by its size, 4 bytes little-endian
	HeaderSnappy   byte = 0x03 // Snappy block
	HeaderZstd     byte = 0x04 // one Zstandard frame recording its content size
	HeaderZstdDict byte = 0x05 // one Zstandard frame recording its content size and naming its dictionary
	HeaderGzip     byte = 0x1f // a gzip stream (read only; the byte is the stream's own first byte)

	// HeaderTombstone, as a whole value of one byte, records that the
	// source of truth has no value for the key (a remembered ErrNotFound).
	// It is not a codec: DecodeValue reports it as an unknown header, and
	// the cache checks for it before decoding.
	HeaderTombstone byte = 0x0e

	// HeaderLease begins a lease: a value that stands for a load in
	// progress, written by a reader that missed and is loading the value,
	// so that a write made meanwhile can tell the load not to store what
	// it loaded. The rest of the value is an opaque token. It is not a
	// codec: DecodeValue reports it as an unknown header, and the cache
	// checks for it before decoding.
	HeaderLease byte = 0x0c
)

// User codecs registered with Register take header bytes from
// FirstUserHeader to LastUserHeader inclusive.
const (
	FirstUserHeader byte = 0x10
	LastUserHeader  byte = 0x1e
)

var (
	// ErrUnknownHeader reports a value whose first byte is a header byte
	// that names no registered codec. Errors returned for it are
	// *HeaderError values.
	ErrUnknownHeader = errors.New("unknown header byte")

	// ErrCorrupt reports a payload that is truncated or not valid for its
	// codec.
	ErrCorrupt = errors.New("corrupt value")

	// ErrTooLarge reports a value that would decode to more bytes than the
	// limit allows.
	ErrTooLarge = errors.New("decoded size over limit")
)

// A HeaderError reports a header byte that no registered codec claims.
type HeaderError struct {
	Byte byte
}

func (e *HeaderError) Error() string {
	return "unknown header byte 0x" + string(hex[e.Byte>>4]) + string(hex[e.Byte&15])
}

// Is reports whether target is ErrUnknownHeader.
func (e *HeaderError) Is(target error) bool { return target == ErrUnknownHeader }

const hex = "0123456789abcdef"
