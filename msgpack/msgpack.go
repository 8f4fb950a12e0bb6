// Package msgpack is a packcache.Serializer that writes MessagePack, using
// github.com/vmihailenco/msgpack/v5. It is the worked example of a binary
// serializer: a module of its own, passed to packcache.WithSerializer.
//
//	c, err := packcache.New[Channel](rdb, packcache.WithSerializer(msgpack.Serializer))
//
// Every payload it writes is the byte Marker, 0xC1, then one MessagePack
// value. 0xC1 is the one byte the MessagePack specification says is never
// used, and it can begin neither UTF-8 text nor, so, JSON. So a reader
// configured for JSON that meets a msgpack value fails to parse it (with
// packcache.ErrSerialization) instead of reading it as a JSON document,
// which a bare MessagePack value can be by accident (the positive fixint
// 0x31 is the JSON text 1), and Unmarshal refuses any payload that does not
// begin with the marker, so a msgpack reader that meets a JSON value fails
// the same way.
package msgpack

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/packcache/packcache"
)

// Marker is the first byte of every payload Serializer writes: 0xC1, which
// MessagePack never uses and UTF-8 never begins with.
const Marker byte = 0xc1

// Serializer encodes values as MessagePack behind Marker. It reads struct
// fields' msgpack tags, and their json tags where they have none, so that
// types written for packcache's JSON serializer keep their field names and
// omitempty; it writes integers in their smallest form. It does not call
// MarshalJSON or UnmarshalJSON methods. Text reports false, so packcache
// puts a header in front of every value.
//
// MessagePack timestamps hold an instant, not a time zone: a time.Time
// decodes in time.Local. A number decoded into an interface value is an
// int64, a uint64 (MessagePack's unsigned forms, which the encoder uses
// for integers above 127) or a float64, where JSON gives float64.
var Serializer packcache.Serializer = serializer{}

// ErrNotMsgpack reports a payload that does not begin with Marker, such as
// a JSON document: it was not written by Serializer.
var ErrNotMsgpack = errors.New("msgpack: not a msgpack value (no 0xC1 marker)")

// ErrInvalid reports a payload that begins with Marker but does not hold
// exactly one well-formed MessagePack value within the limits Unmarshal
// sets (see Unmarshal).
var ErrInvalid = errors.New("msgpack: invalid value")

// MaxDepth is how deeply arrays and maps may nest in a value Unmarshal
// accepts, as encoding/json limits it: deeper nesting is refused before
// decoding, rather than recursed into.
const MaxDepth = 10000

type serializer struct{}

type encoder struct {
	enc *msgpack.Encoder
	out appendWriter
}

var encoders = sync.Pool{New: func() any {
	e := &encoder{}
	e.enc = msgpack.NewEncoder(&e.out)
	e.enc.SetCustomStructTag("json")
	e.enc.UseCompactInts(true)
	return e
}}

// Marshal appends Marker and the MessagePack encoding of the value v
// points to to dst.
func (serializer) Marshal(dst []byte, v any) ([]byte, error) {
	e := encoders.Get().(*encoder)
	start := len(dst)
	e.out.b = append(dst, Marker)
	// ResetWriter, not Reset, which would clear the options the encoder
	// was made with.
	e.enc.ResetWriter(&e.out)
	err := e.enc.Encode(v)
	dst, e.out.b = e.out.b, nil
	e.enc.ResetWriter(nil)
	encoders.Put(e)
	if err != nil {
		return dst[:start], err
	}
	return dst, nil
}

type decoder struct {
	dec *msgpack.Decoder
	r   bytes.Reader
}

var decoders = sync.Pool{New: func() any {
	d := &decoder{}
	d.dec = msgpack.NewDecoder(&d.r)
	d.dec.SetCustomStructTag("json")
	d.dec.UseLooseInterfaceDecoding(true)
	return d
}}

// Unmarshal decodes a payload written by Marshal into the value v points
// to. A payload that does not begin with Marker is refused with
// ErrNotMsgpack. The rest must be exactly one MessagePack value, which is
// checked before anything is decoded: every array, map, string, binary
// and extension must declare no more elements or bytes than follow it, and
// nesting must not exceed MaxDepth; otherwise the error matches
// ErrInvalid. The library allocates what a header declares before reading
// the elements (a 5-byte array header may claim four billion), so without
// this check a hostile value of a few bytes could make it allocate
// gigabytes; with it, what decoding allocates is bounded by what the
// payload holds.
//
// Strings, byte slices and raw messages are copied out of data, which is
// not retained.
func (serializer) Unmarshal(data []byte, v any) error {
	if len(data) == 0 || data[0] != Marker {
		if len(data) == 0 {
			return fmt.Errorf("%w: empty payload", ErrNotMsgpack)
		}
		return fmt.Errorf("%w: payload begins 0x%02x", ErrNotMsgpack, data[0])
	}
	body := data[1:]
	if err := check(body); err != nil {
		return err
	}
	d := decoders.Get().(*decoder)
	d.r.Reset(body)
	// ResetReader keeps the options the decoder was made with.
	d.dec.ResetReader(&d.r)
	err := d.dec.Decode(v)
	d.r.Reset(nil)
	d.dec.ResetReader(&d.r)
	decoders.Put(d)
	return err
}

func (serializer) Text() bool { return false }

