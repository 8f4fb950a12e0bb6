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
	"github.com/packcache/packcache/internal/redistest"
)

// The breaker's promise: it counts only what a node itself did (a network
// error, a refused connection, the cache's Redis budget running out), once
// per Redis operation and per node, never a caller's context ending; and a
// node's breaker opens for that node's keys only.

// TestBreakerIgnoresCallerContexts: callers whose contexts have ended,
// however many, do not open the breaker for the others.
func TestBreakerIgnoresCallerContexts(t *testing.T) {
	_, rdb := single(t)
	ctx := ctxT(t)
	var loads atomic.Int64
	c := mustNew[Channel](t, rdb, packcache.WithCircuitBreaker(2, time.Minute), packcache.WithShareWindow(packcache.Off))
	rt := mustNew[Channel](t, rdb, packcache.WithCircuitBreaker(2, time.Minute), packcache.WithShareWindow(packcache.Off),
		packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
			loads.Add(1)
			return Channel{ID: key}, nil
		})))
	if err := c.Set(ctx, "ctx:k", Channel{ID: "ctx:k"}); err != nil {
		t.Fatal(err)
	}
	expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	cancelled, cancel2 := context.WithCancel(ctx)
	cancel2()
	keys := make([]string, 50)
	for i := range keys {
		keys[i] = fmt.Sprintf("ctx:%d", i)
	}
	for _, dead := range []context.Context{expired, cancelled} {
		for range 10 {
			c.GetMany(dead, keys)
			c.SetMany(dead, map[string]Channel{"ctx:x": {}, "ctx:y": {}})
			c.Set(dead, "ctx:z", Channel{})
			c.Delete(dead, "ctx:z", "ctx:w")
			c.Get(dead, "ctx:k")
			rt.GetOrLoadMany(dead, keys, func(context.Context, []string) (map[string]Channel, error) { return nil, nil })
		}
	}
	if v, err := c.Get(ctx, "ctx:k"); err != nil || v.ID != "ctx:k" {
		t.Fatalf("Get after callers' contexts ended: %+v, %v", v, err)
	}
	if v, err := rt.Get(ctx, "ctx:k"); err != nil || v.ID != "ctx:k" || loads.Load() != 0 {
		t.Fatalf("read-through Get after callers' contexts ended: %+v, %v, %d loads (want it from Redis)", v, err, loads.Load())
	}
	if st := c.Stats(); st.RedisErrors == 0 {
		t.Log("no Redis errors were counted at all")
	}
}

// TestBreakerCountsOncePerBatchPerNode: a batch of a hundred keys on a
// hung node is one failure, not a hundred.
func TestBreakerCountsOncePerBatchPerNode(t *testing.T) {
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "stops the server")
	rdb := s.Client(t, func(o *redis.Options) { o.MaxRetries, o.DialerRetries = -1, 1 })
	ctx := ctxT(t)
	c := mustNew[Channel](t, rdb, packcache.WithCircuitBreaker(2, time.Minute), packcache.WithRedisTimeout(100*time.Millisecond))
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = fmt.Sprintf("batch:%d", i)
	}
	c.GetMany(ctx, keys) // connections made while the server answers
	s.Pause(t)
	defer s.Resume(t)
	if _, err := c.GetMany(ctx, keys); !errors.Is(err, packcache.ErrRedis) || errors.Is(err, packcache.ErrCircuitOpen) {
		t.Fatalf("first GetMany: %v", err)
	}
	if _, err := c.Get(ctx, "batch:0"); !errors.Is(err, packcache.ErrRedis) || errors.Is(err, packcache.ErrCircuitOpen) {
		t.Fatalf("one GetMany of 100 keys opened a breaker that needs 2 failures: %v", err)
	}
	// That Get was the second failure: now it is open.
	if _, err := c.GetMany(ctx, keys); !errors.Is(err, packcache.ErrCircuitOpen) {
		t.Fatalf("after two failures: %v, want ErrCircuitOpen", err)
	}
}

