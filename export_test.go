package packcache

import (
	"bytes"
	"encoding/gob"
	"encoding/json"
	"time"

	"github.com/redis/go-redis/v9"
)

// Serializers the tests use that the package does not export: an
// application writes its own in a few lines.
var (
	StdJSON Serializer = jsonSerializer{}
	Gob     Serializer = gobSerializer{}
)

// jsonSerializer is a Serializer using encoding/json; the tests check that
// JSON reads what it writes. An application that relies on encoding/json's
// exact behaviour writes one like it: a Serializer is four lines.
type jsonSerializer struct{}

func (jsonSerializer) Marshal(dst []byte, v any) ([]byte, error) {
	w := appendWriter{dst}
	enc := json.NewEncoder(&w)
	if err := enc.Encode(v); err != nil {
		return dst, err
	}
	// Encoder.Encode writes into dst directly, sparing the copy that
	// json.Marshal makes, but ends the value with a newline Marshal does not.
	return w.b[:len(w.b)-1], nil
}

func (jsonSerializer) Unmarshal(data []byte, v any) error {
	// JSON text may begin with a UTF-8 byte-order mark (RFC 8259 lets a
	// parser ignore it), and other writers leave one; encoding/json does
	// not skip it.
	return json.Unmarshal(bytes.TrimPrefix(data, bom), v)
}

func (jsonSerializer) Text() bool { return true }

// ContentType names JSON's media type for Serve.
func (jsonSerializer) ContentType() string { return "application/json" }

// gobSerializer is a Serializer using encoding/gob, the tests' example of
// a binary format: every value it writes carries a header.
type gobSerializer struct{}

func (gobSerializer) Marshal(dst []byte, v any) ([]byte, error) {
	w := appendWriter{dst}
	if err := gob.NewEncoder(&w).Encode(v); err != nil {
		return dst, err
	}
	return w.b, nil
}

func (gobSerializer) Unmarshal(data []byte, v any) error {
	return gob.NewDecoder(bytes.NewReader(data)).Decode(v)
}
func (gobSerializer) Text() bool { return false }

// HoldGates keeps every update of c's near-cache gates waiting until
// release is called: it stands for a machine too loaded to run, in time,
// whatever would close them. c must have a near cache.
func HoldGates[T any](c *Cache[T]) (release func()) {
	return c.core.remote.tracker.HoldGates()
}

// SlotWaiters returns how many of c's calls wait for a connection to a
// node (see breaker.enter), over every node.
func SlotWaiters[T any](c *Cache[T]) int64 {
	return c.core.remote.nodes.Waiting()
}

// LoadsUnderWay is the number of c's loads and refreshes under way (by
// key and the state each began from), for tests that must know a load
// has ended, not only that its value is stored.
func LoadsUnderWay[T any](c *Cache[T]) int {
	return c.core.loads.Len()
}

// WithTrackedReadHook adds h to the clients of the connections a TrackKeys
// near cache reads on, as the application's hooks are on its client.
func WithTrackedReadHook(h redis.Hook) Option {
	return func(cfg *config) error {
		cfg.readHooks = append(cfg.readHooks, h)
		return nil
	}
}

// NearReceived returns how many invalidation messages naming keys c's near
// cache has received, and how many keys they named.
func NearReceived[T any](c *Cache[T]) (messages, keys uint64) {
	return c.core.remote.tracker.Received()
}

// NearExpiry returns when key's near-cache entry ends, if c's near cache
// holds one.
func NearExpiry[T any](c *Cache[T], key string) (time.Time, bool) {
	n := c.core.pols.of(key).near
	if n == nil {
		return time.Time{}, false
	}
	e, ok := n.entries.GetIfPresent(key)
	if !ok {
		return time.Time{}, false
	}
	return n.gate.Epoch().Add(time.Duration(e.expires)), true
}
