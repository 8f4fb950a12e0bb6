package codec

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/klauspost/compress/dict"
	"github.com/klauspost/compress/zstd"
)

// MaxDictionarySize is the largest dictionary ParseDictionary accepts, in
// bytes. It is above the 110 KiB that the reference "zstd --train" writes
// by default, so that any dictionary it trains is accepted, and it bounds
// what a dictionary fetched from elsewhere can cost a reader. Small values
// need far less: on JSON records of 150-400 bytes, dictionaries of 2 to
// 8 KiB did as well as any larger one.
const MaxDictionarySize = 128 << 10

// DictionaryCompressAbove is the recommended size in bytes above which to
// compress values with a dictionary; values at or below it are better
// stored plain. It is about where zstd with a dictionary begins to store
// fewer bytes than the plain value. TestDictionaryBreakEven measures it on
// 3,000 profile and session JSON records of 30 to 400 bytes, with a 4 KiB
// dictionary trained on 500 of them and the other 2,500 written with the
// dictionary's fastest codec, by 10-byte size class, header byte counted:
// every class from 50 bytes up (from 60 with some dictionaries, as training
// is not deterministic) stored fewer bytes than plain, 0.92x at 60-69
// bytes, 0.73x at 90-99, 0.47x at 250-259; below 50 the frame's 11 bytes of
// header and checksum outweigh what the dictionary saves, 1.2x at 40-49. On objects of 40 to 400 bytes from public JSON documents
// (TestDictionaryCorpus) it was 40 to 80 bytes. Zstd without a dictionary
// breaks even only at about 250 bytes on the same records. A writer that
// keeps values plain when compression saves too little (packcache's
// MinSaving) loses nothing but the time of compressing by setting the
// threshold a little low.
const DictionaryCompressAbove = 64

var (
	// ErrUnknownDictionary reports a value written with a dictionary
	// (header byte HeaderZstdDict) that the reader was not given. The
	// value is well formed as far as can be told without the dictionary;
	// a reader that finds the dictionary can decode it. Errors returned
	// for it are *DictionaryError values naming the dictionary.
	ErrUnknownDictionary = errors.New("unknown zstd dictionary")

	// ErrInvalidDictionary reports bytes that are not a Zstandard
	// dictionary ParseDictionary accepts.
	ErrInvalidDictionary = errors.New("invalid zstd dictionary")
)

// A DictionaryError reports a value written with a dictionary the decoder
// was not given.
type DictionaryError struct {
	ID    uint32 // the id of the dictionary the value was written with
	Given uint32 // the id of the dictionary the decoder was given instead, or 0 for none
}

func (e *DictionaryError) Error() string {
	if e.Given != 0 {
		return fmt.Sprintf("codec: value needs zstd dictionary %08x, given %08x", e.ID, e.Given)
	}
	return fmt.Sprintf("codec: value needs zstd dictionary %08x", e.ID)
}

// Is reports whether target is ErrUnknownDictionary.
func (e *DictionaryError) Is(target error) bool { return target == ErrUnknownDictionary }

// A Dictionary is a parsed Zstandard dictionary (RFC 8878, section 5) and
// the encoders and decoder that use it. It is safe for concurrent use by
// multiple goroutines.
//
// Its id names it in every value written with it. The id is computed from
// the dictionary's bytes (see FORMAT.md), so a dictionary fetched from
// elsewhere is verified by parsing it and comparing its ID with the one a
// value names.
//
// A Dictionary makes its encoders for a level on the first Encode at that
// level, and its decoder on the first decode, and keeps them for as long as
// it is reachable. Encoding with it costs more memory than Zstd: measured at
// the fastest level, 1.3 MiB for each goroutine encoding at once (at most
// GOMAXPROCS), against 0.6 MiB, as an encoder with a dictionary keeps a
// history of its window however small the value. Values over 128 KiB use
// a second encoder, with Zstd's window, which takes about 9 MiB each, as
// Zstd's own encoder does for such values. The decoder takes about 50 KiB
// and the buffers of the values it decodes. Parse each dictionary once and
// keep the *Dictionary.
type Dictionary struct {
	id     uint32
	b      []byte // the dictionary with its Dictionary_ID field set to id
	codecs [len(zstdSpeeds)]zstdCodec

	dec struct {
		once sync.Once
		dec  *zstd.Decoder
		err  error
	}
}

