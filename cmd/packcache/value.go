package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/packcache/packcache/codec"
)

// kind is what a stored value is, judged from its first bytes and length
// alone (FORMAT.md section 1).
type kind int

const (
	kindEmpty      kind = iota // the empty value: decodes to itself
	kindPlain                  // not framed: JSON stored verbatim
	kindFramed                 // a built-in codec: 01 none, 02 lz4, 03 snappy, 04 zstd
	kindGzip                   // 1F 8B: a gzip stream, read only
	kindTombstone              // the one-byte value 0E: "not found", remembered
	kindLease                  // 0C and a token: a load is in progress (never data, never an error)
	kindUser                   // 10-1E: a user codec, which this command does not have
	kindUnknown                // a reserved or unassigned header byte
	kindDictionary             // a key of packcache's own: a zstd dictionary, packcache:dict:<id> (FORMAT.md section 3.6)
)

// classify judges a value from its first two bytes (head, or fewer if the
// value is shorter) and its length n. With classifyKey, which knows the
// keys of packcache's own (format.go), it is the one place the command
// decides what a stored value means: inspect, stats, advise and recompress
// all call classifyKey.
//
// A lease is what packcache stores while a read-through load is in
// progress: codec.HeaderLease (0C) and an opaque token. codec.DecodeValue
// reports it as an unknown header (and FORMAT.md still lists 0C as
// reserved), so it is recognised here first.
func classify(head []byte, n int) kind {
	if n == 0 || len(head) == 0 {
		return kindEmpty
	}
	b := head[0]
	switch {
	case !codec.IsHeader(b):
		return kindPlain
	case b == codec.HeaderTombstone && n == 1:
		return kindTombstone
	case b == codec.HeaderLease:
		return kindLease
	case b == codec.HeaderGzip && len(head) > 1 && head[1] == 0x8b:
		return kindGzip
	case b >= codec.FirstUserHeader && b <= codec.LastUserHeader:
		if _, ok := codec.Lookup(b); ok {
			return kindFramed
		}
		return kindUser
	}
	if _, ok := codec.Lookup(b); ok {
		return kindFramed
	}
	return kindUnknown
}

// dictionaryKeyPrefix begins the key of every published zstd dictionary,
// packcache:dict:<id> (FORMAT.md section 3.6).
var dictionaryKeyPrefix = strings.TrimSuffix(codec.DictionaryKey(0), "00000000")

// classifyKey is classify for the value of key: a key of packcache's own,
// a published dictionary, is not a cached value whatever its bytes (a
// dictionary begins 37 A4 30 EC, which classify alone would call plain).
func classifyKey(key string, head []byte, n int) kind {
	if strings.HasPrefix(key, dictionaryKeyPrefix) {
		return kindDictionary
	}
	return classify(head, n)
}

// dictionaryCheck is what a reader of the format makes of a key under
// packcache:dict:, checked as FORMAT.md section 3.6 has readers check it.
type dictionaryCheck struct {
	id    uint32            // the id the key's name gives; 0 if it gives none
	d     *codec.Dictionary // what the key holds, parsed; nil if it is not a dictionary
	field uint32            // the Dictionary_ID field of the bytes stored (bytes 4-7)
	err   error             // why readers looking for id refuse it; nil if they use it
}

// checkDictionary checks v, the value of key, a key under packcache:dict:,
// as a reader fetching it would (dict.go's fetchDictionary): the name must
// be the id in 8 lower-case hex digits, the value a dictionary of at most
// codec.MaxDictionarySize bytes whose id is that id.
func checkDictionary(key string, v []byte) dictionaryCheck {
	var c dictionaryCheck
	if len(v) >= 8 {
		c.field = uint32(v[4]) | uint32(v[5])<<8 | uint32(v[6])<<16 | uint32(v[7])<<24
	}
	name := strings.TrimPrefix(key, dictionaryKeyPrefix)
	if n, err := strconv.ParseUint(name, 16, 32); err == nil && codec.DictionaryKey(uint32(n)) == key {
		c.id = uint32(n)
	}
	d, err := codec.ParseDictionary(v)
	if err == nil {
		c.d = d
	}
	switch {
	case c.id == 0:
		c.err = fmt.Errorf("no reader looks this key up: a dictionary's key is %s and its id in 8 lower-case hex digits", dictionaryKeyPrefix)
	case err != nil:
		c.err = fmt.Errorf("not a zstd dictionary readers accept: %w", err)
	case d.ID() != c.id:
		c.err = fmt.Errorf("holds dictionary %08x, not %08x as its name says: readers looking for %08x refuse it", d.ID(), c.id, c.id)
	}
	return c
}

