package codec

import (
	"bytes"
	"errors"
	"testing"
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
