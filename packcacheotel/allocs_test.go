package packcacheotel_test

import (
	"io"
	"testing"
	"time"

	"github.com/packcache/packcache"
)

// TestNoAllocs: once an event's attributes have been seen, recording it
// allocates nothing, with the OpenTelemetry SDK behind the observer.
func TestNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	o, _ := newObserver(t)
	read := packcache.ReadEvent{Prefix: "ch:", Outcome: packcache.ReadHit}
	load := packcache.LoadEvent{Prefix: "ch:", Keys: 1, Duration: 3 * time.Millisecond}
	enc := packcache.CodecEvent{Prefix: "ch:", Codec: "zstd", Plain: 131072, Stored: 20000, Duration: 200 * time.Microsecond}
	dec := enc
	dec.Decode = true
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"read", func() { o.ObserveRead(read) }},
		{"load", func() { o.ObserveLoad(load) }},
		{"encode", func() { o.ObserveCodec(enc) }},
		{"decode", func() { o.ObserveCodec(dec) }},
		{"breaker", func() { o.ObserveRedis(packcache.RedisEvent{Node: "h:1", Breaker: "open"}) }},
		// A network error is classified without errors.As. (An error
		// reply or a net.Error costs an allocation to classify.)
		{"redis error", func() { o.ObserveRedis(packcache.RedisEvent{Prefix: "ch:", Node: "h:1", Err: io.EOF}) }},
		{"serve", func() {
			o.(packcache.ServeObserver).ObserveServe(packcache.ServeEvent{Prefix: "ch:", Status: 200, Coding: "zstd", Bytes: 24000})
		}},
	} {
		c.f() // the first event of its kind builds its attribute sets
		if n := testing.AllocsPerRun(1000, c.f); n != 0 {
			t.Errorf("%s: %v allocations per event, want 0", c.name, n)
		}
	}
}
