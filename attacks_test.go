package packcache_test

// Adversarial tests, written by attacking the cache as an outsider would:
// each tries to break one of its promises. Those that broke one are kept as
// the test that fails without the fix.

import (
	"context"
	"errors"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
)

// rawState returns what key holds, "<nil>" for nothing and "<lease>" for a
// lease.
func rawState(t testing.TB, rdb redis.UniversalClient, key string) string {
	t.Helper()
	b, err := rdb.Get(context.Background(), key).Bytes()
	switch {
	case err == redis.Nil:
		return "<nil>"
	case err != nil:
		t.Fatalf("raw GET %q: %v", key, err)
	case len(b) > 0 && b[0] == 0x0C:
		return "<lease>"
	}
	return string(b)
}

// ---------------------------------------------------------------------
// Promise 1, digest guard: a refresh begun from value A stores its value
// over a Set that wrote the very same bytes A after it began (ABA).

func TestAdvRefreshOverwritesIdenticalSet(t *testing.T) {
	s, rdb := single(t)
	redistest.RequireReal(t, s, "needs TTLs to run down in real time")
	ctx := ctxT(t)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var calls atomic.Int64
	ld := packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
		if calls.Add(1) == 1 {
			entered <- struct{}{}
			<-release
			return "loaded-before-the-write", nil
		}
		return "later", nil
	})
	c, err := packcache.New[string](rdb, packcache.WithLoader[string](ld),
		packcache.WithTTL(10*time.Second), packcache.WithPrefix("", packcache.Policy{RefreshAfter: 100 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "k", "A"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	if v, err := c.Get(ctx, "k"); err != nil || v != "A" {
		t.Fatalf("Get = %q, %v", v, err)
	}
	<-entered // the refresh's loader runs
	// The write: the source now says "A" again, and the writer Sets it.
	if err := c.Set(ctx, "k", "A"); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := c.Close(); err != nil { // waits for the refresh
		t.Fatal(err)
	}
	if got := rawState(t, rdb, "k"); got != `"A"` {
		t.Errorf("after Set(k, A) returned, Redis holds %s: a refresh begun before the Set undid it", got)
	}
}

// Same, with Delete and a later load that stores the same bytes again.
func TestAdvRefreshOverwritesDeleteThenReload(t *testing.T) {
	s, rdb := single(t)
	redistest.RequireReal(t, s, "needs TTLs to run down in real time")
	ctx := ctxT(t)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var calls atomic.Int64
	ld := packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
		if calls.Add(1) == 1 {
			entered <- struct{}{}
			<-release
			return "loaded-before-the-delete", nil
		}
		return "A", nil
	})
	c, err := packcache.New[string](rdb, packcache.WithLoader[string](ld),
		packcache.WithTTL(10*time.Second), packcache.WithPrefix("", packcache.Policy{RefreshAfter: 100 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	c.Set(ctx, "k", "A")
	time.Sleep(150 * time.Millisecond)
	c.Get(ctx, "k") // starts the refresh
	<-entered
	if err := c.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, "k"); err != nil || v != "A" { // loads A afresh, stores it
		t.Fatalf("Get after Delete = %q, %v", v, err)
	}
	close(release)
	c.Close()
	if got := rawState(t, rdb, "k"); got != `"A"` {
		t.Errorf("Redis holds %s: the refresh begun before Delete stored its value", got)
	}
}

// ---------------------------------------------------------------------
// Leases left behind: a loaded value that cannot be serialized or is too
// large fails the Get, but the lease stays in Redis for the lease TTL.

func TestAdvLeaseLeftAfterSerializationError(t *testing.T) {
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[float64](t, rdb, packcache.WithLoader[float64](packcache.LoaderFunc[float64](
		func(ctx context.Context, key string) (float64, error) { return math.NaN(), nil })))
	_, err := c.Get(ctx, "nan")
	if !errors.Is(err, packcache.ErrSerialization) {
		t.Fatalf("Get = %v, want ErrSerialization", err)
	}
	if got := rawState(t, rdb, "nan"); got != "<nil>" {
		ttl, _ := rdb.PTTL(ctx, "nan").Result()
		t.Errorf("after the failed Get returned, key holds %s (PTTL %v)", got, ttl)
	}
}

func TestAdvLeaseLeftAfterTooLarge(t *testing.T) {
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[string](t, rdb, packcache.WithMaxValueSize(100), packcache.WithLoader[string](packcache.LoaderFunc[string](
		func(ctx context.Context, key string) (string, error) { return strings.Repeat("x", 500), nil })))
	// Too large to store, but the loader's value all the same (see
	// TestLoadedValueTooLargeToStore); the lease must not stay behind.
	if v, err := c.Get(ctx, "big"); err != nil || len(v) != 500 {
		t.Fatalf("Get = %d bytes, %v; want the loaded value", len(v), err)
	}
	if got := rawState(t, rdb, "big"); got != "<nil>" {
		t.Errorf("after the failed Get returned, key holds %s", got)
	}
	// And meanwhile a Get without a loader (another cache) reports a miss,
	// a Get with a loader loads without storing.
}

// ---------------------------------------------------------------------
// Promise 4: a loader that ignores its context: callers must get
// ErrLoadTimeout at the load timeout, not when the loader returns.

func TestAdvSlowLoaderIgnoringContext(t *testing.T) {
	for _, name := range []string{"cancellable", "background"} {
		t.Run(name, func(t *testing.T) {
			_, rdb := single(t)
			c, err := packcache.New[string](rdb, packcache.WithLoadTimeout(200*time.Millisecond),
				packcache.WithLoader[string](packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
					time.Sleep(3 * time.Second) // ignores ctx
					return "late", nil
				})))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx := context.Background()
			if name == "cancellable" {
				ctx = ctxT(t)
			}
			start := time.Now()
			_, err = c.Get(ctx, "slow")
			el := time.Since(start)
			t.Logf("Get returned after %v: %v", el, err)
			if !errors.Is(err, packcache.ErrLoadTimeout) {
				t.Errorf("err = %v, want ErrLoadTimeout", err)
			}
			if el > time.Second {
				t.Errorf("Get took %v with a 200ms load timeout", el)
			}
		})
	}
}