// compressed reports whether values of kind k with first byte b are stored
// compressed (as opposed to plain, 01 none, or not values at all).
func compressed(k kind, b byte) bool {
	return k == kindGzip || k == kindUser || k == kindFramed && b != codec.HeaderNone
}

// kindWords holds, for every kind but kindFramed, its label in a codec mix
// and its meaning in words; for kindUser and kindUnknown both are formats
// of the header byte.
var kindWords = [...]struct{ label, meaning string }{
	kindEmpty:      {"empty", "empty value (decodes to itself)"},
	kindPlain:      {"plain", "plain: JSON stored verbatim, no header (FORMAT.md section 1, rule 2)"},
	kindGzip:       {"gzip", "gzip stream, read only (FORMAT.md section 3.5)"},
	kindTombstone:  {"tombstone", "tombstone: the source of truth has no value for this key (FORMAT.md section 2.1)"},
	kindLease:      {"lease", "lease: a load is in progress"},
	kindUser:       {"user 0x%02x", "user codec 0x%02x (FORMAT.md section 6), not registered in this command"},
	kindUnknown:    {"unknown 0x%02x", "unknown header byte 0x%02x"},
	kindDictionary: {"dictionary", "zstd dictionary: a key of packcache's own, not a cached value; values stored with header 0x05 that name its id are read with it (FORMAT.md section 3.6)"},
}

// framedMeanings says in words what the built-in formats are.
var framedMeanings = map[byte]string{
	codec.HeaderNone:     "none: payload stored uncompressed (FORMAT.md section 3.1)",
	codec.HeaderLZ4:      "lz4: size-prepended LZ4 block (FORMAT.md section 3.2)",
	codec.HeaderSnappy:   "snappy: one Snappy block (FORMAT.md section 3.3)",
	codec.HeaderZstd:     "zstd: one Zstandard frame recording its content size (FORMAT.md section 3.4)",
	codec.HeaderZstdDict: "zstd-dict: one Zstandard frame written with a dictionary it names (FORMAT.md section 3.6)",
}

// words returns w, the label or the meaning kindWords gives kind k, for a
// value with first byte b.
func words(w string, k kind, b byte) string {
	if k == kindUser || k == kindUnknown {
		return fmt.Sprintf(w, b)
	}
	return w
}

// mixLabel names a value's storage in a codec mix: plain, none, lz4,
// snappy, zstd, gzip, tombstone, lease, user 0x12, unknown 0x06, empty,
// dictionary.
func mixLabel(k kind, b byte) string {
	if k != kindFramed {
		return words(kindWords[k].label, k, b)
	}
	c, _ := codec.Lookup(b)
	return c.Name()
}

// meaning says in words what a value of kind k with first byte b is.
func meaning(k kind, b byte) string {
	if k != kindFramed {
		return words(kindWords[k].meaning, k, b)
	}
	if m, ok := framedMeanings[b]; ok {
		return m
	}
	c, _ := codec.Lookup(b)
	return fmt.Sprintf("codec %s (0x%02x)", c.Name(), b)
}

// unknownRule is FORMAT.md section 1 on every header nobody here can read.
const unknownRule = `FORMAT.md section 1: "A reader meeting an unknown header must not treat the value as plain and must not delete or overwrite it on that account: it was written by a newer or differently configured writer, and other readers may understand it."`

