package codec

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
)

// reverseCodec is a user codec for the tests: its payload is the input
// reversed, which no built-in could decode by accident.
type reverseCodec struct{ id byte }

func (c reverseCodec) ID() byte     { return c.id }
func (c reverseCodec) Name() string { return "reverse" }

func (c reverseCodec) Encode(dst, src []byte) ([]byte, error) {
	start := len(dst)
	dst = append(dst, src...)
	slices.Reverse(dst[start:])
	return dst, nil
}

func (c reverseCodec) Decode(dst, src []byte, limit int) ([]byte, error) {
	if len(src) > limit {
		return dst, ErrTooLarge
	}
	return c.Encode(dst, src)
}

// The registry is global and has no Unregister, so the test codec is
// registered once per process, which keeps -count=N working.
var registerTestCodec = sync.OnceValue(func() error {
	return Register(reverseCodec{0x1e})
})

func TestRegister(t *testing.T) {
	if err := registerTestCodec(); err != nil {
		t.Fatalf("Register at 0x1e: %v", err)
	}
	c, ok := Lookup(0x1e)
	if !ok || c != (reverseCodec{0x1e}) {
		t.Fatalf("Lookup(0x1e) = %v, %v", c, ok)
	}
	v := mustAppendValue(t, reverseCodec{0x1e}, []byte(`{"a":1}`))
	if !bytes.Equal(v, []byte("\x1e}1:\"a\"{")) {
		t.Fatalf("AppendValue = %q", v)
	}
	out, err := DecodeValue(nil, v, 100)
	if err != nil || string(out) != `{"a":1}` {
		t.Fatalf("DecodeValue = %q, %v", out, err)
	}

	tests := []struct {
		c    Codec
		want string
	}{
		{nil, "nil"},
		{reverseCodec{0x1e}, "0x1e is taken"},
		{reverseCodec{0x00}, "0x00 is reserved"},
		{reverseCodec{0x05}, "0x05 is reserved"},
		{reverseCodec{0x0f}, "0x0f is reserved"},
		{reverseCodec{0x1f}, "0x1f is reserved"},
		{reverseCodec{0x7f}, "0x7f is reserved"},
		{reverseCodec{'{'}, "0x7b is reserved"},
		{LZ4, "0x02 is reserved"},
		{Zstd, "0x04 is reserved"},
	}
	for _, tt := range tests {
		err := Register(tt.c)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Register(%v) = %v, want an error with %q", tt.c, err, tt.want)
		}
	}
}

func TestLookupBuiltins(t *testing.T) {
	for id, want := range map[byte]Codec{0x01: None, 0x02: LZ4, 0x03: Snappy, 0x04: Zstd} {
		if c, ok := Lookup(id); !ok || c != want {
			t.Errorf("Lookup(%#x) = %v, %v", id, c, ok)
		}
	}
	// The dictionary format is built in, though no codec writes it
	// without a dictionary.
	if c, ok := Lookup(HeaderZstdDict); !ok || c.ID() != HeaderZstdDict || c.Name() != "zstd-dict" {
		t.Errorf("Lookup(%#x) = %v, %v", HeaderZstdDict, c, ok)
	}
	for _, id := range []byte{0x00, 0x06, 0x0b, 0x10, 0x1f, 0x7f, '{'} {
		if c, ok := Lookup(id); ok {
			t.Errorf("Lookup(%#x) = %v", id, c)
		}
	}
}

func TestAppendValueUnregistered(t *testing.T) {
	if _, err := AppendValue(nil, reverseCodec{0x1d}, []byte("x")); err == nil {
		t.Errorf("AppendValue with an unregistered codec succeeded")
	}
	if _, err := AppendValue(nil, nil, []byte("x")); err == nil {
		t.Errorf("AppendValue with a nil codec succeeded")
	}
	var he *HeaderError
	if _, err := DecodeValue(nil, []byte{0x1d, 'x'}, 10); !errors.As(err, &he) || he.Byte != 0x1d {
		t.Errorf("unregistered user byte: %v, want a *HeaderError", err)
	}
}

// TestRegisterConcurrent looks codecs up while another goroutine
// registers; with -race it checks lookups need no lock.
func TestRegisterConcurrent(t *testing.T) {
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 1000 {
				if c, ok := Lookup(HeaderZstd); !ok || c != Zstd {
					t.Error("lost a built-in codec")
					return
				}
				Lookup(0x1e)
			}
		})
	}
	wg.Go(func() { registerTestCodec() })
	wg.Wait()
}
