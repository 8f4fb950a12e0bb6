package packcache_test

import (
	"context"
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

// A lease lives as long as its load: a short TTL (three Redis budgets)
// that the holder extends while its loader runs. The tests below attack
// it: a load that outlives the TTL, a holder that dies, a stall of Redis
// just as a read sends its lease, and a node that refuses the read that
// places a lease.

// stallHook pauses s for d just before the first read of key that would
// place a lease (SET key lease PX ms NX GET), or the script that places
// one, goes out through the client it is added to: as a BGSAVE fork or a network blip would, just as the
// lease is sent. paused is closed once the server is paused, resumed once
// it runs again.
type stallHook struct {
	t       *testing.T
	s       *redistest.Server
	key     string
	d       time.Duration
	armed   atomic.Bool
	resume  bool // resume after d; false: the test resumes it
	paused  chan struct{}
	resumed chan struct{}
}

func newStallHook(t *testing.T, s *redistest.Server, key string, d time.Duration) *stallHook {
	h := &stallHook{t: t, s: s, key: key, d: d, resume: true, paused: make(chan struct{}), resumed: make(chan struct{})}
	h.armed.Store(true)
	return h
}

func (h *stallHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *stallHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.fire(cmd)
		return next(ctx, cmd)
	}
}

func (h *stallHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 {
			h.fire(cmds[0])
		}
		return next(ctx, cmds)
	}
}

func (h *stallHook) fire(cmd redis.Cmder) {
	a := cmd.Args()
	readLease := cmd.Name() == "set" && len(a) == 7 && a[1] == h.key && a[5] == "nx" && a[6] == "get"
	// The acquire script, which places a miss's lease where the read
	// does not (a node that refuses SET NX GET).
	acquire := isAcquire(cmd) && a[3] == h.key
	if !readLease && !acquire {
		return
	}
	if !h.armed.CompareAndSwap(true, false) {
		return
	}
	h.s.Pause(h.t)
	close(h.paused)
	if !h.resume {
		return
	}
	time.AfterFunc(h.d, func() {
		h.s.Resume(h.t)
		close(h.resumed)
	})
}

// TestStallBeforeLease: Redis pauses for 1.5 s just as a read sends its
// lease. The read times out after its budget (1 s) and the Get answers
// from the loader; the lease lands when Redis resumes. The process that
// sent it knows the token as its own and takes it over at its next read;
// any process sees it die within three budgets; and readers of the key,
// 10 times a second in one process or two, make a few loader calls, not
// one per read for half a minute.
func TestStallBeforeLease(t *testing.T) {
	t.Parallel()
	for _, procs := range []int{1, 2} {
		t.Run(fmt.Sprintf("processes=%d", procs), func(t *testing.T) {
			t.Parallel()
			testStallBeforeLease(t, procs)
		})
	}
}