// headerNote quotes what FORMAT.md says about a header byte this command
// cannot decode, for a value of n bytes.
func headerNote(b byte, n int) string {
	var s string
	switch {
	case b == 0x00:
		s = `FORMAT.md section 2: 00 is "Reserved, never assigned: NUL usually means zeroed or corrupt memory."`
	case b >= 0x06 && b <= 0x08:
		s = `FORMAT.md section 7: 06-08 are reserved for "future built-in codecs"; a newer writer may use them.`
	case b == 0x0b:
		s = `FORMAT.md section 2.4: 0B is the envelope, around a value in groups or with a TTL of its own; inspect reads it.`
	case b == codec.HeaderTombstone && n > 1:
		s = `FORMAT.md section 2.1: "A value longer than one byte that begins with 0E is an unknown header."`
	case b == 0x0f:
		s = `FORMAT.md section 7: "0C, 0F: unassigned."`
	case b >= codec.FirstUserHeader && b <= codec.LastUserHeader:
		s = `FORMAT.md section 6: 10-1E are user codecs. "A reader without the codec reports an unknown header." The writer's program registers it; this command cannot decode it.`
	case b == codec.HeaderGzip:
		s = `FORMAT.md section 1, rule 6: "1F not followed by 8B, including a 1-byte value 1F" is an unknown header.`
	case b == 0x7f:
		s = `FORMAT.md section 7: 7F is the "version escape, for a future incompatible revision of this format."`
	default:
		s = fmt.Sprintf("FORMAT.md section 2 lists 0x%02x as a header byte that names no codec.", b)
	}
	return s + " " + unknownRule
}

// decodeNote explains a decode error of a value whose first byte is b, with
// what FORMAT.md says about it.
func decodeNote(err error, b byte, n, limit int) string {
	var he *codec.HeaderError
	switch {
	case errors.As(err, &he):
		return headerNote(he.Byte, n)
	case errors.Is(err, codec.ErrUnknownDictionary):
		return `FORMAT.md section 3.6: writers publish a dictionary under packcache:dict:<id> before the first value written with it. "Missing or not verified, the value is an unknown dictionary: kept, never deleted, and reported naming the id." A packcache writer still writing with the dictionary publishes it again within a minute; nothing else can bring it back, as its id is computed from its bytes.`
	case errors.Is(err, codec.ErrTooLarge):
		return fmt.Sprintf(`FORMAT.md section 4: "A reader has a limit L on the decoded size and never allocates much more than L whatever a value claims." Here L is --max-value-size, %d bytes; raise it to decode this value.`, limit)
	case errors.Is(err, codec.ErrCorrupt):
		var s string
		switch b {
		case codec.HeaderLZ4:
			s = `FORMAT.md section 3.2: the payload is N, 4 bytes little-endian, then one LZ4 block that "must decode to exactly N bytes"; it is not the LZ4 frame format (magic 04 22 4D 18).`
		case codec.HeaderSnappy:
			s = `FORMAT.md section 3.3: the payload is one Snappy block (a varint length, then elements); it is "not the framing format".`
		case codec.HeaderZstd:
			s = `FORMAT.md section 3.4: "Readers reject as corrupt: skippable frames, frames needing a dictionary, a Window_Descriptor declaring over 2 GiB (...), a Frame_Content_Size that is not exactly the decoded size, and trailing bytes."`
		case codec.HeaderZstdDict:
			s = `FORMAT.md section 3.6: "Readers reject as corrupt: a frame without Frame_Content_Size (...), without Dictionary_ID or with an id outside 32768 to 2^31 - 1, skippable frames, a Window_Descriptor over 2 GiB, a Frame_Content_Size that is not exactly the decoded size, and trailing bytes."`
		case codec.HeaderGzip:
			s = `FORMAT.md section 3.5: "Anything after the last member that is not another member is corrupt."`
		default:
			s = "FORMAT.md section 3:"
		}
		return s + ` Section 3: "A payload must be consumed exactly: bytes after the block, frame or last gzip member make the value corrupt." The value is damaged or was not written by a packcache codec.`
	}
	return ""
}