// check reports whether b is exactly one well-formed MessagePack value
// whose containers and byte strings declare no more than b holds and that
// nests no deeper than MaxDepth. It reads headers only, skipping the
// contents of strings and binaries, and allocates only beyond 32 levels of
// nesting: 4 bytes a level.
//
// Each element of an array takes at least one byte and each entry of a map
// at least two, so a container declaring more than the bytes after its
// header can hold is refused here; and as every element of every container
// must be present for the check to pass, the number of values decoding
// creates is at most len(b).
func check(b []byte) error {
	// pending[i] is how many values the i-th open container still holds.
	// A count fits: it is at most len(b), and a payload over 4 GiB is
	// refused below.
	var stackBuf [32]uint32
	pending := append(stackBuf[:0], 1)
	if uint64(len(b)) > math.MaxUint32 {
		return fmt.Errorf("%w: %d bytes, over 4 GiB", ErrInvalid, len(b))
	}
	pos := 0
	for len(pending) > 0 {
		top := len(pending) - 1
		if pending[top] == 0 {
			pending = pending[:top]
			continue
		}
		pending[top]--
		if pos >= len(b) {
			return fmt.Errorf("%w: truncated at byte %d", ErrInvalid, pos)
		}
		c := b[pos]
		pos++
		var skip uint64  // bytes of content after the header
		var count uint64 // values a container holds
		container := false
		switch {
		case c <= 0x7f || c >= 0xe0: // positive and negative fixint
		case c <= 0x8f: // fixmap
			count, container = 2*uint64(c&0x0f), true
		case c <= 0x9f: // fixarray
			count, container = uint64(c&0x0f), true
		case c <= 0xbf: // fixstr
			skip = uint64(c & 0x1f)
		default:
			var n uint64
			ok := true // false when a length field is cut off
			switch c {
			case 0xc0, 0xc2, 0xc3: // nil, false, true
			case 0xc1:
				return fmt.Errorf("%w: the never-used byte 0xc1 at byte %d", ErrInvalid, pos-1)
			case 0xc4, 0xd9: // bin8, str8
				n, ok = uintAt(b, &pos, 1)
				skip = n
			case 0xc5, 0xda: // bin16, str16
				n, ok = uintAt(b, &pos, 2)
				skip = n
			case 0xc6, 0xdb: // bin32, str32
				n, ok = uintAt(b, &pos, 4)
				skip = n
			case 0xc7: // ext8: length, type, data
				n, ok = uintAt(b, &pos, 1)
				skip = n + 1
			case 0xc8: // ext16
				n, ok = uintAt(b, &pos, 2)
				skip = n + 1
			case 0xc9: // ext32
				n, ok = uintAt(b, &pos, 4)
				skip = n + 1
			case 0xca, 0xce, 0xd2: // float32, uint32, int32
				skip = 4
			case 0xcb, 0xcf, 0xd3: // float64, uint64, int64
				skip = 8
			case 0xcc, 0xd0: // uint8, int8
				skip = 1
			case 0xcd, 0xd1: // uint16, int16
				skip = 2
			case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16: type, data
				skip = 1 + 1<<(c-0xd4)
			case 0xdc: // array16
				count, ok = uintAt(b, &pos, 2)
				container = true
			case 0xdd: // array32
				count, ok = uintAt(b, &pos, 4)
				container = true
			case 0xde: // map16
				n, ok = uintAt(b, &pos, 2)
				count, container = 2*n, true
			case 0xdf: // map32
				n, ok = uintAt(b, &pos, 4)
				count, container = 2*n, true
			}
			if !ok {
				return fmt.Errorf("%w: truncated header at byte %d", ErrInvalid, pos-1)
			}
		}
		rest := uint64(len(b) - pos)
		if container {
			if count > rest {
				return fmt.Errorf("%w: container at byte %d declares %d values, more than the %d bytes after it can hold", ErrInvalid, pos, count, rest)
			}
			if count > 0 {
				if len(pending) > MaxDepth {
					return fmt.Errorf("%w: nested deeper than %d", ErrInvalid, MaxDepth)
				}
				if len(pending) == cap(pending) {
					// Double: append grows large slices by a quarter, which
					// would copy a deep stack many times over.
					pending = slices.Grow(pending, len(pending))
				}
				pending = append(pending, uint32(count))
			}
			continue
		}
		if skip > rest {
			return fmt.Errorf("%w: value at byte %d declares %d bytes, %d remain", ErrInvalid, pos, skip, rest)
		}
		pos += int(skip)
	}
	if pos != len(b) {
		return fmt.Errorf("%w: %d bytes after the value", ErrInvalid, len(b)-pos)
	}
	return nil
}

// uintAt reads a big-endian unsigned integer of size bytes at *pos and
// advances *pos past it.
func uintAt(b []byte, pos *int, size int) (uint64, bool) {
	if len(b)-*pos < size {
		return 0, false
	}
	var n uint64
	for _, x := range b[*pos : *pos+size] {
		n = n<<8 | uint64(x)
	}
	*pos += size
	return n, true
}

// appendWriter is an io.Writer, and the io.ByteWriter the encoder wants,
// that appends to a slice.
type appendWriter struct{ b []byte }

func (w *appendWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

func (w *appendWriter) WriteByte(c byte) error {
	w.b = append(w.b, c)
	return nil
}
