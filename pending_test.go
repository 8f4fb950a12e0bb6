package packcache_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
)

// A source of truth for the invalidation tests: the database a service
// updates before it invalidates the cache.
type source struct {
	mu sync.Mutex
	m  map[string]string
}

func (s *source) put(k, v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]string{}
	}
	s.m[k] = v
}

func (s *source) Load(_ context.Context, k string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[k]
	if !ok {
		return "", packcache.ErrNotFound
	}
	return v, nil
}

// pausable starts a redis-server of the test's own, for a test that stops
// it with SIGSTOP (s.Pause), and returns it, a cache over a client that
// does not retry (each timeout is the call's own), with a 200 ms Redis
// budget and a breaker that opens on the first failure unless opts say
// otherwise, and a client for the test to look at Redis with.
func pausable(t *testing.T, opts ...packcache.Option) (*redistest.Server, *packcache.Cache[string], *redis.Client) {
	t.Helper()
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "pauses the server")
	rdb := s.Client(t, func(o *redis.Options) { o.MaxRetries = -1 })
	opts = append([]packcache.Option{packcache.WithRedisTimeout(200 * time.Millisecond), packcache.WithCircuitBreaker(1, time.Minute)}, opts...)
	return s, mustNew[string](t, rdb, opts...), s.Client(t)
}

// TestInvalidationSurvivesStoppedRedis: with Redis stopped (SIGSTOP), a
// Delete and a Set fail with ErrPending, and a Get in this process never
// returns the old value, during the outage or after it; after SIGCONT the
// keys are gone from Redis within a second, with no further call.
func TestInvalidationSurvivesStoppedRedis(t *testing.T) {
	// Not parallel: it holds calls to time bounds.
	db := &source{}
	s, c, admin := pausable(t, packcache.WithLoader[string](db), packcache.WithRedisTimeout(300*time.Millisecond))
	ctx := ctxT(t)
	for _, k := range []string{"deleted", "set", "sent"} {
		db.put(k, "old")
		if err := c.Set(ctx, k, "old"); err != nil {
			t.Fatal(err)
		}
	}
	s.Pause(t)
	paused := true
	defer func() {
		if paused {
			s.Resume(t)
		}
	}()
	// The database is updated first, then the cache invalidated.
	db.put("sent", "new")
	// Sent to the stopped server, timed out; opens the breaker.
	if err := c.Delete(ctx, "sent"); !errors.Is(err, packcache.ErrPending) || !errors.Is(err, packcache.ErrRedis) {
		t.Fatalf("Delete with Redis stopped: %v, want ErrPending and ErrRedis", err)
	}
	// Refused by the open breaker: never sent. Without a retry these keys
	// would keep their old values for their whole TTL.
	db.put("deleted", "new")
	err := c.Delete(ctx, "deleted")
	if !errors.Is(err, packcache.ErrPending) || !errors.Is(err, packcache.ErrCircuitOpen) || !strings.Contains(err.Error(), `"deleted"`) {
		t.Fatalf("Delete with the breaker open: %v, want ErrPending and ErrCircuitOpen naming the key", err)
	}
	db.put("set", "new")
	if err := c.Set(ctx, "set", "new"); !errors.Is(err, packcache.ErrPending) {
		t.Fatalf("Set with the breaker open: %v, want ErrPending", err)
	}
	if st := c.Stats(); st.Pending != 3 || st.PendingKept != 3 {
		t.Fatalf("Stats: %d pending, %d kept; want 3 and 3", st.Pending, st.PendingKept)
	}
	for _, k := range []string{"deleted", "set", "sent"} {
		if v, err := c.Get(ctx, k); err != nil || v != "new" {
			t.Fatalf("Get %s during the outage = %q, %v; want the loader's new value", k, v, err)
		}
	}
	s.Resume(t)
	paused = false
	resumed := time.Now()
	// Until the invalidations land, Redis still holds "old" for two of
	// the keys: this process must not serve it.
	var gone atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !gone.Load() {
			for _, k := range []string{"deleted", "set", "sent"} {
				if v, err := c.Get(ctx, k); err == nil && v == "old" {
					t.Errorf("Get %s after Redis resumed returned the old value", k)
					return
				}
			}
		}
	}()
	waitFor(t, time.Second, "the invalidations landing after SIGCONT", func() bool {
		n, err := admin.Exists(ctx, "deleted", "set", "sent").Result()
		return err == nil && n == 0
	})
	t.Logf("keys gone from Redis %v after SIGCONT", time.Since(resumed))
	waitFor(t, time.Second, "Stats counting them applied", func() bool { return c.Stats().Pending == 0 })
	gone.Store(true)
	<-done
	st := c.Stats()
	if st.PendingApplied != 3 {
		t.Errorf("Stats after landing: %d applied, want 3", st.PendingApplied)
	}
	if st.PendingKept != uint64(st.Pending)+st.PendingApplied+st.PendingExpired {
		t.Errorf("PendingKept %d != Pending %d + Applied %d + Expired %d", st.PendingKept, st.Pending, st.PendingApplied, st.PendingExpired)
	}
	// Once landed, the keys are cached again as usual.
	if v, err := c.Get(ctx, "deleted"); err != nil || v != "new" {
		t.Fatalf("Get after landing = %q, %v", v, err)
	}
	waitFor(t, time.Second, "the reload stored", func() bool { return admin.Get(ctx, "deleted").Val() == `"new"` })
}

