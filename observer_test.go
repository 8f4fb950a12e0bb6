package packcache_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// recorder is an Observer that keeps every event.
type recorder struct {
	mu     sync.Mutex
	reads  []packcache.ReadEvent
	loads  []packcache.LoadEvent
	codecs []packcache.CodecEvent
	redis  []packcache.RedisEvent
}

func (r *recorder) ObserveRead(e packcache.ReadEvent) {
	r.mu.Lock()
	r.reads = append(r.reads, e)
	r.mu.Unlock()
}
func (r *recorder) ObserveLoad(e packcache.LoadEvent) {
	r.mu.Lock()
	r.loads = append(r.loads, e)
	r.mu.Unlock()
}
func (r *recorder) ObserveCodec(e packcache.CodecEvent) {
	r.mu.Lock()
	r.codecs = append(r.codecs, e)
	r.mu.Unlock()
}
func (r *recorder) ObserveRedis(e packcache.RedisEvent) {
	r.mu.Lock()
	r.redis = append(r.redis, e)
	r.mu.Unlock()
}

func (r *recorder) outcomes(prefix string) map[packcache.ReadOutcome]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := map[packcache.ReadOutcome]int{}
	for _, e := range r.reads {
		if e.Prefix == prefix {
			m[e.Outcome]++
		}
	}
	return m
}

// TestObserverEvents: each kind of event reaches the observer with its
// prefix, codec and outcome.
func TestObserverEvents(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "stops the server")
	rdb := s.Client(t, func(o *redis.Options) { o.MaxRetries, o.DialerRetries = -1, 1 })
	ctx := ctxT(t)
	rec := &recorder{}
	c := mustNew[Channel](t, rdb, packcache.WithObserver(rec), packcache.WithCircuitBreaker(2, time.Minute), packcache.WithShareWindow(packcache.Off),
		packcache.WithPrefix("ch:", packcache.Policy{Codec: codec.LZ4}),
		packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
			switch key {
			case "ch:absent":
				return Channel{}, packcache.ErrNotFound
			case "ch:broken":
				return Channel{}, errors.New("db down")
			}
			return makeChannel(3, 8<<10), nil
		})), packcache.WithPrefix("", packcache.Policy{NegativeTTL: time.Minute}))
	if _, err := c.Get(ctx, "ch:1"); err != nil { // miss, load, encode
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "ch:1"); err != nil { // hit, decode
		t.Fatal(err)
	}
	c.Get(ctx, "ch:absent") // load: not found
	c.Get(ctx, "ch:absent") // remembered
	c.Get(ctx, "ch:broken") // load error
	c.Set(ctx, "other", Channel{ID: "small"})
	got := rec.outcomes("ch:")
	want := map[packcache.ReadOutcome]int{packcache.ReadMiss: 1, packcache.ReadHit: 1, packcache.ReadNotFound: 2, packcache.ReadError: 1}
	for o, n := range want {
		if got[o] != n {
			t.Errorf("%s reads under ch: = %d, want %d (all: %v)", o, got[o], n, got)
		}
	}
	rec.mu.Lock()
	var enc, dec, plain int
	for _, e := range rec.codecs {
		switch {
		case e.Prefix == "ch:" && e.Codec == "lz4" && !e.Decode && e.Plain > 5000 && e.Stored < e.Plain:
			enc++
		case e.Prefix == "ch:" && e.Codec == "lz4" && e.Decode && e.Plain > 5000:
			dec++
		case e.Prefix == "" && e.Codec == "none" && !e.Decode:
			plain++
		}
	}
	var ok, notFound, failed int
	for _, e := range rec.loads {
		switch {
		case e.Err == nil && e.Duration > 0:
			ok++
		case errors.Is(e.Err, packcache.ErrNotFound):
			notFound++
		case e.Err != nil:
			failed++
		}
	}
	rec.mu.Unlock()
	if enc != 1 || dec != 1 || plain != 1 {
		t.Errorf("codec events: %d lz4 encodes, %d lz4 decodes, %d plain encodes; want 1 each: %+v", enc, dec, plain, rec.codecs)
	}
	if ok != 1 || notFound != 1 || failed != 1 {
		t.Errorf("load events: %d ok, %d not found, %d failed: %+v", ok, notFound, failed, rec.loads)
	}

	// Redis down: an error, and the breaker opens; back up: it closes.
	s.Stop(t)
	c.Get(ctx, "ch:2")
	c.Get(ctx, "ch:3")
	s.Restart(t)
	rec.mu.Lock()
	var errs, opened int
	for _, e := range rec.redis {
		switch {
		case e.Breaker == "open":
			opened++
		case e.Breaker == "" && e.Err != nil && e.Prefix == "ch:":
			errs++
		}
	}
	rec.mu.Unlock()
	// The refused connection opens the breaker at once: the second Get
	// does not try Redis.
	if errs != 1 || opened != 1 {
		t.Errorf("redis events: %d errors, %d opens; want 1 and 1: %+v", errs, opened, rec.redis)
	}
}