// ---------------------------------------------------------------------
// StaleFor: a Get that finds a stale value joins a refresh begun (from the
// same bytes) while the value was fresh; when the refresh fails it gets the
// error, not the stale value.

func TestAdvStaleCallerJoinsFailingRefresh(t *testing.T) {
	s, rdb := single(t)
	redistest.RequireReal(t, s, "needs TTLs to run down in real time")
	ctx := ctxT(t)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var calls atomic.Int64
	ld := packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
		if calls.Add(1) == 1 {
			entered <- struct{}{}
			<-release
		}
		return "", errors.New("source down")
	})
	c := mustNew[string](t, rdb, packcache.WithLoader[string](ld),
		packcache.WithTTL(400*time.Millisecond), packcache.WithPrefix("", packcache.Policy{RefreshAfter: 100 * time.Millisecond}),
		packcache.WithPrefix("", packcache.Policy{StaleFor: 10 * time.Second}))
	c.Set(ctx, "k", "A")
	time.Sleep(150 * time.Millisecond)
	if v, err := c.Get(ctx, "k"); err != nil || v != "A" { // fresh; starts a refresh
		t.Fatalf("Get = %q, %v", v, err)
	}
	<-entered
	time.Sleep(400 * time.Millisecond) // now past TTL: stale
	type res struct {
		v   string
		err error
	}
	done := make(chan res)
	go func() { v, err := c.Get(ctx, "k"); done <- res{v, err} }()
	time.Sleep(50 * time.Millisecond)
	close(release)
	r := <-done
	if r.err != nil || r.v != "A" {
		t.Errorf("stale Get with a failing reload = %q, %v; want the stale value A (loader calls: %d)", r.v, r.err, calls.Load())
	}
}

// ---------------------------------------------------------------------
// Two GetOrLoadMany of the same keys {x, y}: each takes one key's lease
// and, settling the other key, waits for the other batch's load of it,
// which waits in turn for the first batch's settling. Both hang until the
// load timeout. The hook below only orders the two lease pipelines the
// way two nodes of a cluster (or two connections) can.

type crossHook struct {
	mu       sync.Mutex
	n        int
	arrived2 chan struct{} // the second acquire pipeline has arrived
	first    chan struct{} // the first has sent its first command
	second   chan struct{} // the second is done
	enabled  atomic.Bool
}

func (h *crossHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *crossHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func isAcquire(cmd redis.Cmder) bool {
	a := cmd.Args()
	// evalsha sha 1 key lease ms over
	return len(a) == 7 && (cmd.Name() == "evalsha" || cmd.Name() == "eval") && a[6] == ""
}

func (h *crossHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !h.enabled.Load() || len(cmds) != 2 || !isAcquire(cmds[0]) {
			return next(ctx, cmds)
		}
		h.mu.Lock()
		h.n++
		n := h.n
		h.mu.Unlock()
		switch n {
		case 1:
			<-h.arrived2
			err := next(ctx, cmds[:1])
			close(h.first)
			<-h.second
			if err2 := next(ctx, cmds[1:]); err == nil {
				err = err2
			}
			return err
		case 2:
			close(h.arrived2)
			<-h.first
			// The other key first, so that each batch wins one key.
			err := next(ctx, []redis.Cmder{cmds[1], cmds[0]})
			close(h.second)
			return err
		}
		return next(ctx, cmds)
	}
}