// TestBreakerPerNode: with one master of a cluster dead, its breaker opens
// and its keys fail fast, while keys on the healthy masters are still
// served from Redis.
func TestBreakerPerNode(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	cl.AllowPartialCoverage(t)
	rdb := cl.Client(t, func(o *redis.ClusterOptions) {
		o.DialTimeout = 200 * time.Millisecond
		o.MaxRedirects = 2
		o.MaxRetries = -1
		o.DialerRetries = 1
	})
	ctx := ctxT(t)
	var loads atomic.Int64
	c := mustNew[Channel](t, rdb, packcache.WithCircuitBreaker(3, time.Minute), packcache.WithShareWindow(packcache.Off),
		packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
			loads.Add(1)
			return Channel{ID: key, Title: "loaded"}, nil
		})))
	plain := mustNew[Channel](t, rdb, packcache.WithCircuitBreaker(3, time.Minute), packcache.WithShareWindow(packcache.Off))
	victim := cl.Nodes()[1]
	var lost, kept []string
	for i := 0; len(lost) < 10 || len(kept) < 20; i++ {
		k := fmt.Sprintf("node:{%d}", i)
		if err := plain.Set(ctx, k, Channel{ID: k, Title: "stored"}); err != nil {
			t.Fatal(err)
		}
		if cl.NodeForKey(t, k) == victim {
			lost = append(lost, k)
		} else {
			kept = append(kept, k)
		}
	}
	victim.Stop(t)
	for _, k := range lost {
		plain.Get(ctx, k) // fails, and opens the victim's breaker
	}
	for _, k := range lost {
		if _, err := plain.Get(ctx, k); !errors.Is(err, packcache.ErrCircuitOpen) {
			t.Fatalf("Get of %s on the dead master: %v, want ErrCircuitOpen", k, err)
		}
		if v, err := c.Get(ctx, k); err != nil || v.Title != "loaded" {
			t.Fatalf("read-through Get of %s on the dead master: %+v, %v", k, v, err)
		}
	}
	before := loads.Load()
	for _, k := range kept {
		if v, err := c.Get(ctx, k); err != nil || v.Title != "stored" {
			t.Fatalf("read-through Get of %s on a healthy master: %+v, %v (want it from Redis)", k, v, err)
		}
		if _, err := plain.Get(ctx, k); err != nil {
			t.Fatalf("Get of %s on a healthy master: %v", k, err)
		}
	}
	if loads.Load() != before {
		t.Fatalf("keys on healthy masters were loaded: the breaker opened for every node")
	}
	// A batch across all masters: the healthy ones' keys are read.
	got, err := plain.GetMany(ctx, append(append([]string{}, kept...), lost...))
	if len(got) != len(kept) || !errors.Is(err, packcache.ErrCircuitOpen) {
		t.Fatalf("GetMany across masters: %d of %d healthy keys, %v", len(got), len(kept), err)
	}
}

// TestBreakerHotKeyOnDeadRedis: one hot key on a dead Redis trips the
// breaker after a few reads (each read a failure, whatever the number of
// callers sharing it), and read-through callers then get the loader's value
// without waiting on Redis.
func TestBreakerHotKeyOnDeadRedis(t *testing.T) {
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "stops the server")
	rdb := s.Client(t, func(o *redis.Options) { o.MaxRetries, o.DialerRetries = -1, 1 })
	ctx := ctxT(t)
	c := mustNew[Channel](t, rdb, packcache.WithCircuitBreaker(3, time.Minute),
		packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
			return Channel{ID: key}, nil
		})))
	s.Stop(t)
	var wg sync.WaitGroup
	var gets atomic.Int64
	end := time.Now().Add(500 * time.Millisecond) // fifty share windows
	for range 20 {
		wg.Go(func() {
			for time.Now().Before(end) {
				gets.Add(1)
				if v, err := c.Get(ctx, "hot"); err != nil || v.ID != "hot" {
					t.Errorf("read-through Get: %+v, %v", v, err)
					return
				}
			}
		})
	}
	wg.Wait()
	// Redis was tried until the breaker opened, not once per share
	// window: a refused connection opens it at once, so after the reads
	// under way when it opened (at most the threshold), no other.
	if n := c.Stats().RedisErrors; n < 1 || n > 3 {
		t.Fatalf("%d Redis errors for %d Gets of a hot key over 500ms: want 1 to 3 before the breaker opened", n, gets.Load())
	}
}

