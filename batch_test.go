package packcache_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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

// TestOneJudgementForAllCalls runs every state a key can be in through the
// four reading calls, on a single node and on the cluster: Get and GetMany
// (no loader) must agree, and GetOrLoad and GetOrLoadMany (a loader) must
// agree, on the value, the error, whether the loader runs and what Redis
// holds afterwards.
func TestOneJudgementForAllCalls(t *testing.T) {
	t.Parallel()
	const (
		ttl          = time.Hour
		staleFor     = time.Hour
		refreshAfter = 30 * time.Minute
	)
	type want struct {
		val     string // the value's ID; "" for none
		err     error  // what the error matches; nil for none
		loads   int64  // loader calls
		after   string // what Redis holds afterwards: a substring, "unchanged", "<nil>", "<list>"
		eventby string // with a refresh: what Redis holds eventually
	}
	type state struct {
		name     string
		setup    func(ctx context.Context, tg redistest.Target, key string)
		lock     bool  // the cache has WithLock
		loadErr  error // the loader fails
		plain    want  // Get and GetMany
		readThru want  // GetOrLoad and GetOrLoadMany
	}
	stored := func(pttl time.Duration) func(ctx context.Context, tg redistest.Target, key string) {
		return func(ctx context.Context, tg redistest.Target, key string) {
			tg.Client.Set(ctx, key, fmt.Sprintf(`{"id":"stored","title":%q}`, key), pttl)
		}
	}
	raw := func(v string, pttl time.Duration) func(ctx context.Context, tg redistest.Target, key string) {
		return func(ctx context.Context, tg redistest.Target, key string) { tg.Client.Set(ctx, key, v, pttl) }
	}
	lease := "\x0cforeign-process-lease"
	states := []state{
		{name: "hit", setup: stored(ttl + staleFor),
			plain:    want{val: "stored", after: "unchanged"},
			readThru: want{val: "stored", after: "unchanged"}},
		{name: "miss", setup: func(context.Context, redistest.Target, string) {},
			plain:    want{err: packcache.ErrMiss, after: "<nil>"},
			readThru: want{val: "loaded", loads: 1, after: `"loaded"`}},
		{name: "tombstone", setup: raw("\x0e", time.Minute),
			plain:    want{err: packcache.ErrNotFound, after: "unchanged"},
			readThru: want{err: packcache.ErrNotFound, after: "unchanged"}},
		{name: "foreign-lease", setup: raw(lease, time.Minute),
			plain:    want{err: packcache.ErrMiss, after: "unchanged"},
			readThru: want{val: "loaded", loads: 1, after: "unchanged"}},
		{name: "foreign-lease-with-lock", setup: raw(lease, time.Minute), lock: true,
			plain:    want{err: packcache.ErrMiss, after: "unchanged"},
			readThru: want{val: "loaded", loads: 1, after: `"loaded"`}},
		{name: "undecodable", setup: raw("\x06garbage", time.Minute),
			plain:    want{err: packcache.ErrUnknownHeader, after: "unchanged"},
			readThru: want{val: "loaded", loads: 1, after: `"loaded"`}},
		{name: "wrong-type", setup: func(ctx context.Context, tg redistest.Target, key string) { tg.Client.RPush(ctx, key, "x") },
			plain:    want{err: packcache.ErrRedis, after: "<list>"},
			readThru: want{val: "loaded", loads: 1, after: "<list>"}},
		{name: "stale", setup: stored(staleFor / 2),
			plain:    want{err: packcache.ErrMiss, after: "unchanged"},
			readThru: want{val: "loaded", loads: 1, after: `"loaded"`}},
		{name: "stale-load-fails", setup: stored(staleFor / 2), loadErr: errors.New("database down"),
			plain:    want{err: packcache.ErrMiss, after: "unchanged"},
			readThru: want{val: "stored", loads: 1, after: "unchanged"}},
		{name: "refresh-due", setup: stored(ttl + staleFor - refreshAfter - time.Minute),
			plain:    want{val: "stored", after: "unchanged"},
			readThru: want{val: "stored", loads: 1, eventby: `"loaded"`}},
	}
	calls := []string{"Get", "GetMany", "GetOrLoad", "GetOrLoadMany"}
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		for _, st := range states {
			for _, call := range calls {
				t.Run(st.name+"/"+call, func(t *testing.T) {
					ctx := ctxT(t)
					key := "judge:" + tg.Name + ":" + st.name + ":" + call
					tg.Client.Del(ctx, key)
					st.setup(ctx, tg, key)
					before, _ := tg.Client.Get(ctx, key).Result()
					opts := []packcache.Option{packcache.WithRedisTimeout(time.Minute), packcache.WithTTL(ttl), packcache.WithPrefix("", packcache.Policy{StaleFor: staleFor}), packcache.WithPrefix("", packcache.Policy{RefreshAfter: refreshAfter})}
					if st.lock {
						opts = append(opts, packcache.WithLock(200*time.Millisecond))
					}
					c := mustNew[Channel](t, tg.Client, opts...)
					var loads atomic.Int64
					load := func() (Channel, error) {
						loads.Add(1)
						return Channel{ID: "loaded"}, st.loadErr
					}
					var v Channel
					var err error
					w := st.plain
					switch call {
					case "Get":
						v, err = c.Get(ctx, key)
					case "GetMany":
						var m map[string]Channel
						m, err = c.GetMany(ctx, []string{key})
						v = m[key]
					case "GetOrLoad":
						w = st.readThru
						v, err = c.GetOrLoad(ctx, key, func(context.Context) (Channel, error) { return load() })
					case "GetOrLoadMany":
						w = st.readThru
						var m map[string]Channel
						m, err = c.GetOrLoadMany(ctx, []string{key}, func(_ context.Context, keys []string) (map[string]Channel, error) {
							v, err := load()
							return map[string]Channel{keys[0]: v}, err
						})
						v = m[key]
					}
					// The batch calls leave ErrMiss and ErrNotFound
					// keys out of their maps without an error.
					batch := strings.HasSuffix(call, "Many")
					wantErr := w.err
					if batch && (errors.Is(wantErr, packcache.ErrMiss) || errors.Is(wantErr, packcache.ErrNotFound)) {
						wantErr = nil
					}
					switch {
					case wantErr == nil && err != nil:
						t.Fatalf("error %v, want none", err)
					case wantErr != nil && !errors.Is(err, wantErr):
						t.Fatalf("error %v, want %v", err, wantErr)
					case wantErr != nil && !errors.Is(err, packcache.ErrMiss) && !errors.Is(err, packcache.ErrNotFound) && !isKeyErr(err, key):
						t.Fatalf("error %v does not name the key", err)
					}
					if v.ID != w.val {
						t.Fatalf("value %q, want %q", v.ID, w.val)
					}
					if w.eventby == "" && loads.Load() != w.loads {
						t.Fatalf("loader called %d times, want %d", loads.Load(), w.loads)
					}
					check := func(want string) bool {
						typ := tg.Client.Type(ctx, key).Val()
						now, gerr := tg.Client.Get(ctx, key).Result()
						switch want {
						case "": // racing a background refresh: see eventby
							return true
						case "unchanged":
							return now == before
						case "<nil>":
							return typ == "none"
						case "<list>":
							return typ == "list"
						}
						return gerr == nil && strings.Contains(now, want)
					}
					if !check(w.after) {
						t.Fatalf("Redis holds %q (was %q), want %s", tg.Client.Get(ctx, key).Val(), before, w.after)
					}
					if w.eventby != "" {
						if !eventually(time.Minute, func() bool { return check(w.eventby) }) {
							t.Fatalf("the refresh did not store: Redis holds %q", tg.Client.Get(ctx, key).Val())
						}
						if loads.Load() != w.loads {
							t.Fatalf("loader called %d times, want %d", loads.Load(), w.loads)
						}
					}
					if raw := tg.Client.Get(ctx, key).Val(); raw != "" && raw[0] == codec.HeaderLease && raw != lease {
						t.Fatalf("a lease of this cache's was left behind: %q", raw)
					}
				})
			}
		}
		t.Run("caller-context", func(t *testing.T) { testCallerContext(t, tg, calls) })
	})
}