func TestAdvTwoBatchesDeadlock(t *testing.T) {
	s := redistest.Start(t)
	cl := s.Client(t)
	h := &crossHook{arrived2: make(chan struct{}), first: make(chan struct{}), second: make(chan struct{})}
	cl.AddHook(h)
	ctx := ctxT(t)
	var fnCalls atomic.Int64
	fn := func(ctx context.Context, keys []string) (map[string]string, error) {
		fnCalls.Add(1)
		m := map[string]string{}
		for _, k := range keys {
			m[k] = "v-" + k
		}
		return m, nil
	}
	c := mustNew[string](t, cl, packcache.WithLoadTimeout(3*time.Second))
	// Warm the scripts so that no NOSCRIPT retry reorders anything.
	if _, err := c.GetOrLoadMany(ctx, []string{"w1", "w2"}, fn); err != nil {
		t.Fatal(err)
	}
	h.enabled.Store(true)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	took := make([]time.Duration, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, errs[i] = c.GetOrLoadMany(ctx, []string{"x", "y"}, fn)
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()
	for i := range 2 {
		t.Logf("batch %d: %v after %v", i, errs[i], took[i])
		if errs[i] != nil || took[i] > time.Second {
			t.Errorf("batch %d: err %v after %v (fn called %d times)", i, errs[i], took[i], fnCalls.Load())
		}
	}
}

// The same without any hook, on the cluster: x and y on different nodes.
func TestAdvTwoBatchesDeadlockCluster(t *testing.T) {
	var tg redistest.Target
	for _, x := range redistest.Targets(t) {
		if x.Cluster != nil {
			tg = x
		}
	}
	if tg.Cluster == nil {
		t.Skip("no cluster")
	}
	// Two keys on different masters.
	keys := []string{"x"}
	n0 := tg.Cluster.NodeForKey(t, "x")
	for i := 0; ; i++ {
		k := "y" + string(rune('a'+i%26)) + strings.Repeat("z", i/26)
		if tg.Cluster.NodeForKey(t, k) != n0 {
			keys = append(keys, k)
			break
		}
	}
	ctx := ctxT(t)
	fn := func(ctx context.Context, keys []string) (map[string]string, error) {
		m := map[string]string{}
		for _, k := range keys {
			m[k] = "v-" + k
		}
		return m, nil
	}
	c := mustNew[string](t, tg.Client, packcache.WithLoadTimeout(2*time.Second))
	c.GetOrLoadMany(ctx, keys, fn)
	bad := 0
	for round := range 30 {
		if err := c.Delete(ctx, keys...); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var slow atomic.Int64
		start := make(chan struct{})
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				t0 := time.Now()
				_, err := c.GetOrLoadMany(ctx, keys, fn)
				if err != nil || time.Since(t0) > time.Second {
					slow.Add(1)
					t.Logf("round %d: %v after %v", round, err, time.Since(t0))
				}
			}()
		}
		close(start)
		wg.Wait()
		if slow.Load() > 0 {
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%d of 30 rounds of two concurrent GetOrLoadMany hung until the load timeout", bad)
	}
}

// ---------------------------------------------------------------------
// Promise 3: a caller whose own deadline (shorter than the Redis budget)
// ends while Redis is slow must not count against the node. Redis is made
// slow, not dead, with CLIENT PAUSE from an admin connection.

func TestAdvBreakerCountsCallerDeadline(t *testing.T) {
	s, rdb := single(t)
	redistest.RequireReal(t, s, "CLIENT PAUSE")
	admin := s.Client(t)
	c := mustNew[string](t, rdb, packcache.WithCircuitBreaker(1, time.Minute), packcache.WithCoalescing(false))
	ops := map[string]func(ctx context.Context) error{
		"set":    func(ctx context.Context) error { return c.Set(ctx, "k", "v") },
		"delete": func(ctx context.Context) error { return c.Delete(ctx, "k") },
		"get":    func(ctx context.Context) error { _, err := c.Get(ctx, "k"); return err },
		"getmany": func(ctx context.Context) error {
			_, err := c.GetMany(ctx, []string{"k", "j"})
			return err
		},
	}
	opened := map[string]int{}
	for name, op := range ops {
		for range 15 {
			if err := admin.Do(context.Background(), "CLIENT", "PAUSE", "150", "ALL").Err(); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			op(ctx)
			cancel()
			time.Sleep(200 * time.Millisecond)
			if _, err := c.Get(context.Background(), "probe"); errors.Is(err, packcache.ErrCircuitOpen) {
				opened[name]++
				// Close the breaker again with a fresh cache.
				c = mustNew[string](t, rdb, packcache.WithCircuitBreaker(1, time.Minute), packcache.WithCoalescing(false))
			}
		}
	}
	if len(opened) > 0 {
		t.Errorf("breaker opened by callers' own deadlines (out of 15 each): %v", opened)
	}
}

// ---------------------------------------------------------------------
// Promise 3, the Redis budget on a cluster: a client with no slot map yet
// (a fresh process) and every node hung. The breaker lookup asks the
// client for the key's master under the caller's context, outside the
// budget.

func TestAdvClusterHungBeforeSlotMap(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	for _, n := range cl.Nodes() {
		n.Pause(t)
	}
	defer func() {
		for _, n := range cl.Nodes() {
			n.Resume(t)
		}
	}()
	rdb := cl.Universal(t)
	c := mustNew[string](t, rdb, packcache.WithRedisTimeout(300*time.Millisecond),
		packcache.WithLoader[string](packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
			return "from-loader", nil
		})))
	for _, name := range []string{"background", "long deadline"} {
		ctx := context.Background()
		if name != "background" {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, time.Minute)
			defer cancel()
		}
		start := time.Now()
		v, err := c.Get(ctx, "k")
		el := time.Since(start)
		t.Logf("%s: Get = %q, %v after %v", name, v, err, el)
		if el > 2*time.Second {
			t.Errorf("%s: Get took %v with a 300ms Redis budget", name, el)
		}
	}
	start := time.Now()
	err := c.Set(context.Background(), "k", "v")
	t.Logf("Set: %v after %v", err, time.Since(start))
	if time.Since(start) > 2*time.Second {
		t.Errorf("Set took %v with a 300ms Redis budget", time.Since(start))
	}
}

