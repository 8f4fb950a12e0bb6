package packcache_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
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

// TestCountersAddUp runs a mixed workload (hits, misses, loads that fail,
// find nothing, say DoNotCache or are too large, writes racing loads,
// stale values, batches, the near cache) and checks the identities Stats
// documents, and the counts the test can make itself.
func TestCountersAddUp(t *testing.T) {
	t.Parallel()
	redistest.RequireServer(t, "the near cache needs CLIENT TRACKING")
	s := redistest.Start(t)
	rdb := s.Client(t)
	ctx := ctxT(t)
	var loaderCalls atomic.Int64
	ld := packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
		loaderCalls.Add(1)
		switch {
		case strings.Contains(key, "err:"):
			return "", errors.New("source down")
		case strings.HasPrefix(key, "none:"):
			return "", packcache.ErrNotFound
		case strings.HasPrefix(key, "partial:"):
			return "partial", packcache.DoNotCache
		case strings.HasPrefix(key, "big:"):
			return strings.Repeat("x", 2048), nil
		}
		return "v:" + key, nil
	})
	c, err := packcache.New[string](rdb, packcache.WithLoader[string](ld), packcache.WithMaxValueSize(1024),
		packcache.WithTTL(time.Minute), packcache.WithPrefix("near:", packcache.Policy{}),
		packcache.WithLocalCache(packcache.LocalCache{}),
		packcache.WithPrefix("stale:", packcache.Policy{StaleFor: time.Minute, TTL: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	var gets, sets atomic.Int64
	// The near cache serves only once its invalidation stream is proven.
	waitFor(t, 5*time.Second, "the near cache serving", func() bool { return c.Stats().NearServing })
	kinds := []string{"ok:", "err:", "none:", "partial:", "big:", "near:", "stale:"}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 300 {
				k := fmt.Sprintf("%s%d", kinds[(w+i)%len(kinds)], i%7)
				switch i % 5 {
				case 0, 1, 2:
					gets.Add(1)
					c.Get(ctx, k)
				case 3:
					if c.Set(ctx, k, "set:"+k) == nil {
						sets.Add(1)
					}
				case 4:
					keys := []string{k, k + "x", k} // a duplicate: counted once
					gets.Add(2)
					c.GetMany(ctx, keys)
					c.Delete(ctx, k)
				}
			}
		})
	}
	wg.Wait()
	// A stale value whose reload fails.
	c.Set(ctx, "stale:err:1", "old")
	rdb.PExpire(ctx, "stale:err:1", 30*time.Second) // past its 1 s TTL, within StaleFor
	gets.Add(1)
	if v, err := c.Get(ctx, "stale:err:1"); err != nil || v != "old" {
		t.Fatalf("stale Get = %q, %v", v, err)
	}
	sets.Add(1)
	// A near hit for certain: the first Get keeps the value near, the
	// second is answered from there.
	c.Set(ctx, "near:last", "v")
	sets.Add(1)
	gets.Add(2)
	c.Get(ctx, "near:last")
	c.Get(ctx, "near:last")
	if err := c.Close(); err != nil { // refreshes and loads under way end
		t.Fatal(err)
	}
	st := c.Stats()
	t.Logf("%+v", st.Counters)
	if sum := st.NearHits + st.Hits + st.StaleServes + st.Misses + st.NotFoundHits + st.GetErrors; st.Gets != sum {
		t.Errorf("Gets %d != NearHits + Hits + StaleServes + Misses + NotFoundHits + GetErrors = %d", st.Gets, sum)
	}
	if st.Gets != uint64(gets.Load()) {
		t.Errorf("Gets %d, but the test made %d", st.Gets, gets.Load())
	}
	if sum := st.Stores + st.Superseded + st.TooLarge + st.Unstored; st.Loads != sum {
		t.Errorf("Loads %d != Stores + Superseded + TooLarge + Unstored = %d", st.Loads, sum)
	}
	if st.Loads+st.LoadErrors != uint64(loaderCalls.Load()) {
		t.Errorf("Loads %d + LoadErrors %d != %d loader calls", st.Loads, st.LoadErrors, loaderCalls.Load())
	}
	if st.Sets != uint64(sets.Load()) {
		t.Errorf("Sets %d, but %d Set calls succeeded", st.Sets, sets.Load())
	}
	for _, n := range []struct {
		name string
		v    uint64
	}{{"NearHits", st.NearHits}, {"Hits", st.Hits}, {"StaleServes", st.StaleServes}, {"Misses", st.Misses},
		{"NotFoundHits", st.NotFoundHits}, {"GetErrors", st.GetErrors}, {"Stores", st.Stores}, {"TooLarge", st.TooLarge}, {"Unstored", st.Unstored}} {
		if n.v == 0 {
			t.Errorf("the workload never produced %s: the test would not catch its miscounting", n.name)
		}
	}
}