// TestInvalidationPendingOnClusterMaster: on a 3-master cluster, the
// invalidations of keys on a stopped master land after it resumes, while
// the keys of the other masters are served and written as usual.
func TestInvalidationPendingOnClusterMaster(t *testing.T) {
	// Not parallel: it holds calls to time bounds.
	cl := redistest.StartCluster(t, 3)
	rdb := cl.Universal(t, func(o *redis.UniversalOptions) { o.MaxRetries = -1 })
	ctx := ctxT(t)
	db := &source{}
	c := mustNew[string](t, rdb, packcache.WithLoader[string](db), packcache.WithRedisTimeout(300*time.Millisecond),
		packcache.WithCircuitBreaker(1, time.Minute))
	// A key on each master.
	keys := map[*redistest.Server]string{}
	for i := 0; len(keys) < 3; i++ {
		k := fmt.Sprintf("node:%d", i)
		if n := cl.NodeForKey(t, k); keys[n] == "" {
			keys[n] = k
		}
	}
	var stopped *redistest.Server
	var others []string
	for n, k := range keys {
		db.put(k, "old")
		if err := c.Set(ctx, k, "old"); err != nil {
			t.Fatal(err)
		}
		if stopped == nil {
			stopped = n
		} else {
			others = append(others, k)
		}
	}
	lost := keys[stopped]
	stopped.Pause(t)
	paused := true
	defer func() {
		if paused {
			stopped.Resume(t)
		}
	}()
	db.put(lost, "new")
	if err := c.Delete(ctx, lost); !errors.Is(err, packcache.ErrPending) {
		t.Fatalf("Delete on the stopped master: %v, want ErrPending", err)
	}
	for _, k := range others {
		db.put(k, "new")
		start := time.Now()
		if err := c.Delete(ctx, k); err != nil {
			t.Fatalf("Delete %s on a running master: %v", k, err)
		}
		if v, err := c.Get(ctx, k); err != nil || v != "new" {
			t.Fatalf("Get %s on a running master = %q, %v", k, v, err)
		}
		// Waiting on the stopped master would cost a Redis budget (300
		// ms) at least: the bound is that, not a speed.
		if d := time.Since(start); d >= 300*time.Millisecond {
			t.Errorf("a Delete and a Get on a running master took %v while another is stopped: a Redis budget, as if they had waited on it", d)
		}
	}
	if st := c.Stats(); st.Pending != 1 {
		t.Fatalf("%d invalidations pending, want 1 (the stopped master's)", st.Pending)
	}
	stopped.Resume(t)
	paused = false
	admin := stopped.Client(t)
	waitFor(t, 5*time.Second, "the stopped master's invalidation landing", func() bool {
		n, err := admin.Exists(ctx, lost).Result()
		return err == nil && n == 0
	})
	if v, err := c.Get(ctx, lost); err != nil || v != "new" {
		t.Fatalf("Get %s after landing = %q, %v", lost, v, err)
	}
}

// callerHook counts the commands, pipelines and dials go-redis makes for
// calls whose context carries callerMark: a caller's own, not the cache's
// background work.
type callerHook struct{ sent atomic.Int64 }