// ---------------------------------------------------------------------
// Leases left behind when the guarded store fails (OOM) and when the
// loader calls runtime.Goexit; errGoexit does not name the key.

func TestAdvLoaderGoexit(t *testing.T) {
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[string](t, rdb, packcache.WithLoader[string](packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
		runtime.Goexit()
		return "", nil
	})))
	_, err := c.Get(ctx, "gx")
	var pe *packcache.Error
	if !errors.As(err, &pe) || pe.Key != "gx" {
		t.Errorf("Get with a Goexit loader = %v (%T): not an *Error naming the key", err, err)
	}
	if got := rawState(t, rdb, "gx"); got != "<nil>" {
		t.Errorf("after the Get returned, key holds %s", got)
	}
	_, err = c.GetOrLoadMany(ctx, []string{"gm"}, func(ctx context.Context, keys []string) (map[string]string, error) {
		runtime.Goexit()
		return nil, nil
	})
	if !errors.As(err, &pe) || pe.Key != "gm" {
		t.Errorf("GetOrLoadMany with a Goexit fn = %v (%T): not an *Error naming the key", err, err)
	}
	if got := rawState(t, rdb, "gm"); got != "<nil>" {
		t.Errorf("after GetOrLoadMany returned, key holds %s", got)
	}
}

// ---------------------------------------------------------------------
// Promise 8, never a panic: a loaded value whose serialization panics is
// serialized on the cache's load goroutine, outside the loader's recover:
// the whole process dies. (Run alone: ADV_CRASH=1.)

type panicky struct{ N int }

func (panicky) MarshalJSON() ([]byte, error) { panic("MarshalJSON exploded") }

// TestAdvMarshalPanic: a panic in the serializer on a loaded value, in a
// load run on a goroutine of the cache's, must neither kill the process nor
// leave a lease: every caller gets a *PanicError naming the key.
func TestAdvMarshalPanic(t *testing.T) {
	for _, mode := range []string{"get", "nocoalesce", "many"} {
		t.Run(mode, func(t *testing.T) {
			_, rdb := single(t)
			ld := packcache.LoaderFunc[panicky](func(ctx context.Context, key string) (panicky, error) { return panicky{1}, nil })
			opts := []packcache.Option{packcache.WithLoader[panicky](ld)}
			if mode == "nocoalesce" {
				opts = append(opts, packcache.WithCoalescing(false))
			}
			c := mustNew[panicky](t, rdb, opts...)
			var err error
			if mode == "many" {
				_, err = c.GetOrLoadMany(ctxT(t), []string{"p"}, func(ctx context.Context, keys []string) (map[string]panicky, error) {
					return map[string]panicky{"p": {1}}, nil
				})
			} else {
				_, err = c.Get(ctxT(t), "p")
			}
			var pe *packcache.PanicError
			if !errors.As(err, &pe) || !isKeyErr(err, "p") {
				t.Fatalf("err = %v, want a *PanicError naming the key", err)
			}
			if got := rawState(t, rdb, "p"); got != "<nil>" {
				t.Fatalf("after the panic the key holds %s", got)
			}
		})
	}
}

// ---------------------------------------------------------------------
// Promise 1 storm: two "processes" (caches over separate clients), one
// writer per key Setting unique values and Deleting, readers with slow
// loaders (Get, GetOrLoad, GetOrLoadMany), refreshes and stale reloads.
// Every value is unique, so no digest ABA. Checks:
//   - right after the writer's Set(v) returns, its own Get returns v or a
//     value loaded by a loader call that began after the Set began;
//   - after everything ends, Redis holds the last write's value, or
//     nothing, or a loaded value whose loader call began after the last
//     write began; never a lease.

type stormLog struct {
	mu    sync.Mutex
	start map[string]time.Time // loaded value -> when its loader call began
	seq   atomic.Int64
}

func (l *stormLog) load(ctx context.Context, key string) (string, error) {
	n := l.seq.Add(1)
	v := "L" + key + "#" + strconv.FormatInt(n, 10)
	l.mu.Lock()
	l.start[v] = time.Now()
	l.mu.Unlock()
	d := time.Duration(n%7) * 3 * time.Millisecond
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return "", ctx.Err()
	}
	if n%11 == 0 {
		return "", packcache.ErrNotFound
	}
	return v, nil
}

func TestAdvWriteStorm(t *testing.T) {
	for _, mode := range []string{"plain", "refresh+stale", "nocoalesce+window0"} {
		t.Run(mode, func(t *testing.T) {
			forEachTarget(t, func(t *testing.T, tg redistest.Target) { stormOnce(t, tg, mode) })
		})
	}
}