// testCallerContext: a caller whose context is cancelled, or whose
// deadline passes while Redis is paused (CLIENT PAUSE), gets its context's
// error from every reading call; that is never a Redis failure (not
// counted, not told to the error handler) and never makes the cache load a
// key that Redis holds. A batch stops there and loads nothing at all; a
// Get's read and load, shared and detached from its first caller, go on
// for the others.
func testCallerContext(t *testing.T, tg redistest.Target, calls []string) {
	if tg.Server != nil {
		redistest.RequireReal(t, tg.Server, "CLIENT PAUSE")
	}
	for _, kind := range []string{"cancelled", "expiring"} {
		for _, held := range []bool{true, false} {
			for _, call := range calls {
				name := kind + "/" + map[bool]string{true: "held", false: "missing"}[held] + "/" + call
				t.Run(name, func(t *testing.T) {
					ctx := ctxT(t)
					key := "caller-ctx:{" + name + "}"
					tg.Client.Del(ctx, key)
					if held {
						tg.Client.Set(ctx, key, `{"id":"stored"}`, time.Hour)
					}
					var reported atomic.Int64
					// A minute's budget: the read the call left running outlasts
					// the pause, and on a loaded machine it must not time out
					// and count as a Redis failure.
					c, err := packcache.New[Channel](tg.Client, packcache.WithRedisTimeout(time.Minute), packcache.WithErrorHandler(func(context.Context, string, error) { reported.Add(1) }))
					if err != nil {
						t.Fatal(err)
					}
					var loads atomic.Int64
					one := func(context.Context) (Channel, error) { loads.Add(1); return Channel{ID: "loaded"}, nil }
					many := func(_ context.Context, keys []string) (map[string]Channel, error) {
						loads.Add(1)
						return map[string]Channel{keys[0]: {ID: "loaded"}}, nil
					}
					c.Get(ctx, "caller-ctx:warm") // connections made before any pause
					cctx, cancel := context.WithCancel(ctx)
					want := context.Canceled
					if kind == "cancelled" {
						cancel()
					} else {
						defer cancel()
						want = context.DeadlineExceeded
						cctx, cancel = context.WithTimeout(ctx, 30*time.Millisecond)
						defer cancel()
						pause := func(ctx context.Context, c *redis.Client) error {
							return c.ClientPause(ctx, 300*time.Millisecond).Err()
						}
						if cl, ok := tg.Client.(*redis.ClusterClient); ok {
							err = cl.ForEachMaster(ctx, pause)
						} else {
							err = pause(ctx, tg.Client.(*redis.Client))
						}
						if err != nil {
							t.Fatal(err)
						}
					}
					switch call {
					case "Get":
						_, err = c.Get(cctx, key)
					case "GetMany":
						_, err = c.GetMany(cctx, []string{key})
					case "GetOrLoad":
						_, err = c.GetOrLoad(cctx, key, one)
					case "GetOrLoadMany":
						_, err = c.GetOrLoadMany(cctx, []string{key}, many)
					}
					if !errors.Is(err, want) || errors.Is(err, packcache.ErrRedis) {
						t.Fatalf("error %v, want %v and no Redis failure", err, want)
					}
					if err := c.Close(); err != nil { // waits for the reads and loads the call left running
						t.Fatal(err)
					}
					st := c.Stats()
					if st.RedisErrors != 0 || reported.Load() != 0 {
						t.Fatalf("the caller's context counted as %d Redis errors, %d reports", st.RedisErrors, reported.Load())
					}
					if n := loads.Load(); n != 0 && (held || kind == "cancelled" || strings.HasSuffix(call, "Many")) {
						t.Fatalf("loader called %d times", n)
					}
				})
			}
		}
	}
}

