package packcache_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
	"go.uber.org/goleak"
)

// TestCloseDuringTraffic: Close, called three times at once while fifty
// goroutines make every kind of call, neither panics nor hangs; once it has
// returned, every call fails with ErrClosed; and no goroutine of the
// cache's is left.
func TestCloseDuringTraffic(t *testing.T) {
	redistest.RequireServer(t, "waits on timings and goroutine counts an embedded miniredis would change")
	// Beside the other tests, but counting goroutines in a process of
	// its own.
	t.Parallel()
	if !redistest.Alone(t) {
		return
	}
	_, rdb := single(t)
	ctx := ctxT(t)
	baseline := runtime.NumGoroutine()
	load := packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
		time.Sleep(time.Millisecond)
		return Channel{ID: key}, nil
	})
	// A refresh on nearly every Get, on a loaded machine: the Redis budget
	// is not what this test is about.
	c, err := packcache.New[Channel](rdb, packcache.WithLoader(load), packcache.WithPrefix("", packcache.Policy{RefreshAfter: time.Millisecond}), packcache.WithTTL(time.Minute),
		packcache.WithRedisTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	batch := func(ctx context.Context, keys []string) (map[string]Channel, error) {
		m := map[string]Channel{}
		for _, k := range keys {
			m[k] = Channel{ID: k}
		}
		return m, nil
	}
	var stop atomic.Bool
	var unexpected atomic.Value
	var wg sync.WaitGroup
	var ops atomic.Int64
	for w := range 50 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				ops.Add(1)
				k := fmt.Sprintf("close:%d", (w+i)%20)
				var err error
				switch i % 7 {
				case 0:
					_, err = c.Get(ctx, k)
				case 1:
					_, err = c.GetOrLoad(ctx, k, func(ctx context.Context) (Channel, error) { return Channel{ID: k}, nil })
				case 2:
					err = c.Set(ctx, k, Channel{ID: k})
				case 3:
					err = c.Delete(ctx, k)
				case 4:
					_, err = c.GetMany(ctx, []string{k, k + "x"})
				case 5:
					err = c.SetMany(ctx, map[string]Channel{k: {ID: k}})
				case 6:
					_, err = c.GetOrLoadMany(ctx, []string{k, k + "y"}, batch)
				}
				if err != nil && !errors.Is(err, packcache.ErrClosed) && !errors.Is(err, packcache.ErrMiss) {
					unexpected.Store(fmt.Errorf("%T: %w", err, err)) // one type: errors of several types may come
				}
			}
		})
	}
	waitFor(t, 10*time.Second, "traffic under way", func() bool { return ops.Load() >= 2000 })
	errs := make(chan error, 3)
	for range 3 {
		go func() { errs <- c.Close() }()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	// Every call made after Close returned fails with ErrClosed, the same
	// keyed error for every call.
	if _, err := c.Get(ctx, "close:1"); !closedFor(err, "close:1") {
		t.Errorf("Get after Close: %v", err)
	}
	if _, err := c.GetOrLoad(ctx, "close:1", func(context.Context) (Channel, error) { return Channel{}, nil }); !closedFor(err, "close:1") {
		t.Errorf("GetOrLoad after Close: %v", err)
	}
	if err := c.Set(ctx, "close:1", Channel{}); !closedFor(err, "close:1") {
		t.Errorf("Set after Close: %v", err)
	}
	if err := c.Delete(ctx, "close:1"); !closedFor(err, "close:1") {
		t.Errorf("Delete after Close: %v", err)
	}
	if _, err := c.GetMany(ctx, []string{"close:1"}); !closedFor(err, "close:1") {
		t.Errorf("GetMany after Close: %v", err)
	}
	if err := c.SetMany(ctx, map[string]Channel{"close:1": {}}); !closedFor(err, "close:1") {
		t.Errorf("SetMany after Close: %v", err)
	}
	if _, err := c.GetOrLoadMany(ctx, []string{"close:1"}, batch); !closedFor(err, "close:1") {
		t.Errorf("GetOrLoadMany after Close: %v", err)
	}
	stop.Store(true)
	wg.Wait()
	if err, _ := unexpected.Load().(error); err != nil {
		t.Errorf("a call during Close failed with %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("a fourth Close: %v", err)
	}
	if n := waitGoroutines(baseline, 3*time.Second); n > baseline {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines after Close, %d before:\n%s", n, baseline, buf[:runtime.Stack(buf, true)])
	}
}

// TestCloseWaitsForBackgroundWork: a load whose callers have left, and a
// background refresh, go on after Close begins; Close returns once they
// have ended, and their values are stored. The loads are held until Close
// is seen waiting for them, so that nothing depends on how long anything
// takes on a busy machine.
func TestCloseWaitsForBackgroundWork(t *testing.T) {
	redistest.RequireServer(t, "waits on timings and goroutine counts an embedded miniredis would change")
	_, rdb := single(t)
	ctx := ctxT(t)
	var hold atomic.Bool
	started := make(chan string, 2)
	release := make(chan struct{})
	load := packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
		if hold.Load() {
			started <- key
			<-release // ignores ctx: Close must wait for it all the same
		}
		return Channel{ID: key, Title: "loaded"}, nil
	})
	c, err := packcache.New[Channel](rdb, packcache.WithLoader(load), packcache.WithPrefix("", packcache.Policy{RefreshAfter: 50 * time.Millisecond}), packcache.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	// A value due for refresh, written as another process would.
	old, _ := packcache.New[Channel](rdb, packcache.WithTTL(time.Minute))
	defer old.Close()
	if err := old.Set(ctx, "bg:refresh", Channel{ID: "bg:refresh", Title: "old"}); err != nil {
		t.Fatal(err)
	}
	rdb.PExpire(ctx, "bg:refresh", time.Minute-60*time.Millisecond) // 60 ms old: due for refresh
	hold.Store(true)
	if v, err := c.Get(ctx, "bg:refresh"); err != nil || v.Title != "old" {
		t.Fatalf("Get of a value due for refresh: %+v, %v", v, err)
	}
	if k := <-started; k != "bg:refresh" {
		t.Fatalf("loaded %q, want the refresh of bg:refresh", k)
	}
	// A caller that leaves once its load has begun.
	leaving, cancel := context.WithCancel(ctx)
	left := make(chan error, 1)
	go func() {
		_, err := c.Get(leaving, "bg:detached")
		left <- err
	}()
	if k := <-started; k != "bg:detached" {
		t.Fatalf("loaded %q, want bg:detached", k)
	}
	cancel()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("caller that leaves: %v", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	// Close waits for the held loads: its goroutine blocks in close's
	// select, and it does not return meanwhile.
	waitFor(t, time.Minute, "Close waiting for the held loads", func() bool {
		select {
		case err := <-closed:
			t.Fatalf("Close returned while the loads were held: %v", err)
		default:
		}
		buf := make([]byte, 1<<20)
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "[select") && strings.Contains(g, "packcache.(*cache).close(") {
				return true
			}
		}
		return false
	})
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"bg:refresh", "bg:detached"} {
		if raw := string(rawGet(t, rdb, k)); !strings.Contains(raw, `"loaded"`) {
			t.Errorf("%s after Close: Redis holds %q, want the loaded value", k, raw)
		}
	}
}