func stormOnce(t *testing.T, tg redistest.Target, mode string) {
	ctx := ctxT(t)
	lg := &stormLog{start: map[string]time.Time{}}
	ld := packcache.LoaderFunc[string](lg.load)
	base := []packcache.Option{packcache.WithLoader[string](ld), packcache.WithPrefix("", packcache.Policy{NegativeTTL: time.Second}), packcache.WithLoadTimeout(2 * time.Second)}
	switch mode {
	case "refresh+stale":
		base = append(base, packcache.WithTTL(60*time.Millisecond), packcache.WithPrefix("", packcache.Policy{RefreshAfter: 20 * time.Millisecond}), packcache.WithPrefix("", packcache.Policy{StaleFor: time.Second}))
	case "nocoalesce+window0":
		base = append(base, packcache.WithCoalescing(false), packcache.WithShareWindow(packcache.Off))
	}
	c1, err := packcache.New[string](tg.Client, base...)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := packcache.New[string](otherClient(t, tg), append(base, packcache.WithLock(30*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"s:a", "s:b", "s:c", "s:{d}1", "s:{d}2"}
	type write struct {
		val   string // "" for delete
		began time.Time
	}
	last := make([]write, len(keys))
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for r := range 6 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			cc := c1
			if r%2 == 1 {
				cc = c2
			}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := keys[(r+i)%len(keys)]
				switch i % 3 {
				case 0:
					cc.Get(ctx, k)
				case 1:
					cctx, cancel := context.WithTimeout(ctx, time.Duration(i%5)*time.Millisecond)
					cc.GetOrLoad(cctx, k, func(ctx context.Context) (string, error) { return lg.load(ctx, k) })
					cancel()
				case 2:
					cc.GetOrLoadMany(ctx, keys[:3+(i%3)], func(ctx context.Context, ks []string) (map[string]string, error) {
						m := map[string]string{}
						for _, k := range ks {
							if v, err := lg.load(ctx, k); err == nil {
								m[k] = v
							}
						}
						return m, nil
					})
				}
			}
		}()
	}
	var writers sync.WaitGroup
	var violations atomic.Int64
	for ki, k := range keys {
		writers.Add(1)
		go func() {
			defer writers.Done()
			cc := c1
			if ki%2 == 1 {
				cc = c2
			}
			for i := range 400 {
				w := write{began: time.Now()}
				if i%4 == 3 {
					if err := cc.Delete(ctx, k); err != nil {
						t.Errorf("Delete: %v", err)
						return
					}
				} else {
					w.val = "W" + k + "#" + strconv.Itoa(i)
					if err := cc.Set(ctx, k, w.val); err != nil {
						t.Errorf("Set: %v", err)
						return
					}
					got, err := cc.Get(ctx, k)
					if err == nil && got != w.val {
						lg.mu.Lock()
						st, loaded := lg.start[got]
						lg.mu.Unlock()
						if !loaded || st.Before(w.began) {
							violations.Add(1)
							t.Errorf("%s: Get right after Set(%s) returned %s (loader began %v before the Set)", k, w.val, got, w.began.Sub(st))
						}
					}
				}
				last[ki] = w
				time.Sleep(time.Duration(i%5) * time.Millisecond)
			}
		}()
	}
	writers.Wait()
	close(stop)
	readers.Wait()
	if err := c1.Close(); err != nil {
		t.Error(err)
	}
	if err := c2.Close(); err != nil {
		t.Error(err)
	}
	for ki, k := range keys {
		got := rawState(t, tg.Client, k)
		w := last[ki]
		switch {
		case got == "<lease>":
			t.Errorf("%s: a lease is left after every call and load ended", k)
		case w.val != "" && got == `"`+w.val+`"`:
		case got == "<nil>" || got == "\x0e":
		default:
			v := strings.Trim(got, `"`)
			lg.mu.Lock()
			st, loaded := lg.start[v]
			lg.mu.Unlock()
			if !loaded {
				t.Errorf("%s: Redis holds %q, last write %q: an older write", k, got, w.val)
			} else if st.Before(w.began) {
				t.Errorf("%s: Redis holds %q, loaded by a call begun %v before the last write (%q)", k, got, w.began.Sub(st), w.val)
			}
		}
	}
}

// ---------------------------------------------------------------------
// Promise 2: Close racing every kind of call, repeatedly; after Close
// returns no goroutine of the cache's may be left, and calls after it
// fail with ErrClosed.

