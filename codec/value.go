package codec

import (
	"errors"
	"fmt"
)

// IsHeader reports whether b is in the header space: the bytes that cannot
// begin JSON text, less the whitespace JSON may start with. They are 0x00 to
// 0x08, 0x0b, 0x0c, 0x0e to 0x1f, and 0x7f. A value whose first byte is
// outside the header space is plain.
func IsHeader(b byte) bool {
	return b < 0x20 && b != '\t' && b != '\n' && b != '\r' || b == 0x7f
}

// Plain reports whether a writer may store value verbatim: it is not empty
// and its first byte is not a header byte, so readers cannot mistake it for
// a framed value. Only serializers whose output is text, such as JSON, may
// be stored verbatim; binary output always gets a header, None if nothing
// else, as its first byte could be a header byte.
func Plain(value []byte) bool {
	return len(value) > 0 && !IsHeader(value[0])
}

// AppendValue appends to dst a framed value holding src compressed with c:
// the header byte c.ID(), then c's payload. c must be registered, so that
// this process at least can read what it writes.
func AppendValue(dst []byte, c Codec, src []byte) ([]byte, error) {
	if c == nil {
		return dst, errors.New("codec: AppendValue with nil Codec")
	}
	id := c.ID()
	if _, ok := Lookup(id); !ok {
		return dst, fmt.Errorf("codec: AppendValue with %q: header byte 0x%02x is not registered", c.Name(), id)
	}
	start := len(dst)
	dst, err := c.Encode(append(dst, id), src)
	if err != nil {
		return dst[:start], err
	}
	return dst, nil
}

// DecodeValue decodes a stored value, producing at most limit bytes; a
// negative limit is taken as zero.
//
// An empty value decodes to itself. A plain value, one whose first byte is
// not a header byte, is returned itself, not copied, and dst is not used;
// it is an error matching ErrTooLarge if it is longer than limit. Any other
// value is decoded by the codec its header byte names and appended to dst.
// A header byte that names no codec, including every reserved one, returns
// a *HeaderError matching ErrUnknownHeader: such a value was written by a
// newer or differently configured writer and must be neither used as plain
// nor deleted. A value written with a dictionary (header byte
// HeaderZstdDict) that is well formed, as far as can be told without the
// dictionary, returns a *DictionaryError matching ErrUnknownDictionary
// that names the dictionary; it must not be deleted either, and
// DecodeValueDict decodes it with its dictionary.
//
// Other errors match ErrCorrupt or ErrTooLarge. On error DecodeValue returns
// dst with its original length.
func DecodeValue(dst, value []byte, limit int) ([]byte, error) {
	if len(value) == 0 {
		return value, nil
	}
	b := value[0]
	if !IsHeader(b) {
		if len(value) > clampLimit(limit) {
			return dst, fmt.Errorf("codec: %w: plain value of %d bytes, limit %d", ErrTooLarge, len(value), limit)
		}
		return value, nil
	}
	if b == HeaderGzip {
		if len(value) >= 2 && value[1] == 0x8b {
			return decodeGzip(dst, value, limit)
		}
		return dst, &HeaderError{Byte: b}
	}
	c, ok := Lookup(b)
	if !ok {
		return dst, &HeaderError{Byte: b}
	}
	return c.Decode(dst, value[1:], limit)
}