// TestStrictStoreFailureAllCalls: a loaded value that Redis fails to store
// (here: the server stops during the load) is an error with
// WithStrictRedis and the value without it, for GetOrLoad and
// GetOrLoadMany alike.
func TestStrictStoreFailureAllCalls(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "stops the server mid-load")
	rdb := s.Client(t)
	ctx := ctxT(t)
	load := func(ctx context.Context) (Channel, error) {
		s.Pause(t) // after the lease: the store is what fails
		return Channel{ID: "loaded"}, nil
	}
	for _, strict := range []bool{false, true} {
		opts := []packcache.Option{packcache.WithRedisTimeout(200 * time.Millisecond), packcache.WithCircuitBreaker(1000, time.Second)}
		if strict {
			opts = append(opts, packcache.WithStrictRedis())
		}
		c := mustNew[Channel](t, rdb, opts...)
		check := func(call string, v Channel, err error) {
			t.Helper()
			s.Resume(t)
			if strict && !errors.Is(err, packcache.ErrRedis) {
				t.Errorf("strict %s: %+v, %v; want ErrRedis; stats %+v", call, v, err, c.Stats())
			}
			if !strict && (err != nil || v.ID != "loaded") {
				t.Errorf("%s: %+v, %v; want the loaded value", call, v, err)
			}
		}
		key := fmt.Sprintf("strict-%v:one", strict)
		v, err := c.GetOrLoad(ctx, key, load)
		check("GetOrLoad", v, err)
		key = fmt.Sprintf("strict-%v:many", strict)
		m, err := c.GetOrLoadMany(ctx, []string{key}, func(ctx context.Context, keys []string) (map[string]Channel, error) {
			v, err := load(ctx)
			return map[string]Channel{keys[0]: v}, err
		})
		check("GetOrLoadMany", m[key], err)
	}
}