func TestAdvCloseRacingEverything(t *testing.T) {
	s, rdb := single(t)
	redistest.RequireReal(t, s, "counts goroutines, and an embedded miniredis's own would count")
	rdb.Ping(context.Background())
	for round := range 40 {
		ignore := goleak.IgnoreCurrent()
		ld := packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
			select {
			case <-time.After(time.Duration(len(key)%4) * time.Millisecond):
			case <-ctx.Done():
				return "", ctx.Err()
			}
			return "v" + key, nil
		})
		c, err := packcache.New[string](rdb, packcache.WithLoader[string](ld), packcache.WithLoadTimeout(300*time.Millisecond),
			packcache.WithTTL(50*time.Millisecond), packcache.WithPrefix("", packcache.Policy{RefreshAfter: 10 * time.Millisecond}), packcache.WithPrefix("", packcache.Policy{StaleFor: time.Second}),
			packcache.WithLock(20*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var afterClose atomic.Int64
		closed := make(chan struct{})
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 200; i++ {
					k := "c" + strconv.Itoa((g*7+i)%9)
					var err error
					began := false // began after Close returned
					select {
					case <-closed:
						began = true
					default:
					}
					switch (g + i) % 7 {
					case 0:
						_, err = c.Get(context.Background(), k)
					case 1:
						cctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
						_, err = c.Get(cctx, k)
						cancel()
					case 2:
						err = c.Set(context.Background(), k, "s")
					case 3:
						err = c.Delete(context.Background(), k, "c1")
					case 4:
						_, err = c.GetMany(context.Background(), []string{k, "c2"})
					case 5:
						_, err = c.GetOrLoadMany(context.Background(), []string{k, "c3", "c4"}, func(ctx context.Context, ks []string) (map[string]string, error) {
							m := map[string]string{}
							for _, k := range ks {
								m[k] = "m" + k
							}
							return m, nil
						})
					case 6:
						err = c.SetMany(context.Background(), map[string]string{k: "x", "c5": "y"})
					}
					if began {
						// A call that began after Close returned.
						if !errors.Is(err, packcache.ErrClosed) {
							afterClose.Add(1)
						}
						return
					}
				}
			}()
		}
		time.Sleep(time.Duration(round%10) * time.Millisecond)
		var cw sync.WaitGroup
		for range 3 {
			cw.Add(1)
			go func() {
				defer cw.Done()
				if err := c.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}()
		}
		cw.Wait()
		leak := goleak.Find(ignore, goleak.IgnoreTopFunction("github.com/packcache/packcache_test.TestAdvCloseRacingEverything.func2"),
			goleak.IgnoreAnyFunction("github.com/packcache/packcache_test.TestAdvCloseRacingEverything.func2"))
		close(closed)
		wg.Wait()
		if leak != nil {
			t.Fatalf("round %d: goroutines left after Close returned: %v", round, leak)
		}
		if n := afterClose.Load(); n > 0 {
			t.Fatalf("round %d: %d calls after Close did not fail with ErrClosed", round, n)
		}
		ks, _ := rdb.Keys(context.Background(), "c*").Result()
		for _, k := range ks {
			if rawState(t, rdb, k) == "<lease>" {
				t.Errorf("round %d: lease left in %s after Close returned", round, k)
			}
		}
	}
}

// ---------------------------------------------------------------------
// WithDecodePerCaller: a stored value the serializer cannot decode is
// judged a hit (decoding is deferred to each caller), so a read-through
// Get never reloads it: every Get fails with ErrSerialization, forever.

func TestAdvPerCallerUndecodableNotReloaded(t *testing.T) {
	_, rdb := single(t)
	ctx := ctxT(t)
	rdb.Set(ctx, "n", `"not a number"`, 0)
	var calls atomic.Int64
	ld := packcache.LoaderFunc[int](func(ctx context.Context, key string) (int, error) { calls.Add(1); return 42, nil })
	for _, per := range []bool{false, true} {
		rdb.Set(ctx, "n", `"not a number"`, 0)
		opts := []packcache.Option{packcache.WithLoader[int](ld)}
		if per {
			opts = append(opts, packcache.WithDecodePerCaller())
		}
		c := mustNew[int](t, rdb, opts...)
		v, err := c.Get(ctx, "n")
		t.Logf("perCaller=%v: Get = %d, %v; Redis holds %s", per, v, err, rawState(t, rdb, "n"))
		if err != nil || v != 42 {
			t.Errorf("perCaller=%v: read-through Get of an undecodable value = %d, %v; want it reloaded (42)", per, v, err)
		}
	}
}

// GetOrLoadMany waits for other processes' leases one key after another:
// with WithLock(w), n leased keys take n*w, past the load timeout.
func TestAdvBatchLockWaitsSequential(t *testing.T) {
	_, rdb := single(t)
	ctx := ctxT(t)
	var keys []string
	for i := range 8 {
		k := "lk" + strconv.Itoa(i)
		keys = append(keys, k)
		// A dead process's lease.
		rdb.Set(ctx, k, "\x0cdeadprocesslease", 30*time.Second)
	}
	c := mustNew[string](t, rdb, packcache.WithLock(300*time.Millisecond), packcache.WithLoadTimeout(time.Second))
	start := time.Now()
	m, err := c.GetOrLoadMany(ctx, keys, func(ctx context.Context, ks []string) (map[string]string, error) {
		out := map[string]string{}
		for _, k := range ks {
			out[k] = "v"
		}
		return out, nil
	})
	t.Logf("GetOrLoadMany: %d values, err %v, after %v", len(m), err, time.Since(start))
	if len(m) != len(keys) {
		t.Errorf("GetOrLoadMany got %d of %d values (each lease waited for in turn, 8 x 300ms > 1s load timeout)", len(m), len(keys))
	}
	// Compare: one Get per key in parallel would each wait 300ms.
}