// zstdDictMagic begins every Zstandard dictionary, 0xEC30A437 little-endian.
const zstdDictMagic = "\x37\xa4\x30\xec"

// ParseDictionary parses b, a Zstandard dictionary such as TrainDictionary
// or "zstd --train" writes, and returns it ready for use. It does not keep
// b. Bytes that are not a valid dictionary, or more than MaxDictionarySize
// of them, return an error matching ErrInvalidDictionary.
//
// The dictionary's id is computed from b. If b's own Dictionary_ID field
// (bytes 4 to 7) holds another number, as in a dictionary from "zstd
// --train", the Dictionary's Bytes have it replaced by the id, as the
// frames written with it name the id.
func ParseDictionary(b []byte) (*Dictionary, error) {
	if len(b) > MaxDictionarySize {
		return nil, fmt.Errorf("codec: %w: %d bytes, over MaxDictionarySize (%d)", ErrInvalidDictionary, len(b), MaxDictionarySize)
	}
	if len(b) < 8 || string(b[:4]) != zstdDictMagic {
		return nil, fmt.Errorf("codec: %w: no dictionary magic number", ErrInvalidDictionary)
	}
	if _, err := zstd.InspectDictionary(b); err != nil {
		return nil, fmt.Errorf("codec: %w: %w", ErrInvalidDictionary, err)
	}
	d := &Dictionary{id: dictionaryID(b), b: bytes.Clone(b)}
	binary.LittleEndian.PutUint32(d.b[4:], d.id)
	for i := range d.codecs {
		d.codecs[i].level = zstdSpeeds[i]
		d.codecs[i].dict = d
	}
	return d, nil
}

// dictionaryID returns the id of dictionary b: the first 4 bytes of the
// SHA-256 of b after its Dictionary_ID field, read as a little-endian
// number, brought into 32768 to 2^31-1, the range RFC 8878 leaves to
// private use. Leaving the field out of the hash lets it hold the id.
func dictionaryID(b []byte) uint32 {
	sum := sha256.Sum256(b[8:])
	return firstDictionaryID + binary.LittleEndian.Uint32(sum[:4])%(endDictionaryID-firstDictionaryID)
}

// Dictionary ids are from firstDictionaryID to endDictionaryID-1.
const (
	firstDictionaryID = 1 << 15
	endDictionaryID   = 1 << 31
)

// validDictionaryID reports whether a dictionary can have id. A frame
// naming any other was not written by this format's rules.
func validDictionaryID(id uint32) bool {
	return id >= firstDictionaryID && id < endDictionaryID
}

// ID returns the dictionary's id, which values written with it carry. It
// is from 32768 to 2^31-1.
func (d *Dictionary) ID() uint32 { return d.id }

// Bytes returns a copy of the dictionary in the Zstandard dictionary
// format, its Dictionary_ID field holding its id: the bytes to publish
// for other readers, and the file "zstd -D" reads values with.
func (d *Dictionary) Bytes() []byte { return bytes.Clone(d.b) }

// Codec returns the codec that compresses with the dictionary at the
// standard zstd compression level nearest to level, as ZstdLevel does: its
// header byte is HeaderZstdDict and its payload one Zstandard frame that
// records its content size and names the dictionary. Its Decode reads
// frames written with this dictionary at any level; a frame naming another
// dictionary returns a *DictionaryError. Each level returns the same Codec
// on every call.
//
// Measured on records of 150 to 400 bytes (BenchmarkDict, interleaved,
// medians), the fastest level (1 and 2) stores them at 0.47x plain in about
// 9 µs a value, where Zstd takes 1.4 µs to store them at 0.94x; they decode
// in about 1.3 µs, Zstd's in 0.6 µs. The time goes to restoring the
// dictionary's state for each value.
//
// WARNING: levels 10 and above, ZstdBest's speed, copy the encoder's
// 34 MiB of tables for every value they compress with a dictionary: about
// 2 ms a value, even for a few bytes, 12 times as long as without one. Use
// them only for values written rarely.
func (d *Dictionary) Codec(level int) Codec {
	return &d.codecs[zstdSpeed(level)]
}