// countingJSON is packcache.JSON counting its Marshal calls.
type countingJSON struct{ marshals atomic.Int64 }

func (s *countingJSON) Marshal(dst []byte, v any) ([]byte, error) {
	s.marshals.Add(1)
	return packcache.JSON.Marshal(dst, v)
}
func (s *countingJSON) Unmarshal(data []byte, v any) error { return packcache.JSON.Unmarshal(data, v) }
func (s *countingJSON) Text() bool                         { return true }

// TestLoadedValueMarshalledOnce: a loaded value is serialized once, for its
// store and for callers that decode their own copy, by GetOrLoad and
// GetOrLoadMany alike.
func TestLoadedValueMarshalledOnce(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	ser := &countingJSON{}
	c := mustNew[Channel](t, rdb, packcache.WithSerializer(ser), packcache.WithDecodePerCaller())
	if v, err := c.GetOrLoad(ctx, "once:one", func(context.Context) (Channel, error) { return Channel{ID: "one"}, nil }); err != nil || v.ID != "one" {
		t.Fatal(v, err)
	}
	if n := ser.marshals.Swap(0); n != 1 {
		t.Errorf("GetOrLoad of one key: %d marshals, want 1", n)
	}
	m, err := c.GetOrLoadMany(ctx, []string{"once:a", "once:b"}, func(ctx context.Context, keys []string) (map[string]Channel, error) {
		out := map[string]Channel{}
		for _, k := range keys {
			out[k] = Channel{ID: k}
		}
		return out, nil
	})
	if err != nil || m["once:a"].ID != "once:a" || m["once:b"].ID != "once:b" {
		t.Fatal(m, err)
	}
	if n := ser.marshals.Load(); n != 2 {
		t.Errorf("GetOrLoadMany of two keys: %d marshals, want 2", n)
	}
}

func TestTwoBatchesDeadlock(t *testing.T) {
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

// GetOrLoadMany waits for other processes' leases one key after another:
// with WithLock(w), n leased keys take n*w, past the load timeout.
func TestBatchLockWaitsSequential(t *testing.T) {
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

// GetOrLoadMany racing Set and Delete of some of its keys; StaleFor reload
// racing Delete; WithLock takeover racing Set.
func TestBatchRacingWrites(t *testing.T) {
	t.Parallel()
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

type afterGetsHook struct {
	enabled atomic.Bool
	fire    func()
}

func (h *afterGetsHook) DialHook(next redis.DialHook) redis.DialHook { return next }

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

func TestBatchCountsFailurePerKey(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	cl := s.Client(t)
	// Paused, not stopped: a refused connection would open the breaker at
	// once, whatever the count (TestKilledRedisFailsFast).
	h := &afterGetsHook{fire: func() { s.Pause(t) }}
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