// TestCloseBoundedByLoadTimeout: a loader that ignores its context keeps
// its goroutine, but not Close: Close returns, after about the load
// timeout plus the Redis budget, while the loader still runs, and says
// what is still running. (The loader blocks until Close has returned: the
// test judges that order, not Close's time.)
func TestCloseBoundedByLoadTimeout(t *testing.T) {
	redistest.RequireServer(t, "waits on timings and goroutine counts an embedded miniredis would change")
	_, rdb := single(t)
	ctx := ctxT(t)
	release, done := make(chan struct{}), make(chan struct{})
	c, err := packcache.New[Channel](rdb, packcache.WithLoadTimeout(200*time.Millisecond), packcache.WithRedisTimeout(100*time.Millisecond),
		packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
			defer close(done)
			<-release // ignores ctx
			return Channel{ID: key}, nil
		})))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "stubborn"); !errors.Is(err, packcache.ErrLoadTimeout) {
		t.Fatalf("Get: %v, want ErrLoadTimeout", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err = <-closed:
	case <-time.After(time.Minute):
		close(release)
		t.Fatal("Close still waiting a minute later for a loader that ignores its context")
	}
	if err == nil || !strings.Contains(err.Error(), "still running") {
		t.Errorf("Close with a loader ignoring its context: %v", err)
	}
	close(release)
	<-done
	// The late value is not stored (its load timed out), and its lease is
	// removed once the loader returns.
	for deadline := time.Now().Add(30 * time.Second); rdb.Exists(ctx, "stubborn").Val() != 0; time.Sleep(10 * time.Millisecond) {
		if raw := rdb.Get(ctx, "stubborn").Val(); raw == "" || raw[0] != 0x0c || time.Now().After(deadline) {
			t.Fatalf("after a load past its timeout the key holds %q", raw)
		}
	}
}

func TestCloseRacingEverything(t *testing.T) {
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
		leak := goleak.Find(ignore, goleak.IgnoreTopFunction("github.com/packcache/packcache_test.TestCloseRacingEverything.func2"),
			goleak.IgnoreAnyFunction("github.com/packcache/packcache_test.TestCloseRacingEverything.func2"))
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

// closedFor reports whether err is the closed cache's error for key: an
// *Error naming key and matching ErrClosed.
func closedFor(err error, key string) bool {
	var e *packcache.Error
	return errors.Is(err, packcache.ErrClosed) && errors.As(err, &e) && e.Key == key
}
