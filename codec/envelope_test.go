package codec

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// The envelope's golden files (FORMAT.md, sections 2.4 and 8), pinned in
// goldenFiles with the others: written once with -update, never changed.
var goldenEnvelopes = map[string]struct {
	env   Envelope
	inner string // golden file it holds; "" for the tombstone
}{
	"small.groups.bin":      {Envelope{Groups: []string{"user:42"}, Seq: 300}, "small.plain.bin"},
	"small.groups-zstd.bin": {Envelope{Groups: []string{"user:42", "tenant:7"}, Seq: 300, TTL: 2 * time.Second}, "small.zstd.bin"},
	"notfound.groups.bin":   {Envelope{Groups: []string{"user:42"}, Seq: 1}, ""},
}

func TestGoldenEnvelope(t *testing.T) {
	for name, g := range goldenEnvelopes {
		inner := []byte{HeaderTombstone}
		if g.inner != "" {
			inner = readGolden(t, g.inner)
		}
		if *update {
			b, err := AppendEnvelope(nil, g.env, inner)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(goldenDir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		v := readGolden(t, name)
		if _, ok := goldenFiles[name]; !ok {
			t.Errorf("%s is not pinned in goldenFiles", name)
		}
		e, in, err := ParseEnvelope(v)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(e, g.env) || !bytes.Equal(in, inner) {
			t.Errorf("%s: %+v %q, want %+v %q", name, e, in, g.env, inner)
		}
		// A reader that predates envelopes: an unknown header, never
		// corrupt, never plain.
		if _, err := DecodeValue(nil, v, 1<<20); !errors.Is(err, ErrUnknownHeader) || errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: DecodeValue: %v, want ErrUnknownHeader", name, err)
		}
	}
}

func TestEnvelopeMalformed(t *testing.T) {
	good, _ := AppendEnvelope(nil, Envelope{Groups: []string{"g"}, Seq: 5, TTL: time.Second}, []byte(`{}`))
	for i := 1; i < len(good)-2; i++ {
		if _, _, err := ParseEnvelope(good[:i]); err == nil {
			t.Errorf("truncated to %d bytes: no error", i)
		}
	}
	for _, bad := range [][]byte{
		{0x0b},
		{0x0b, 0x05, 0x01},
		{0x0b, 0x00, 0x0c, 1, 2},                  // a lease inside
		{0x0b, 0x00, 0x0b, 0x00},                  // an envelope inside
		{0x0b, 0x03, 0x02, 0x01, 0x00, '{', '}'},  // TTL 0
		{0x0b, 0x03, 0x01, 0x01, 0x05, '{', '}'},  // no group count
		{0x0b, 0x04, 0x02, 0x01, 0x01, 0x02, '1'}, // TTL twice... truncated second
	} {
		if _, _, err := ParseEnvelope(bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("% x: %v, want ErrCorrupt", bad, err)
		}
	}
	// A field a newer writer added: an unknown header, not corrupt.
	if _, _, err := ParseEnvelope([]byte{0x0b, 0x02, 0x7e, 0x00, '1'}); !errors.Is(err, ErrUnknownHeader) || errors.Is(err, ErrCorrupt) {
		t.Errorf("unknown field: %v, want ErrUnknownHeader", err)
	}
}

func FuzzParseEnvelope(f *testing.F) {
	good, _ := AppendEnvelope(nil, Envelope{Groups: []string{"user:42", ""}, Seq: 9, TTL: time.Minute}, []byte{HeaderTombstone})
	f.Add(good)
	f.Fuzz(func(t *testing.T, v []byte) {
		e, inner, err := ParseEnvelope(v)
		if err != nil {
			return
		}
		again, err := AppendEnvelope(nil, e, inner)
		if err != nil {
			t.Fatal(err)
		}
		e2, inner2, err := ParseEnvelope(again)
		if err != nil || !reflect.DeepEqual(e, e2) || !bytes.Equal(inner, inner2) {
			t.Fatalf("round trip: %v %+v %+v", err, e, e2)
		}
	})
}