func testStallBeforeLease(t *testing.T, procs int) {
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "pauses the server")
	ctx := ctxT(t)
	admin := s.Client(t)
	const key, budget = "stalled", time.Second
	hook := newStallHook(t, s, key, 1500*time.Millisecond)
	var caches []*packcache.Cache[Channel]
	calls := make([]atomic.Int64, procs)
	for i := range procs {
		rdb := s.Client(t) // a client of its own: another process
		if i == 0 {
			rdb.AddHook(hook)
		}
		rdb.Ping(ctx) // a connection made: the stalled read is sent, not stuck dialling
		caches = append(caches, mustNew[Channel](t, rdb, packcache.WithRedisTimeout(budget),
			packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
				calls[i].Add(1)
				return Channel{ID: "loaded"}, nil
			}))))
	}
	for _, c := range caches {
		c.Get(ctx, "warm") // the scripts loaded, as in a process that has run a while
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	read := func(c *packcache.Cache[Channel]) {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if v, err := c.Get(ctx, key); err != nil || v.ID != "loaded" {
				t.Errorf("Get: %+v, %v", v, err)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}
	wg.Go(func() { read(caches[0]) })
	<-hook.paused // the first read's lease is on its way to a paused server
	for _, c := range caches[1:] {
		wg.Go(func() { read(c) })
	}
	<-hook.resumed
	resumed := time.Now()
	// From the resume on, whatever lease the key holds dies within three
	// budgets, and the key holds the loaded value again.
	var longest time.Duration
	waitFor(t, 20*time.Second, "the key holding the loaded value again", func() bool {
		// The value and its time to live at one instant.
		var get *redis.StringCmd
		var pttl *redis.DurationCmd
		admin.TxPipelined(ctx, func(p redis.Pipeliner) error {
			get, pttl = p.Get(ctx, key), p.PTTL(ctx, key)
			return nil
		})
		raw, err := get.Result()
		if err == nil && raw[0] != 0x0c {
			return strings.Contains(raw, "loaded")
		}
		if err == nil {
			longest = max(longest, pttl.Val())
		}
		return false
	})
	took := time.Since(resumed)
	close(stop)
	wg.Wait()
	if longest > 3*budget {
		t.Errorf("after the resume a lease had %v to live, want at most three budgets (%v)", longest, 3*budget)
	}
	for i := range calls {
		if n := calls[i].Load(); n > 10 {
			t.Errorf("process %d made %d loader calls, want at most 10", i, n)
		}
	}
	t.Logf("value stored again %v after the resume; loader calls %d (and %d); longest lease seen after the resume %v",
		took, calls[0].Load(), calls[procs-1].Load(), longest)
}

// TestLeaseLivesAsLongAsItsLoad: a load that runs several lease TTLs keeps
// its lease, extended every budget, and stores its value at the end.
func TestLeaseLivesAsLongAsItsLoad(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	redistest.RequireReal(t, s, "needs TTLs to run down in real time")
	ctx := ctxT(t)
	// A budget long enough that no two extensions in a row fail on a
	// loaded machine (one may: the lease has two more budgets to live).
	const budget = time.Second
	entered, release := make(chan struct{}), make(chan struct{})
	c := mustNew[Channel](t, rdb, packcache.WithRedisTimeout(budget), packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
		close(entered)
		<-release
		return Channel{ID: "slow"}, nil
	})))
	done := make(chan error, 1)
	go func() {
		v, err := c.Get(ctx, "kept")
		if err == nil && v.ID != "slow" {
			err = fmt.Errorf("got %q", v.ID)
		}
		done <- err
	}()
	<-entered
	last := rdb.PTTL(ctx, "kept").Val()
	if last <= 0 || last > 3*budget {
		t.Fatalf("the lease has %v to live, want at most three budgets (%v)", last, 3*budget)
	}
	// Four extensions: by then the load has outlived the lease's own TTL
	// (three budgets), and the lease is still its own.
	extended := 0
	waitFor(t, time.Minute, "four extensions of the lease", func() bool {
		if got := rawState(t, rdb, "kept"); got != "<lease>" {
			t.Fatalf("while the loader runs the key holds %s, want its lease", got)
		}
		d := rdb.PTTL(ctx, "kept").Val()
		if d > last {
			extended++
		}
		last = d
		return extended >= 4
	})
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := rawState(t, rdb, "kept"); got == "<lease>" || got == "<nil>" {
		t.Fatalf("after the load the key holds %s, want the value", got)
	}
	if st := c.Stats(); st.Stores != 1 {
		t.Fatalf("%d stores, want 1", st.Stores)
	}
}

