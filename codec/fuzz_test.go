package codec

import (
	"bytes"
	"errors"
	"testing"

	"github.com/klauspost/compress/zstd"
)

const fuzzLimit = 1 << 20

// FuzzDecodeValue feeds arbitrary values to DecodeValue: it must never
// panic, fail only with the documented errors, never produce more than the
// limit, and give the same answer whatever dst it appends to.
func FuzzDecodeValue(f *testing.F) {
	f.Add([]byte(`{"a":1}`))
	f.Add([]byte{0x1f, 0x8b})
	f.Add([]byte{0x02, 0xff, 0xff, 0xff, 0xff, 0x00})
	f.Add([]byte{0x03, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add(append([]byte{HeaderZstd}, zstdRLEFrame(1<<30, -1, 0x68)...))
	f.Fuzz(func(t *testing.T, value []byte) {
		out, err := DecodeValue(nil, value, fuzzLimit)
		if err != nil {
			if !isSentinel(err) {
				t.Fatalf("undocumented error: %v", err)
			}
			var he *HeaderError
			if errors.Is(err, ErrUnknownHeader) && (!errors.As(err, &he) || he.Byte != value[0]) {
				t.Fatalf("ErrUnknownHeader without a *HeaderError naming 0x%02x: %v", value[0], err)
			}
			if len(value) > 0 && !IsHeader(value[0]) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("plain value failed: %v", err)
			}
			return
		}
		if len(out) > fuzzLimit {
			t.Fatalf("decoded %d bytes, limit %d", len(out), fuzzLimit)
		}
		if len(value) == 0 || Plain(value) {
			if !bytes.Equal(out, value) {
				t.Fatalf("plain value not returned as is")
			}
			return
		}

		prefix := []byte("prefix")
		out2, err := DecodeValue(bytes.Clone(prefix), value, fuzzLimit)
		if err != nil {
			t.Fatalf("decodes with nil dst but not after a prefix: %v", err)
		}
		if !bytes.Equal(out2[:len(prefix)], prefix) || !bytes.Equal(out2[len(prefix):], out) {
			t.Fatalf("decoding after a prefix gave different bytes")
		}
		if len(out) > 0 {
			if _, err := DecodeValue(nil, value, len(out)-1); !errors.Is(err, ErrTooLarge) {
				t.Fatalf("limit one under the size %d: %v, want ErrTooLarge", len(out), err)
			}
		}

		for _, c := range []Codec{None, LZ4} {
			v := mustAppendValue(t, c, out)
			back, err := DecodeValue(nil, v, len(out))
			if err != nil || !bytes.Equal(back, out) {
				t.Fatalf("re-encoding with %s: %v", c.Name(), err)
			}
		}
	})
}

var fuzzCodecs = []Codec{None, LZ4, LZ4HC, Snappy, Zstd, ZstdDefault, ZstdBetter, ZstdBest, LZ4Level(4)}

// FuzzRoundTrip encodes arbitrary data with the codec which selects, and
// checks it decodes back exactly, with a limit of its size and not one less.
func FuzzRoundTrip(f *testing.F) {
	for i := range fuzzCodecs {
		f.Add([]byte{}, byte(i))
		f.Add([]byte("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"), byte(i))
	}
	f.Fuzz(func(t *testing.T, data []byte, which byte) {
		c := fuzzCodecs[int(which)%len(fuzzCodecs)]
		v := mustAppendValue(t, c, data)
		out, err := DecodeValue(nil, v, len(data))
		if err != nil {
			t.Fatalf("%s: %v", codecLabel(c), err)
		}
		if !bytes.Equal(out, data) {
			t.Fatalf("%s: round trip changed the data", codecLabel(c))
		}
		if len(data) > 0 {
			if _, err := DecodeValue(nil, v, len(data)-1); !errors.Is(err, ErrTooLarge) {
				t.Fatalf("%s: limit one under: %v, want ErrTooLarge", codecLabel(c), err)
			}
		}
	})
}

// FuzzDictionaryDecode decodes arbitrary frames with arbitrary
// dictionaries, as a hostile source could publish both: a dictionary
// either is refused as ErrInvalidDictionary or, renamed into the frame,
// decodes it without panicking, failing only with the documented errors,
// never past the limit, and the same whatever dst it appends to. It does
// not encode: an encoder per dictionary would cost each input far more
// than the decoding (TestDictionaryHostile encodes with damaged ones).
func FuzzDictionaryDecode(f *testing.F) {
	good := readGolden(f, goldenDictFile)
	for _, g := range goldenValues() {
		if g.format == "zstd-dict" {
			f.Add(good, readGolden(f, g.file)[1:])
		}
	}
	f.Add(good, withDictID(zstdRLEFrame(1<<30, 1<<30, 0x68), 1))
	f.Add(good, withDictID(zstdRLEFrame(1<<30, 1000, 0x68), 1))
	f.Add(good[:200], []byte{0x28, 0xb5, 0x2f, 0xfd, 0x23, 1, 0, 0, 0, 0, 1, 0, 0})
	f.Add(append([]byte(zstdDictMagic), 1, 0, 0, 0, 0, 0, 0), []byte{})
	f.Fuzz(func(t *testing.T, dictBytes, frame []byte) {
		d, err := ParseDictionary(dictBytes)
		if err != nil {
			if !errors.Is(err, ErrInvalidDictionary) {
				t.Fatalf("ParseDictionary: undocumented error %v", err)
			}
			return
		}
		// Values naming the dictionary are what matters; others are
		// refused before it is used.
		var h zstd.Header
		if h.Decode(frame) == nil && !h.Skippable && (zstdDictIDSize(frame[4]) == 4 || zstdDictIDSize(frame[4]) == 2 && d.ID() < 1<<16) {
			frame = bytes.Clone(frame)
			setDictID(t, frame, d.ID())
		}
		value := append([]byte{HeaderZstdDict}, frame...)
		out, err := DecodeValueDict(nil, value, fuzzLimit, d)
		if err != nil {
			if !isSentinel(err) {
				t.Fatalf("undocumented error: %v", err)
			}
			return
		}
		if len(out) > fuzzLimit {
			t.Fatalf("decoded %d bytes, limit %d", len(out), fuzzLimit)
		}
		prefix := []byte("prefix")
		out2, err := DecodeValueDict(bytes.Clone(prefix), value, fuzzLimit, d)
		if err != nil || !bytes.Equal(out2[:len(prefix)], prefix) || !bytes.Equal(out2[len(prefix):], out) {
			t.Fatalf("decoding after a prefix gave another result: %v", err)
		}
		if len(out) > 0 {
			if _, err := DecodeValueDict(nil, value, len(out)-1, d); !errors.Is(err, ErrTooLarge) {
				t.Fatalf("limit one under the size %d: %v, want ErrTooLarge", len(out), err)
			}
		}
	})
}

// FuzzDictionaryRoundTrip encodes arbitrary data with the golden
// dictionary at the level which selects, and checks it decodes back
// exactly with the dictionary, within a limit of its size and not one
// less, and without it only to a *DictionaryError naming it. The best
// level, which takes milliseconds a value with a dictionary, is left to
// TestDictionaryRoundTrip.
func FuzzDictionaryRoundTrip(f *testing.F) {
	d := goldenDictionary(f)
	f.Add([]byte{}, byte(0))
	f.Add([]byte(`{"user":"alice","text":"hello hello hello hello"}`), byte(0))
	f.Add(readGolden(f, "record.json"), byte(1))
	f.Add(chatDoc(3), byte(2))
	f.Add(randomBytes(300, 4), byte(3))
	f.Fuzz(func(t *testing.T, data []byte, which byte) {
		c := &d.codecs[int(which)%(len(d.codecs)-1)]
		v := mustAppendValue(t, c, data)
		out, err := DecodeValueDict(nil, v, len(data), d)
		if err != nil || !bytes.Equal(out, data) {
			t.Fatalf("%v: round trip: %v", c.level, err)
		}
		if len(data) > 0 {
			if _, err := DecodeValueDict(nil, v, len(data)-1, d); !errors.Is(err, ErrTooLarge) {
				t.Fatalf("%v: limit one under: %v, want ErrTooLarge", c.level, err)
			}
		}
		var de *DictionaryError
		if _, err := DecodeValue(nil, v, len(data)); !errors.As(err, &de) || de.ID != d.ID() {
			t.Fatalf("%v: without the dictionary: %v", c.level, err)
		}
	})
}
