package codec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// HeaderExtended begins an envelope: fields about a value (the groups it
// was stored in, the TTL it was stored with), then the value itself. See
// FORMAT.md, section 2.4. DecodeValue reports it as an unknown header, as
// readers that predate it do: a reader must unwrap it (ParseEnvelope)
// and judge its fields before it decodes what it holds.
const HeaderExtended byte = 0x0b

// The fields an envelope may hold, by their tag byte (FORMAT.md, 2.4).
const (
	fieldGroups byte = 0x01
	fieldTTL    byte = 0x02
)

// ErrEnvelope is matched by the errors of a malformed envelope; they
// match ErrCorrupt too.
var ErrEnvelope = errors.New("malformed envelope")

// An Envelope is what the extended header says about the value it holds.
type Envelope struct {
	// Groups are the groups the value was stored in, and Seq the group
	// sequence the writer read before it read its value: the value is
	// current only while every group's record exists and holds a
	// sequence no greater than Seq. Nil: in no group.
	Groups []string
	Seq    uint64
	// TTL is the time to live the value was stored with, before jitter
	// and stale window (0: not recorded; the key's policy's).
	TTL time.Duration
}

// AppendEnvelope appends to dst an envelope holding e's fields and then
// inner, a stored value (plain, framed, or the tombstone). It refuses an
// inner value that is a lease or an envelope itself.
func AppendEnvelope(dst []byte, e Envelope, inner []byte) ([]byte, error) {
	if len(inner) > 0 && (inner[0] == HeaderLease || inner[0] == HeaderExtended) {
		return dst, fmt.Errorf("codec: an envelope cannot hold a value beginning 0x%02x", inner[0])
	}
	var fields []byte
	if e.Groups != nil {
		var f []byte
		f = binary.AppendUvarint(f, e.Seq)
		f = binary.AppendUvarint(f, uint64(len(e.Groups)))
		for _, g := range e.Groups {
			f = binary.AppendUvarint(f, uint64(len(g)))
			f = append(f, g...)
		}
		fields = appendField(fields, fieldGroups, f)
	}
	if e.TTL > 0 {
		fields = appendField(fields, fieldTTL, binary.AppendUvarint(nil, uint64(max(e.TTL.Milliseconds(), 1))))
	}
	dst = append(dst, HeaderExtended)
	dst = binary.AppendUvarint(dst, uint64(len(fields)))
	dst = append(dst, fields...)
	return append(dst, inner...), nil
}

func appendField(dst []byte, tag byte, data []byte) []byte {
	dst = append(dst, tag)
	dst = binary.AppendUvarint(dst, uint64(len(data)))
	return append(dst, data...)
}

// ParseEnvelope reads the envelope v, which begins with HeaderExtended,
// and returns its fields and the value it holds (a slice of v). A field
// whose tag it does not know is an unknown header (a *HeaderError naming
// 0x0b: written by a newer writer); anything malformed matches ErrCorrupt
// and ErrEnvelope.
func ParseEnvelope(v []byte) (e Envelope, inner []byte, err error) {
	if len(v) == 0 || v[0] != HeaderExtended {
		return e, nil, envErr("does not begin with 0x0b")
	}
	n, k := binary.Uvarint(v[1:])
	if k <= 0 || n > uint64(len(v)-1-k) {
		return e, nil, envErr("bad fields length")
	}
	fields, inner := v[1+k:1+k+int(n)], v[1+k+int(n):]
	if len(inner) > 0 && (inner[0] == HeaderLease || inner[0] == HeaderExtended) {
		return e, nil, envErr(fmt.Sprintf("holds a value beginning 0x%02x", inner[0]))
	}
	seen := map[byte]bool{}
	for len(fields) > 0 {
		tag := fields[0]
		l, k := binary.Uvarint(fields[1:])
		if k <= 0 || l > uint64(len(fields)-1-k) {
			return e, nil, envErr("bad field length")
		}
		data := fields[1+k : 1+k+int(l)]
		fields = fields[1+k+int(l):]
		if seen[tag] {
			return e, nil, envErr(fmt.Sprintf("field 0x%02x twice", tag))
		}
		seen[tag] = true
		switch tag {
		case fieldGroups:
			if e.Groups, e.Seq, err = parseGroups(data); err != nil {
				return Envelope{}, nil, err
			}
		case fieldTTL:
			ms, k := binary.Uvarint(data)
			if k != len(data) || ms == 0 || ms > uint64(1<<63-1)/uint64(time.Millisecond) {
				return Envelope{}, nil, envErr("bad TTL")
			}
			e.TTL = time.Duration(ms) * time.Millisecond
		default:
			return Envelope{}, nil, &HeaderError{Byte: HeaderExtended}
		}
	}
	return e, inner, nil
}

func parseGroups(data []byte) ([]string, uint64, error) {
	seq, k := binary.Uvarint(data)
	if k <= 0 {
		return nil, 0, envErr("bad group sequence")
	}
	data = data[k:]
	count, k := binary.Uvarint(data)
	if k <= 0 || count == 0 || count > uint64(len(data)) {
		return nil, 0, envErr("bad group count")
	}
	data = data[k:]
	groups := make([]string, 0, count)
	for range count {
		l, k := binary.Uvarint(data)
		if k <= 0 || l > uint64(len(data)-k) {
			return nil, 0, envErr("bad group length")
		}
		groups = append(groups, string(data[k:k+int(l)]))
		data = data[k+int(l):]
	}
	if len(data) != 0 {
		return nil, 0, envErr("bytes after the groups")
	}
	return groups, seq, nil
}

func envErr(what string) error {
	return fmt.Errorf("codec: %w: %w: %s", ErrCorrupt, ErrEnvelope, what)
}