// TestHungRedis: with Redis stopped by SIGSTOP, a read-through Get answers
// from the loader within the Redis budget plus the load time, and
// consecutive timeouts open the breaker, so that the hang costs a few
// budgets, not one per call.
func TestHungRedis(t *testing.T) {
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "pauses the server")
	rdb := s.Client(t)
	ctx := ctxT(t)
	const budget = 200 * time.Millisecond
	c := mustNew[Channel](t, rdb, packcache.WithRedisTimeout(budget), packcache.WithCircuitBreaker(5, time.Minute),
		packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
			return Channel{ID: key, Title: "loaded"}, nil
		})))
	plain := mustNew[Channel](t, rdb, packcache.WithRedisTimeout(budget), packcache.WithCircuitBreaker(5, time.Minute))
	if err := plain.Set(ctx, "hung:0", Channel{ID: "hung:0"}); err != nil {
		t.Fatal(err)
	}
	s.Pause(t)
	defer s.Resume(t)
	start := time.Now()
	v, err := c.Get(ctx, "hung:0")
	first := time.Since(start)
	if err != nil || v.Title != "loaded" {
		t.Fatalf("read-through Get with Redis hung: %+v, %v", v, err)
	}
	if first > 10*budget {
		t.Fatalf("first answer after %v, want about the budget (%v)", first, budget)
	}
	// Sequential Gets of other keys: each costs a budget until the
	// breaker opens after five in a row; then none waits.
	var opened time.Duration
	for i := 1; i <= 20; i++ {
		t0 := time.Now()
		if v, err := c.Get(ctx, fmt.Sprintf("hung:%d", i)); err != nil || v.Title != "loaded" {
			t.Fatalf("Get %d: %+v, %v", i, v, err)
		}
		if time.Since(t0) < budget/4 && opened == 0 {
			opened = time.Since(start)
		}
	}
	if opened == 0 {
		t.Fatal("the breaker never opened")
	}
	if n := c.Stats().RedisErrors; n != 5 {
		t.Fatalf("%d Redis calls timed out, want 5 (then the breaker is open)", n)
	}
	t.Logf("budget %v: first answer after %v; breaker open %v after the hang began", budget, first, opened)
	if _, err := plain.Get(ctx, "hung:0"); !errors.Is(err, packcache.ErrRedis) {
		t.Fatalf("loader-less Get with Redis hung: %v", err)
	}
}

// TestSlowLoadsAreNotRedisFailures: loads that outlive the load timeout
// fail their callers with ErrLoadTimeout and store nothing, and however
// many there are, they count as no Redis failure: the breaker stays
// closed and later loads store their values.
func TestSlowLoadsAreNotRedisFailures(t *testing.T) {
	_, rdb := single(t)
	ctx := ctxT(t)
	var slow atomic.Bool
	slow.Store(true)
	c := mustNew[Channel](t, rdb, packcache.WithLoadTimeout(50*time.Millisecond), packcache.WithCircuitBreaker(2, time.Minute),
		packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
			if slow.Load() {
				time.Sleep(120 * time.Millisecond) // ignores ctx
			}
			return Channel{ID: key}, nil
		})))
	for i := range 6 {
		if _, err := c.Get(ctx, fmt.Sprintf("slow:%d", i)); !errors.Is(err, packcache.ErrLoadTimeout) {
			t.Fatalf("slow load %d: %v, want ErrLoadTimeout", i, err)
		}
	}
	slow.Store(false)
	time.Sleep(200 * time.Millisecond) // the slow loaders return meanwhile
	if n := c.Stats().RedisErrors; n != 0 {
		t.Fatalf("slow loads counted %d Redis errors", n)
	}
	for i := range 6 {
		if n := rdb.Exists(ctx, fmt.Sprintf("slow:%d", i)).Val(); n != 0 {
			t.Fatalf("slow:%d holds %q after its load timed out", i, rdb.Get(ctx, fmt.Sprintf("slow:%d", i)).Val())
		}
	}
	if _, err := c.Get(ctx, "fast"); err != nil {
		t.Fatalf("a fast load after the slow ones: %v", err)
	}
	if n := rdb.Exists(ctx, "fast").Val(); n != 1 {
		t.Fatal("a fast load after the slow ones did not store: the breaker opened")
	}
}

// TestNewRefusesClientIgnoringDeadlines: a go-redis client that ignores
// context deadlines would let a hung Redis stall callers for the client's
// own timeouts and retries; New says so.
func TestNewRefusesClientIgnoringDeadlines(t *testing.T) {
	s, _ := single(t)
	for name, rdb := range map[string]redis.UniversalClient{
		"client":  redis.NewClient(&redis.Options{Addr: s.Addr()}),
		"cluster": redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{s.Addr()}}),
		"ring":    redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": s.Addr()}}),
	} {
		if _, err := packcache.New[Channel](rdb); err == nil || !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
			t.Errorf("%s: New = %v, want an error naming ContextTimeoutEnabled", name, err)
		}
		rdb.Close()
	}
}