func (d *Dictionary) decoder() (*zstd.Decoder, error) {
	d.dec.once.Do(func() {
		d.dec.dec, d.dec.err = newZstdAllDecoder(zstd.WithDecoderDicts(d.b))
	})
	return d.dec.dec, d.dec.err
}

// DictionaryKey returns the Redis key under which the dictionary with the
// given id is published, "packcache:dict:" and the id in 8 lower-case hex
// digits (FORMAT.md, section 3.6). The key's value is the dictionary's
// Bytes, with no expiry: a reader meeting a value whose dictionary it does
// not have fetches the key, parses what it gets with ParseDictionary and
// uses it only if its ID is the id it looked for.
func DictionaryKey(id uint32) string {
	return fmt.Sprintf("packcache:dict:%08x", id)
}

// Bounds of TrainDictionary.
const (
	// minDictionarySize is the reference trainer's least size
	// (ZDICT_DICTSIZE_MIN): below it the entropy tables leave no room
	// for content.
	minDictionarySize = 256

	// minTrainSamples is the fewest samples TrainDictionary trains on, as
	// the reference trainer's (COVER) least: a dictionary holds what
	// samples share, and of fewer there is little to tell shared from
	// particular.
	minTrainSamples = 5

	// maxTrainSample is how much of each sample is used, as builddict
	// does: the builder learns from the start of a sample, and large
	// samples would cost memory and time for nothing.
	maxTrainSample = 32 << 10
)

// TrainDictionary trains a Zstandard dictionary of at most size bytes on
// samples, values like the ones it is to compress, with klauspost/compress's
// builder (github.com/klauspost/compress/dict). It returns the dictionary's
// bytes, for ParseDictionary, with its Dictionary_ID field holding its id,
// readable by the reference zstd (1.5.5 and earlier too).
//
// size must be from 256 to MaxDictionarySize; for values under 1 KiB, 2 to
// 8 KiB is enough. There must be at least 5 samples of 8 bytes or more; a
// few hundred give a good dictionary. Only the first 32 KiB of each sample
// are used. Samples with nothing in common return an error.
//
// Training is not deterministic: two dictionaries trained on the same
// samples may differ, and so have different ids.
func TrainDictionary(samples [][]byte, size int) ([]byte, error) {
	if size < minDictionarySize || size > MaxDictionarySize {
		return nil, fmt.Errorf("codec: TrainDictionary: size %d is not from %d to MaxDictionarySize (%d)", size, minDictionarySize, MaxDictionarySize)
	}
	in := make([][]byte, 0, len(samples))
	for _, s := range samples {
		if len(s) >= 8 { // the builder skips shorter ones
			in = append(in, s[:min(len(s), maxTrainSample)])
		}
	}
	if len(in) < minTrainSamples {
		return nil, fmt.Errorf("codec: TrainDictionary: %d samples of 8 bytes or more, want at least %d", len(in), minTrainSamples)
	}
	// The builder's size is that of the content; the entropy tables, a
	// few hundred bytes, come on top. Asking again for less by the excess,
	// and a margin, meets size, as the tables change little.
	want := size
	for try := range 4 {
		b, err := dict.BuildZstdDict(in, dict.Options{
			MaxDictSize: want,
			HashBytes:   6,       // builddict's default; 4 to 8 did no better on JSON records
			ZstdDictID:  1 << 15, // any fixed one: ParseDictionary replaces it
			// The dictionary is readable by the reference zstd of
			// Debian 12 (1.5.4) and other older ones.
			ZstdDictCompat: true,
			// Tables suited to Zstd, the default codec.
			ZstdLevel: zstd.SpeedFastest,
		})
		if err != nil {
			return nil, fmt.Errorf("codec: TrainDictionary: %w", err)
		}
		if len(b) <= size {
			d, err := ParseDictionary(b)
			if err != nil {
				return nil, fmt.Errorf("codec: TrainDictionary: the builder wrote a dictionary that does not parse: %w", err)
			}
			return d.b, nil
		}
		want -= len(b) - size + 32*try
		if want < 1 {
			break
		}
	}
	return nil, fmt.Errorf("codec: TrainDictionary: no dictionary of at most %d bytes", size)
}

// zstdDictName is the name of the dictionary format and of its codecs.
const zstdDictName = "zstd-dict"