type callerMark struct{}

func (h *callerHook) mine(ctx context.Context) {
	if ctx.Value(callerMark{}) != nil {
		h.sent.Add(1)
	}
}
func (h *callerHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		h.mine(ctx)
		return next(ctx, network, addr)
	}
}
func (h *callerHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mine(ctx)
		return next(ctx, cmd)
	}
}
func (h *callerHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mine(ctx)
		return next(ctx, cmds)
	}
}

// TestPendingInvalidationsBounded: 100,000 failed invalidations are kept
// within the documented bound (the heap grows by less than 64 MiB), a
// Delete with the breaker open sends nothing to Redis and dials nothing
// (so it cannot wait for the stopped server: how fast it returns is
// BenchmarkDeleteBreakerOpen's), and Close during the outage says how
// many it could not apply.
func TestPendingInvalidationsBounded(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation sizes; run without -race")
	}
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "pauses the server")
	rdb := s.Client(t, func(o *redis.Options) { o.MaxRetries = -1 })
	hook := &callerHook{}
	rdb.AddHook(hook)
	ctx := ctxT(t)
	c, err := packcache.New[string](rdb, packcache.WithRedisTimeout(200*time.Millisecond), packcache.WithCircuitBreaker(1, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	s.Pause(t)
	defer s.Resume(t)
	if err := c.Delete(context.WithValue(ctx, callerMark{}, true), "opens-the-breaker"); !errors.Is(err, packcache.ErrPending) {
		t.Fatalf("Delete with Redis stopped: %v, want ErrPending", err)
	}
	if hook.sent.Load() == 0 {
		t.Fatal("the Delete that opened the breaker sent nothing: the hook does not see the caller's calls")
	}
	hook.sent.Store(0)
	before := heap()
	const n = 100_000
	mctx := context.WithValue(ctx, callerMark{}, true)
	for i := range n {
		if err := c.Delete(mctx, fmt.Sprintf("channel:%06d", i)); !errors.Is(err, packcache.ErrPending) {
			t.Fatalf("Delete %d: %v, want ErrPending", i, err)
		}
	}
	grew := int64(heap()) - int64(before)
	t.Logf("%d pending invalidations: heap +%.1f MiB (%d B each)", n, float64(grew)/(1<<20), grew/n)
	if grew > 64<<20 {
		t.Errorf("heap grew by %d MiB for %d pending invalidations, want < 64 MiB", grew>>20, n)
	}
	if sent := hook.sent.Load(); sent != 0 {
		t.Errorf("%d Deletes with the breaker open sent %d commands or dials to the stopped server, want none", n, sent)
	}
	if st := c.Stats(); st.Pending != n+1 {
		t.Errorf("Stats.Pending = %d, want %d", st.Pending, n+1)
	}
	err = c.Close()
	t.Logf("Close during the outage: %v", err)
	if err == nil || !errors.Is(err, packcache.ErrRedis) || !strings.Contains(err.Error(), fmt.Sprint(n+1)+" pending invalidations not applied") {
		t.Errorf("Close with %d invalidations pending and Redis stopped: %v", n+1, err)
	}
}

// BenchmarkDeleteBreakerOpen: a Delete with the node's breaker open (the
// server stopped by SIGSTOP), which keeps its invalidation for retry and
// returns ErrPending without a round trip. TestPendingInvalidationsBounded
// holds it to sending nothing; this is how long it takes.
func BenchmarkDeleteBreakerOpen(b *testing.B) {
	s := redistest.Start(b)
	redistest.RequireReal(b, s, "pauses the server")
	rdb := s.Client(b, func(o *redis.Options) { o.MaxRetries = -1 })
	c, err := packcache.New[string](rdb, packcache.WithRedisTimeout(200*time.Millisecond), packcache.WithCircuitBreaker(1, time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	s.Pause(b)
	defer s.Resume(b)
	defer c.Close()
	c.Delete(ctx, "opens-the-breaker")
	// A key of its own for each Delete (about 140 B each kept): a Delete
	// of a key whose invalidation the background round is retrying waits
	// for that round, which is another matter.
	keys := make([]string, b.N)
	for i := range keys {
		keys[i] = fmt.Sprintf("channel:%09d", i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if err := c.Delete(ctx, keys[i]); !errors.Is(err, packcache.ErrPending) {
			b.Fatalf("Delete: %v, want ErrPending", err)
		}
	}
}

// TestPendingInvalidationLandsOnClose: Close applies what is still
// pending when Redis answers again, and then reports nothing.
func TestPendingInvalidationLandsOnClose(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "pauses the server")
	rdb := s.Client(t, func(o *redis.Options) { o.MaxRetries = -1 })
	admin := s.Client(t)
	ctx := ctxT(t)
	c, err := packcache.New[string](rdb, packcache.WithRedisTimeout(200*time.Millisecond), packcache.WithCircuitBreaker(1, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	c.Set(ctx, "k", "old")
	s.Pause(t)
	c.Delete(ctx, "opens-the-breaker")
	if err := c.Delete(ctx, "k"); !errors.Is(err, packcache.ErrPending) {
		t.Fatalf("Delete: %v", err)
	}
	s.Resume(t)
	if err := c.Close(); err != nil {
		t.Fatalf("Close with Redis answering: %v", err)
	}
	if n := admin.Exists(ctx, "k").Val(); n != 0 {
		t.Fatal("Close returned nil with the invalidation not applied")
	}
}

// TestPendingNotForCallerContext: a write that fails because the caller's
// own context ended is not a Redis failure, and is not kept.
func TestPendingNotForCallerContext(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	redistest.RequireReal(t, s, "CLIENT PAUSE")
	admin := s.Client(t)
	c := mustNew[string](t, rdb)
	// Paused until the Delete has returned, however long the machine
	// takes to send it: a pause of 200 ms could end first on a busy
	// machine, and the Delete then succeeded (seen at load 11).
	if err := admin.Do(context.Background(), "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	defer admin.Do(context.Background(), "CLIENT", "UNPAUSE")
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := c.Delete(short, "k")
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, packcache.ErrPending) || errors.Is(err, packcache.ErrRedis) {
		t.Fatalf("Delete with a caller deadline: %v, want the deadline, not ErrPending", err)
	}
	if st := c.Stats(); st.Pending != 0 || st.PendingKept != 0 {
		t.Fatalf("a caller's deadline kept an invalidation: %+v", st)
	}
}

// TestPendingSparesLaterSet: a Set that timed out on a stopped Redis (and
// lands when it resumes) is pending; a later Set of the key that succeeds
// stands: the invalidation deletes the late landing, never the newer
// value.
func TestPendingSparesLaterSet(t *testing.T) {
	t.Parallel()
	s, c, admin := pausable(t, packcache.WithCircuitBreaker(100, time.Minute))
	ctx := ctxT(t)
	s.Pause(t)
	if err := c.Set(ctx, "k", "v1"); !errors.Is(err, packcache.ErrPending) {
		s.Resume(t)
		t.Fatalf("Set with Redis stopped: %v, want ErrPending", err)
	}
	s.Resume(t) // v1, written to the stopped server, lands now
	waitFor(t, 5*time.Second, "a Set succeeding after resume", func() bool { return c.Set(ctx, "k", "v2") == nil })
	waitFor(t, 2*time.Second, "the invalidation landing", func() bool { return c.Stats().Pending == 0 })
	if got := admin.Get(ctx, "k").Val(); got != `"v2"` {
		t.Fatalf("Redis holds %q after the invalidation landed, want the later Set's \"v2\"", got)
	}
	if v, err := c.Get(ctx, "k"); err != nil || v != "v2" {
		t.Fatalf("Get = %q, %v", v, err)
	}
}

// TestPendingExpires: an invalidation still pending once the longest TTL
// the old value could have had has passed is dropped: Redis has expired
// the value anyway; the observer is told the count fell to 0.
func TestPendingExpires(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	s, c, _ := pausable(t, packcache.WithTTL(300*time.Millisecond), packcache.WithRedisTimeout(100*time.Millisecond), packcache.WithObserver(rec))
	ctx := ctxT(t)
	s.Pause(t)
	defer s.Resume(t)
	if err := c.Delete(ctx, "k"); !errors.Is(err, packcache.ErrPending) {
		t.Fatalf("Delete: %v, want ErrPending", err)
	}
	waitFor(t, 3*time.Second, "the invalidation dropped after the TTL", func() bool {
		st := c.Stats()
		return st.Pending == 0 && st.PendingExpired == 1
	})
	if st := c.Stats(); st.PendingApplied != 0 || st.PendingKept != 1 {
		t.Fatalf("Stats: %+v", st)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var pending []int
	for _, e := range rec.redis {
		if e.Err == nil && e.Breaker == "" {
			pending = append(pending, e.Pending)
		}
	}
	if !slices.Equal(pending, []int{1, 0}) {
		t.Fatalf("observer saw Pending %v; want [1 0] (kept, expired)", pending)
	}
}

// TestPendingBatchWrites: the batch twins follow the same rule. SetMany
// and a Delete of several keys that fail with the breaker open return
// ErrPending for each key; GetOrLoadMany of those keys never returns what
// Redis still holds; and the invalidations land once Redis answers.
func TestPendingBatchWrites(t *testing.T) {
	t.Parallel()
	s, c, admin := pausable(t)
	ctx := ctxT(t)
	keys := []string{"b:1", "b:2", "b:3", "b:4"}
	for _, k := range keys {
		admin.Set(ctx, k, `"old"`, 0)
	}
	s.Pause(t)
	paused := true
	defer func() {
		if paused {
			s.Resume(t)
		}
	}()
	c.Delete(ctx, "opens-the-breaker")
	err := c.SetMany(ctx, map[string]string{"b:1": "new", "b:2": "new"})
	for _, k := range []string{"b:1", "b:2"} {
		if !errors.Is(err, packcache.ErrPending) || !strings.Contains(err.Error(), `"`+k+`"`) {
			t.Fatalf("SetMany with the breaker open: %v, want ErrPending naming %s", err, k)
		}
	}
	if err := c.Delete(ctx, "b:3", "b:4"); !errors.Is(err, packcache.ErrPending) || !strings.Contains(err.Error(), `"b:4"`) {
		t.Fatalf("Delete of two keys with the breaker open: %v, want ErrPending for each", err)
	}
	if st := c.Stats(); st.Pending != 5 {
		t.Fatalf("%d pending, want 5", st.Pending)
	}
	s.Resume(t)
	paused = false
	load := func(ctx context.Context, missing []string) (map[string]string, error) {
		m := map[string]string{}
		for _, k := range missing {
			m[k] = "new"
		}
		return m, nil
	}
	// Until the invalidations land, Redis may still hold "old".
	for deadline := time.Now().Add(2 * time.Second); c.Stats().Pending > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d invalidations still pending 2 s after Redis resumed", c.Stats().Pending)
		}
		got, err := c.GetOrLoadMany(ctx, keys, load)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range got {
			if v == "old" {
				t.Fatalf("GetOrLoadMany returned the old value of %s while its invalidation was pending", k)
			}
		}
	}
	// Landed: each key is gone, or holds what a load stored since.
	for _, k := range keys {
		if v := admin.Get(ctx, k).Val(); v == `"old"` {
			t.Fatalf("%s still holds the old value after its invalidation landed", k)
		}
	}
}

// TestPendingObserved: the observer is told how many invalidations are
// pending when one is kept and when they land, on events of their own, so
// that it sees each failure once: as many failure events as the cache
// counts Redis errors.
func TestPendingObserved(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	s, c, _ := pausable(t, packcache.WithObserver(rec))
	ctx := ctxT(t)
	s.Pause(t)
	c.Delete(ctx, "a")
	c.Delete(ctx, "b")
	s.Resume(t)
	waitFor(t, 15*time.Second, "the invalidations landing", func() bool { return c.Stats().Pending == 0 })
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var pending []int
	failures := 0
	for _, e := range rec.redis {
		switch {
		case e.Err != nil:
			failures++
			if e.Pending != 0 {
				t.Errorf("a failure event with Pending %d: %+v", e.Pending, e)
			}
		case e.Breaker == "":
			pending = append(pending, e.Pending)
		}
	}
	if !slices.Equal(pending, []int{1, 2, 0}) {
		t.Fatalf("observer saw Pending %v; want [1 2 0] (kept, kept, landed): %+v", pending, rec.redis)
	}
	if n := c.Stats().RedisErrors; uint64(failures) != n {
		t.Fatalf("observer saw %d failure events; the cache counts %d Redis errors", failures, n)
	}
}