// Share window 0 with the breaker open: no read at all, yet a Get arriving
// much later shares the first Get's loader call.
func TestAdvWindowZeroSharesLoaderWhenBreakerOpen(t *testing.T) {
	s, rdb := single(t)
	ctx := ctxT(t)
	var calls atomic.Int64
	ld := packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
		n := calls.Add(1)
		time.Sleep(400 * time.Millisecond)
		return "load" + strconv.FormatInt(n, 10), nil
	})
	c := mustNew[string](t, rdb, packcache.WithShareWindow(packcache.Off), packcache.WithCircuitBreaker(1, time.Minute),
		packcache.WithRedisTimeout(100*time.Millisecond), packcache.WithLoader[string](ld))
	s.Stop(t)
	c.Get(ctx, "warm") // opens the breaker
	calls.Store(0)
	done := make(chan string, 2)
	go func() { v, _ := c.Get(ctx, "k"); done <- v }()
	time.Sleep(200 * time.Millisecond)
	go func() { v, _ := c.Get(ctx, "k"); done <- v }()
	a, b := <-done, <-done
	t.Logf("values %q %q, loader calls %d", a, b, calls.Load())
	if calls.Load() != 2 {
		t.Errorf("with share window 0, a Get 200ms after another shared its loader call (no read was in flight)")
	}
}

// ---------------------------------------------------------------------
// Promise 7 in every configuration: a loader (Get's, a stale reload's,
// GetOrLoadMany's fn) calling Get / GetOrLoad / GetOrLoadMany on its own
// key gets ErrReentrantLoad at once.

func TestAdvReentrantEverywhere(t *testing.T) {
	_, rdb := single(t)
	cfgs := map[string][]packcache.Option{
		"default":    nil,
		"window0":    {packcache.WithShareWindow(packcache.Off)},
		"nocoalesce": {packcache.WithCoalescing(false)},
		"lock":       {packcache.WithLock(time.Second)},
		"bigwindow":  {packcache.WithShareWindow(time.Hour)},
	}
	for name, extra := range cfgs {
		for _, inner := range []string{"get", "getorload", "many", "many-other-first"} {
			t.Run(name+"/"+inner, func(t *testing.T) {
				ctx := ctxT(t)
				var c *packcache.Cache[string]
				var innerErr error
				ld := packcache.LoaderFunc[string](func(lctx context.Context, key string) (string, error) {
					start := time.Now()
					switch inner {
					case "get":
						_, innerErr = c.Get(lctx, key)
					case "getorload":
						_, innerErr = c.GetOrLoad(lctx, key, func(context.Context) (string, error) { return "x", nil })
					case "many":
						_, innerErr = c.GetOrLoadMany(lctx, []string{key}, func(context.Context, []string) (map[string]string, error) { return nil, nil })
					case "many-other-first":
						_, innerErr = c.GetOrLoadMany(lctx, []string{"other", key}, func(_ context.Context, ks []string) (map[string]string, error) {
							return map[string]string{"other": "o"}, nil
						})
					}
					if time.Since(start) > 500*time.Millisecond {
						innerErr = errors.New("inner call waited " + time.Since(start).String())
					}
					return "v", nil
				})
				c = mustNew[string](t, rdb, append([]packcache.Option{packcache.WithLoader[string](ld), packcache.WithLoadTimeout(3 * time.Second)}, extra...)...)
				rdb.Del(ctx, "r", "other")
				if _, err := c.Get(ctx, "r"); err != nil {
					t.Fatal(err)
				}
				if !errors.Is(innerErr, packcache.ErrReentrantLoad) {
					t.Errorf("inner %s: %v, want ErrReentrantLoad", inner, innerErr)
				}
			})
		}
	}
}

// GetOrLoadMany racing Set and Delete of some of its keys; StaleFor reload
// racing Delete; WithLock takeover racing Set.
func TestAdvBatchRacingWrites(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		if tg.Server != nil {
			redistest.RequireReal(t, tg.Server, "needs TTLs to run down in real time")
		}
		ctx := ctxT(t)
		c := mustNew[string](t, tg.Client)
		entered, release := make(chan struct{}), make(chan struct{})
		done := make(chan map[string]string)
		go func() {
			m, _ := c.GetOrLoadMany(ctx, []string{"b1", "b2", "b3"}, func(ctx context.Context, ks []string) (map[string]string, error) {
				close(entered)
				<-release
				return map[string]string{"b1": "old1", "b2": "old2", "b3": "old3"}, nil
			})
			done <- m
		}()
		<-entered
		other := mustNew[string](t, otherClient(t, tg))
		if err := other.Set(ctx, "b1", "new1"); err != nil {
			t.Fatal(err)
		}
		if err := c.Delete(ctx, "b2"); err != nil {
			t.Fatal(err)
		}
		close(release)
		<-done
		if v, err := c.Get(ctx, "b1"); v != "new1" {
			t.Errorf("Get b1 after Set = %q, %v", v, err)
		}
		if _, err := c.Get(ctx, "b2"); !errors.Is(err, packcache.ErrMiss) {
			t.Errorf("Get b2 after Delete = %v", err)
		}
		for k, want := range map[string]string{"b1": `"new1"`, "b2": "<nil>", "b3": `"old3"`} {
			if got := rawState(t, tg.Client, k); got != want {
				t.Errorf("%s holds %s, want %s", k, got, want)
			}
		}
	})
}

