package codec

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// builtins is the table every reader starts from. It is a composite
// literal, not filled in by init, so the built-in codecs are there before
// any code that could look them up runs, whatever the order of package
// initialization.
var builtins = [256]Codec{
	HeaderNone:   None,
	HeaderLZ4:    LZ4,
	HeaderSnappy: Snappy,
	HeaderZstd:   Zstd,

	// The format, not a codec that can write it: values of it decode
	// only with their dictionary (DecodeValueDict), and are written with
	// Dictionary.Codec.
	HeaderZstdDict: zstdDictFormat{},
}

// registry holds the table once a codec has been registered. Lookups read
// it with one atomic load; Register copies it, so a table once published
// never changes.
var registry struct {
	mu    sync.Mutex // serializes Register
	table atomic.Pointer[[256]Codec]
}

func table() *[256]Codec {
	if t := registry.table.Load(); t != nil {
		return t
	}
	return &builtins
}

// Lookup returns the codec that header byte id names, if any. The gzip
// header byte 0x1f names no codec: DecodeValue reads gzip streams itself.
func Lookup(id byte) (Codec, bool) {
	c := table()[id]
	return c, c != nil
}

// Register makes c the codec for its header byte, c.ID(), which must be
// from FirstUserHeader to LastUserHeader and not already registered. It is
// safe to call from init functions and concurrently with lookups.
//
// A value written with a codec can only be read where the codec is
// registered, so every reader must register it before any writer uses it.
// A header byte, once used for stored values, must keep naming the same
// format for as long as any such value may exist.
func Register(c Codec) error {
	if c == nil {
		return fmt.Errorf("codec: Register of nil Codec")
	}
	id := c.ID()
	if id < FirstUserHeader || id > LastUserHeader {
		return fmt.Errorf("codec: cannot register %q: header byte 0x%02x is reserved; user codecs take 0x%02x to 0x%02x",
			c.Name(), id, FirstUserHeader, LastUserHeader)
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	old := table()
	if prev := old[id]; prev != nil {
		return fmt.Errorf("codec: cannot register %q: header byte 0x%02x is taken by %q", c.Name(), id, prev.Name())
	}
	t := *old
	t[id] = c
	registry.table.Store(&t)
	return nil
}