// TestLeaseOfDeadProcess: a process that dies while loading leaves its
// lease with at most three of its Redis budgets to live, not the load
// timeout.
func TestLeaseOfDeadProcess(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	redistest.RequireReal(t, s, "needs TTLs to run down in real time")
	ctx := ctxT(t)
	tg := redistest.Target{Name: "single", Server: s, Client: rdb}
	key := "dead:holder"
	cmd, _, stdout := startChild(t, tg, "load", key, "never")
	if line := readLine(t, stdout); line != "loading" {
		t.Fatalf("child: %q", line)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if got := rawState(t, rdb, key); got != "<lease>" {
		t.Fatalf("the dead process left %s, want its lease", got)
	}
	// The child's budget is the default second.
	if d := rdb.PTTL(ctx, key).Val(); d <= 0 || d > 3*time.Second {
		t.Fatalf("the dead process's lease has %v to live, want at most 3s (three budgets)", d)
	}
}

// TestReadWithLeaseRefused: a node that refuses SET NX GET (here a write
// refused under maxmemory with noeviction; a server older than 7.0
// answers a syntax error, an ACL without SET NOPERM) is read with a plain
// GET at once: hits are served, misses load without storing.
func TestReadWithLeaseRefused(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	redistest.RequireReal(t, s, "maxmemory and INFO commandstats")
	ctx := ctxT(t)
	var calls atomic.Int64
	c := mustNew[Channel](t, rdb, packcache.WithShareWindow(packcache.Off), packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
		calls.Add(1)
		return Channel{ID: key}, nil
	})))
	if err := c.Set(ctx, "oom:hit", Channel{ID: "stored"}); err != nil {
		t.Fatal(err)
	}
	admin := s.Client(t)
	if err := admin.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "set", "oom:hit", "x", "nx", "get").Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("SET NX GET of a key that holds a value under maxmemory: %v, want OOM", err)
	}
	s.ResetStats(t)
	for range 3 {
		if v, err := c.Get(ctx, "oom:hit"); err != nil || v.ID != "stored" {
			t.Fatalf("hit under maxmemory: %+v, %v", v, err)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("hits under maxmemory called the loader %d times", n)
	}
	if n := s.CommandCount(t, "get"); n != 3 {
		t.Fatalf("three hits made %d GETs, want 3 (each refused SET NX GET read again by GET)", n)
	}
	if v, err := c.Get(ctx, "oom:miss"); err != nil || v.ID != "oom:miss" {
		t.Fatalf("miss under maxmemory: %+v, %v", v, err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("a miss under maxmemory called the loader %d times, want 1", n)
	}
	if n := rdb.Exists(ctx, "oom:miss").Val(); n != 0 {
		t.Fatalf("under maxmemory the missed key holds %q", rdb.Get(ctx, "oom:miss").Val())
	}
	// Memory back: misses are stored again (once the node is tried again).
	if err := admin.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	n := 0
	waitFor(t, 30*time.Second, "a miss stored again", func() bool {
		n++
		k := fmt.Sprintf("oom:after:%d", n)
		if _, err := c.Get(ctx, k); err != nil {
			t.Fatal(err)
		}
		return rdb.Exists(ctx, k).Val() == 1
	})
}

// TestStalledLeaseTakenOverByItsOwner: a read's lease that timed out and
// landed when Redis resumed is a lease no load holds. Another process
// treats it as any other's (it loads without storing, here); the process
// that sent it knows its token and takes it over at its next read, and
// stores.
func TestStalledLeaseTakenOverByItsOwner(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "pauses the server")
	ctx := ctxT(t)
	rdb := s.Client(t)
	const key = "orphan"
	hook := newStallHook(t, s, key, time.Hour) // resumed below, not by the timer
	hook.resume = false
	hooked := s.Client(t)
	hooked.AddHook(hook)
	hooked.Ping(ctx) // a connection made: the stalled read is sent, not stuck dialling
	loader := func(id string) packcache.Option {
		return packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
			return Channel{ID: id}, nil
		}))
	}
	a := mustNew[Channel](t, hooked, packcache.WithRedisTimeout(2*time.Second), loader("a"))
	b := mustNew[Channel](t, s.Client(t), loader("b"))
	a.Get(ctx, "warm") // the scripts loaded, as in a process that has run a while
	b.Get(ctx, "warm")
	stores := a.Stats().Stores
	if v, err := a.Get(ctx, key); err != nil || v.ID != "a" {
		t.Fatalf("Get with Redis paused: %+v, %v", v, err)
	}
	s.Resume(t)
	waitFor(t, 10*time.Second, "the stalled lease landing", func() bool { return rawState(t, rdb, key) == "<lease>" })
	if v, err := b.Get(ctx, key); err != nil || v.ID != "b" {
		t.Fatalf("another process's Get: %+v, %v", v, err)
	}
	if got := rawState(t, rdb, key); got != "<lease>" {
		t.Fatalf("after another process's Get the key holds %s, want the stalled lease (it is not that process's)", got)
	}
	if v, err := a.Get(ctx, key); err != nil || v.ID != "a" {
		t.Fatalf("the owner's next Get: %+v, %v", v, err)
	}
	if got := rawState(t, rdb, key); got != `{"id":"a","title":"","messages":null}` {
		t.Fatalf("after the owner's next Get the key holds %s, want its value", got)
	}
	if n := a.Stats().Stores - stores; n != 1 {
		t.Fatalf("the owner stored %d times, want 1", n)
	}
}