func TestAdvStaleReloadRacingDelete(t *testing.T) {
	s, rdb := single(t)
	redistest.RequireReal(t, s, "needs TTLs to run down in real time")
	ctx := ctxT(t)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	ld := packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
		entered <- struct{}{}
		<-release
		return "reloaded", nil
	})
	c := mustNew[string](t, rdb, packcache.WithLoader[string](ld), packcache.WithTTL(50*time.Millisecond), packcache.WithPrefix("", packcache.Policy{StaleFor: time.Minute}))
	c.Set(ctx, "st", "A")
	time.Sleep(80 * time.Millisecond)
	go c.Get(ctx, "st") // stale: reloads
	<-entered
	c.Delete(ctx, "st")
	close(release)
	c.Close()
	if got := rawState(t, rdb, "st"); got != "<nil>" {
		t.Errorf("stale reload stored over Delete: %s", got)
	}
}

func TestAdvLockTakeoverRacingSet(t *testing.T) {
	_, rdb := single(t)
	ctx := ctxT(t)
	pEntered, pRelease := make(chan struct{}, 1), make(chan struct{})
	p := mustNew[string](t, rdb, packcache.WithLoader[string](packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
		pEntered <- struct{}{}
		<-pRelease
		return "fromP", nil
	})))
	qEntered, qRelease := make(chan struct{}, 1), make(chan struct{})
	q := mustNew[string](t, rdb.(*redis.Client), packcache.WithLock(100*time.Millisecond), packcache.WithLoader[string](packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
		qEntered <- struct{}{}
		<-qRelease
		return "fromQ", nil
	})))
	w := mustNew[string](t, rdb)
	go p.Get(ctx, "tk")
	<-pEntered
	qDone := make(chan string)
	go func() { v, _ := q.Get(ctx, "tk"); qDone <- v }()
	<-qEntered // Q took P's lease over after 100ms
	if err := w.Set(ctx, "tk", "written"); err != nil {
		t.Fatal(err)
	}
	close(qRelease)
	<-qDone
	close(pRelease)
	p.Close()
	q.Close()
	if got := rawState(t, rdb, "tk"); got != `"written"` {
		t.Errorf("after takeover + Set, Redis holds %s", got)
	}
}

// Raw values that look like a lease, a tombstone or a header round-trip.
func TestAdvRawLookalikes(t *testing.T) {
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[[]byte](t, rdb, packcache.WithMaxValueSize(1000))
	for _, v := range [][]byte{{}, {0x0c}, {0x0c, 'a'}, {0x0e}, {0x0e, 0}, {0x1f}, {0x1f, 0x8b}, {0x7f}, []byte(strings.Repeat("a", 1000))} {
		if err := c.Set(ctx, "raw", v); err != nil {
			t.Fatalf("Set %q: %v", v, err)
		}
		got, err := c.Get(ctx, "raw")
		if err != nil || string(got) != string(v) {
			t.Errorf("Set %q, Get = %q, %v (stored %q)", v, got, err, rawGet(t, rdb, "raw"))
		}
		m, err := c.GetMany(ctx, []string{"raw"})
		if err != nil || string(m["raw"]) != string(v) {
			t.Errorf("Set %q, GetMany = %q, %v", v, m["raw"], err)
		}
	}
	if err := c.Set(ctx, "raw", []byte(strings.Repeat("a", 1001))); !errors.Is(err, packcache.ErrTooLarge) {
		t.Errorf("Set of 1001 bytes = %v", err)
	}
}

// Promise 3, once per operation per node: a GetOrLoadMany whose keys hold
// other processes' leases re-reads each key on its own; when the node dies
// after the batch read, one operation counts one failure per key.

type afterGetsHook struct {
	enabled atomic.Bool
	fire    func()
}

func (h *afterGetsHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *afterGetsHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *afterGetsHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if len(cmds) > 1 && cmds[0].Name() == "get" && h.enabled.CompareAndSwap(true, false) {
			h.fire()
		}
		return err
	}
}

func TestAdvBatchCountsFailurePerKey(t *testing.T) {
	s := redistest.Start(t)
	cl := s.Client(t)
	h := &afterGetsHook{fire: func() { s.Stop(t) }}
	cl.AddHook(h)
	ctx := ctxT(t)
	var keys []string
	for i := range 5 {
		k := "fl" + strconv.Itoa(i)
		keys = append(keys, k)
		cl.Set(ctx, k, "\x0cforeign", time.Minute)
	}
	c := mustNew[string](t, cl, packcache.WithCircuitBreaker(3, time.Minute), packcache.WithRedisTimeout(200*time.Millisecond))
	h.enabled.Store(true)
	_, err := c.GetOrLoadMany(ctx, keys, func(ctx context.Context, ks []string) (map[string]string, error) {
		m := map[string]string{}
		for _, k := range ks {
			m[k] = "v"
		}
		return m, nil
	})
	t.Logf("GetOrLoadMany: %v", err)
	_, err = c.Get(ctx, "probe")
	t.Logf("Get after one failed operation: %v", err)
	if errors.Is(err, packcache.ErrCircuitOpen) {
		t.Errorf("a breaker of 3 failures opened after one GetOrLoadMany (plus this Get)")
	}
}