// zstdDictFormat is the registry's codec for HeaderZstdDict: the format
// without any dictionary. It cannot encode, and its Decode checks what can
// be checked without the dictionary and returns a *DictionaryError naming
// it, so that DecodeValue reports a well-formed value as needing its
// dictionary, not as an unknown header or corrupt.
type zstdDictFormat struct{}

func (zstdDictFormat) ID() byte     { return HeaderZstdDict }
func (zstdDictFormat) Name() string { return zstdDictName }

func (zstdDictFormat) Encode(dst, src []byte) ([]byte, error) {
	return dst, errors.New("codec zstd-dict: no dictionary: encode with Dictionary.Codec")
}

func (zstdDictFormat) Decode(dst, src []byte, limit int) ([]byte, error) {
	return decodeZstdDict(dst, src, limit, nil)
}

// decodeZstdDict decodes src, the payload of a HeaderZstdDict value, with
// d, which may be nil. Every check that needs no dictionary comes first, so
// that a value is reported as needing its dictionary only if it could
// decode with it: it is one frame, names a dictionary, records a size
// within limit and its blocks can hold it.
func decodeZstdDict(dst, src []byte, limit int, d *Dictionary) ([]byte, error) {
	limit = clampLimit(limit)
	h, most, err := zstdFrame(src, zstdDictName)
	if err != nil {
		return dst, err
	}
	if h.DictionaryID == 0 {
		return dst, corruptf(zstdDictName, "frame names no dictionary")
	}
	if !validDictionaryID(h.DictionaryID) {
		return dst, corruptf(zstdDictName, "frame names dictionary %d, which no dictionary's contents give", h.DictionaryID)
	}
	if !h.HasFCS {
		return dst, corruptf(zstdDictName, "frame without its content size")
	}
	if err := zstdCheckSize(&h, most, limit, zstdDictName); err != nil {
		return dst, err
	}
	if d == nil || d.id != h.DictionaryID {
		e := &DictionaryError{ID: h.DictionaryID}
		if d != nil {
			e.Given = d.id
		}
		return dst, e
	}
	dec, err := d.decoder()
	if err != nil {
		return dst, fmt.Errorf("codec zstd-dict: %w", err)
	}
	return decodeZstdAll(dst, src, dec, &h, zstdDictName)
}

// appendZstdEmptyDictFrame appends the frame of an empty input naming
// dictionary id, as the reference encoder writes it: single segment,
// content size 0, one empty last Raw_Block, no checksum.
func appendZstdEmptyDictFrame(dst []byte, id uint32) []byte {
	dst = append(dst, 0x28, 0xb5, 0x2f, 0xfd)
	if id < 1<<16 {
		dst = binary.LittleEndian.AppendUint16(append(dst, 0x20|2), uint16(id))
	} else {
		dst = binary.LittleEndian.AppendUint32(append(dst, 0x20|3), id)
	}
	return append(dst, 0x00, 0x01, 0x00, 0x00)
}

// DictionaryID reports the id of the dictionary that value, a stored
// value, was written with, and whether it was written with one: its header
// byte is HeaderZstdDict and its frame header names a dictionary by an id a
// dictionary can have. It reads only the frame header: the rest of the
// value may still be corrupt.
func DictionaryID(value []byte) (id uint32, ok bool) {
	if len(value) == 0 || value[0] != HeaderZstdDict {
		return 0, false
	}
	var h zstd.Header
	if err := h.Decode(value[1:]); err != nil || h.Skippable || !validDictionaryID(h.DictionaryID) {
		return 0, false
	}
	return h.DictionaryID, true
}

// DecodeValueDict decodes a stored value as DecodeValue does, using d, if
// not nil, for a value written with a dictionary.
//
// A value written with a dictionary other than d returns a
// *DictionaryError matching ErrUnknownDictionary that names the value's
// dictionary and d's. A reader that may meet values of several
// dictionaries, as during a rotation, finds the one a value needs with
// DictionaryID first. Every limit of DecodeValue holds, and a value over
// limit is refused as ErrTooLarge whether or not d is its dictionary.
func DecodeValueDict(dst, value []byte, limit int, d *Dictionary) ([]byte, error) {
	if d != nil && len(value) > 0 && value[0] == HeaderZstdDict {
		return decodeZstdDict(dst, value[1:], limit, d)
	}
	return DecodeValue(dst, value, limit)
}
