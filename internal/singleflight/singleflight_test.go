package singleflight

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/packcache/packcache/internal/life"
)

type testGroup = Group[ival, fnWork]

// fnWork is a closure as a group's work, handier in tests; refuse, if
// set, is its joining check.
type fnWork struct {
	fn     func(context.Context) (int, error)
	refuse error
}

func (w fnWork) Run(ctx context.Context, _ *Call[ival]) (ival, error) {
	v, err := w.fn(ctx)
	return ival(v), err
}

func (w fnWork) Joining(_ context.Context, _ string, running bool) error {
	if !running {
		return nil
	}
	return w.refuse
}

// ival is an int result, shared for the whole window unless it is an
// error.
type ival int

func (ival) ShareUntil(err error) int64 {
	if err != nil {
		return 0
	}
	return 1<<63 - 1
}

func newGroup(window time.Duration) *testGroup {
	g := &testGroup{}
	g.Init(window, nil, panicked)
	return g
}

// testPanic is the tests' error of work that panicked.
type testPanic struct {
	value any
	stack []byte
}

func (p *testPanic) Error() string { return fmt.Sprint("panicked: ", p.value) }

func panicked(value any, stack []byte) error { return &testPanic{value, stack} }

// do adapts the group's allocation-free calling convention to closures,
// which are handier in tests.
func do(g *testGroup, ctx context.Context, key string, fn func(context.Context) (int, error)) (ival, error, bool) {
	return g.Do(ctx, key, fnWork{fn: fn})
}

func waitRegistered(g *testGroup, key string) {
	for {
		g.mu.Lock()
		_, started := g.m[key]
		g.mu.Unlock()
		if started {
			return
		}
		runtime.Gosched()
	}
}

func TestGroupFirstCallerLeaves(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		g := newGroup(time.Hour)
		var calls atomic.Int64
		release := make(chan struct{})
		fn := func(ctx context.Context) (int, error) {
			calls.Add(1)
			<-release
			return 42, ctx.Err() // the work's context is not the first caller's
		}
		lctx, cancel := context.WithCancel(context.Background())
		leaderDone := make(chan error)
		go func() { _, err, _ := do(g, lctx, "k", fn); leaderDone <- err }()
		waitRegistered(g, "k")
		var wg sync.WaitGroup
		var got atomic.Int64
		for range 10 {
			wg.Go(func() {
				if v, err, shared := do(g, context.Background(), "k", fn); err == nil && v == 42 && shared {
					got.Add(1)
				}
			})
		}
		synctest.Wait() // every waiter has joined
		cancel()
		if err := <-leaderDone; !errors.Is(err, context.Canceled) {
			t.Fatalf("first caller got %v", err)
		}
		close(release)
		wg.Wait()
		if got.Load() != 10 || calls.Load() != 1 {
			t.Fatalf("%d of 10 waiters got the value; fn ran %d times", got.Load(), calls.Load())
		}
	})
}

func TestGroupPanicAndGoexit(t *testing.T) {
	t.Parallel()
	g := newGroup(time.Hour)
	_, err, _ := do(g, context.Background(), "p", func(context.Context) (int, error) { panic("boom") })
	var pe *testPanic
	if !errors.As(err, &pe) || pe.value != "boom" || len(pe.stack) == 0 {
		t.Fatalf("panic: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background()) // run on a goroutine of its own
	defer cancel()
	_, err, _ = do(g, ctx, "x", func(context.Context) (int, error) {
		runtime.Goexit()
		return 0, nil
	})
	if !errors.Is(err, ErrGoexit) {
		t.Fatalf("Goexit: %v", err)
	}
	// Errors are not kept: the next call runs again.
	v, err, _ := do(g, context.Background(), "p", func(context.Context) (int, error) { return 1, nil })
	if v != 1 || err != nil {
		t.Fatalf("after panic: %v %v", v, err)
	}
}

// TestGroupShareWindow: a caller shares work begun at most one window
// before it, running or ended; later, it starts afresh; forget detaches.
func TestGroupShareWindow(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		g := newGroup(100 * time.Millisecond)
		var calls atomic.Int64
		fn := func(context.Context) (int, error) { return int(calls.Add(1)), nil }
		ctx := context.Background()
		do(g, ctx, "k", fn)
		if v, _, shared := do(g, ctx, "k", fn); v != 1 || !shared {
			t.Fatalf("within the window: %v shared=%v", v, shared)
		}
		g.Forget("k")
		if v, _, _ := do(g, ctx, "k", fn); v != 2 {
			t.Fatalf("after forget: %v", v)
		}
		time.Sleep(120 * time.Millisecond)
		if v, _, _ := do(g, ctx, "k", fn); v != 3 {
			t.Fatalf("after the window: %v", v)
		}
		// Errors are not shared after the work ends.
		do(g, ctx, "e", func(context.Context) (int, error) { return 0, errors.New("x") })
		if v, err, _ := do(g, ctx, "e", fn); err != nil || v == 0 {
			t.Fatalf("an error was shared after its work ended: %v %v", v, err)
		}
		// Results past their window are dropped from the map, so keys never
		// asked for again do not pile up.
		for i := range 100 {
			do(g, ctx, string(rune('a'+i)), fn)
		}
		time.Sleep(120 * time.Millisecond)
		do(g, ctx, "z2", fn)
		g.mu.Lock()
		n, h := len(g.m), len(g.held)
		g.mu.Unlock()
		if n > 1 || h > 1 {
			t.Fatalf("%d entries and %d held left after their windows ended", n, h)
		}
	})
}

// TestGroupWindowBoundsSlowWork: the window counts from when the work
// began, not when it ended: a caller that comes more than one window after
// a slow read began starts its own, even while that read is under way, and
// a slow read's result is not shared after it ends.
func TestGroupWindowBoundsSlowWork(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		g := newGroup(30 * time.Millisecond)
		var calls atomic.Int64
		release := make(chan struct{})
		slow := func(context.Context) (int, error) {
			n := int(calls.Add(1))
			if n == 1 {
				<-release
			}
			return n, nil
		}
		ctx := context.Background()
		first := make(chan int)
		go func() { v, _, _ := do(g, ctx, "k", slow); first <- int(v) }()
		waitRegistered(g, "k")
		time.Sleep(60 * time.Millisecond)
		if v, _, shared := do(g, ctx, "k", slow); v != 2 || shared {
			t.Fatalf("a caller two windows after the read began joined it: %v shared=%v", v, shared)
		}
		close(release)
		if v := <-first; v != 1 {
			t.Fatalf("first caller got %v", v)
		}
		if v, _, shared := do(g, ctx, "k", slow); shared && v == 1 {
			t.Fatalf("the slow read's result was shared after it ended, past its window")
		}
	})
}

// TestGroupZeroWindow: with no window, callers share only work under way.
func TestGroupZeroWindow(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		g := newGroup(0)
		var calls atomic.Int64
		release := make(chan struct{})
		fn := func(context.Context) (int, error) {
			n := int(calls.Add(1))
			if n == 1 {
				<-release
			}
			return n, nil
		}
		ctx := context.Background()
		first := make(chan int)
		go func() { v, _, _ := do(g, ctx, "k", fn); first <- int(v) }()
		waitRegistered(g, "k")
		joined := make(chan int)
		go func() { v, _, _ := do(g, ctx, "k", fn); joined <- int(v) }()
		synctest.Wait() // the second caller has joined
		close(release)
		if a, b := <-first, <-joined; a != 1 || b != 1 {
			t.Fatalf("a caller during the work did not share it: %d %d", a, b)
		}
		if v, _, shared := do(g, ctx, "k", fn); v != 2 || shared {
			t.Fatalf("with no window a caller after the work shared it: %v %v", v, shared)
		}
	})
}

// TestRegistryLoadTokens: a load is shared only by callers that saw its
// token; others start their own.
func TestRegistryLoadTokens(t *testing.T) {
	t.Parallel()
	var g Registry[ival]
	a, ok := g.Claim("k", "lease-1", true, true)
	if ok {
		t.Fatal("first claim joined")
	}
	if b, ok := g.Claim("k", "lease-1", true, true); !ok || b != a {
		t.Fatal("same token did not join")
	}
	if b, ok := g.Claim("k", "lease-2", true, true); ok || b == a {
		t.Fatal("another token joined")
	}
	// a is detached but still finishes for its waiters.
	g.Forget("k")
	if !g.Finish("k", a, 5, nil) || g.Finish("k", a, 6, nil) {
		t.Fatal("finish must publish once")
	}
	if r, err := Wait(context.Background(), a); r != 5 || err != nil {
		t.Fatalf("detached call: %v %v", r, err)
	}
}

// TestRegistryPlacer: a load that found a lease before the load of the
// read that placed it registered learns of that load once it registers;
// one that took the place of a load under the same token that a write
// had detached learns that the placer registered long since, and waits
// for nothing.
func TestRegistryPlacer(t *testing.T) {
	t.Parallel()
	var g Registry[ival]
	early, _ := g.Claim("k", "lease-1", true, true) // found the lease first
	if o, registered := g.Placer("k", "lease-1", early); o != nil || registered {
		t.Fatalf("before the placer registered: %v, %v", o, registered)
	}
	placer, _ := g.Claim("k", "lease-1", true, false) // the placer never joins
	if o, registered := g.Placer("k", "lease-1", early); o != placer || !registered {
		t.Fatalf("once the placer registered: %v, %v; want it", o, registered)
	}
	g.Forget("k") // a write detaches the placer's load
	after, joined := g.Claim("k", "lease-1", true, true)
	if joined || after == placer {
		t.Fatal("joined a detached load")
	}
	if o, registered := g.Placer("k", "lease-1", after); o != nil || !registered {
		t.Fatalf("in the place of a detached placer: %v, %v; want nil, true", o, registered)
	}
}

// TestGroupWaitersOfAnInlineLeader: when the first caller's context cannot
// end, it does the work on its own goroutine; callers that join it, with
// contexts of any kind, must still wait for its result.
func TestGroupWaitersOfAnInlineLeader(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		g := newGroup(time.Hour)
		var calls atomic.Int64
		started := make(chan struct{})
		release := make(chan struct{})
		fn := func(context.Context) (int, error) {
			if calls.Add(1) == 1 {
				close(started)
				<-release
			}
			return 7, nil
		}
		leader := make(chan int)
		go func() { v, _, _ := do(g, context.Background(), "k", fn); leader <- int(v) }()
		<-started
		var wg sync.WaitGroup
		var wrong atomic.Int64
		for i := range 100 {
			wg.Go(func() {
				ctx := context.Background()
				if i%2 == 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, time.Minute)
					defer cancel()
				}
				if v, err, shared := do(g, ctx, "k", fn); v != 7 || err != nil || !shared {
					wrong.Add(1)
				}
			})
		}
		synctest.Wait() // every waiter has joined
		close(release)
		wg.Wait()
		if v := <-leader; v != 7 || wrong.Load() != 0 || calls.Load() != 1 {
			t.Fatalf("leader %d, %d of 100 waiters wrong, fn ran %d times", v, wrong.Load(), calls.Load())
		}
	})
}

// TestGroupJoiningRefused: a caller whose joining check fails gets its
// error at once instead of waiting for the work under way.
func TestGroupJoiningRefused(t *testing.T) {
	t.Parallel()
	g := newGroup(time.Hour)
	release := make(chan struct{})
	go do(g, context.Background(), "k", func(context.Context) (int, error) { <-release; return 1, nil })
	waitRegistered(g, "k")
	refuse := errors.New("refused")
	_, err, _ := g.Do(context.Background(), "k", fnWork{fn: func(context.Context) (int, error) { return 2, nil }, refuse: refuse})
	close(release)
	if err != refuse {
		t.Fatalf("got %v", err)
	}
}

// TestForgetVsFinishHotSlot: a write's Forget that comes while a read's
// finish holds the group's mutex (about to hold the call for its share
// window) waits for the mutex; once Forget returns, LookHot must not serve
// that call, which began before the write. The test holds the mutex as
// finish does, and goes on only once Forget is parked on it.
func TestForgetVsFinishHotSlot(t *testing.T) {
	t.Parallel()
	g := &Group[ival, fnWork]{}
	g.window = int64(time.Second)
	now := time.Now().UnixNano()
	c, _ := g.acquire("k", now, false) // a read begun before the write

	// finish(...) has taken the mutex (it is about to hold c).
	g.mu.Lock()
	forgot := make(chan struct{})
	go func() { g.Forget("k"); close(forgot) }() // the write's forget: waits for the mutex
	waitParkedInLock(t, ").Forget(")
	// the rest of finish, as it runs under the mutex:
	c.val, c.finished = 1, true
	if g.m["k"] == c {
		g.hold("k", c, time.Now().UnixNano())
	}
	g.mu.Unlock()
	<-forgot

	if hc, ok := g.LookHot("k", time.Now().UnixNano()); ok {
		t.Fatalf("after forget returned, lookHot still serves the call read before the write (val %d, detached %v)", hc.val, hc.detached.Load())
	}
}

// waitParkedInLock waits until a goroutine running fn (a substring of its
// stack) is parked in sync.Mutex.Lock, as the runtime's goroutine dump
// says ("[sync.Mutex.Lock"): a mutex's waiters are otherwise invisible,
// and testing/synctest does not count a goroutine blocked on one as
// durably blocked.
func waitParkedInLock(t *testing.T, fn string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(time.Minute); ; runtime.Gosched() {
		n := runtime.Stack(buf, true)
		for _, st := range strings.Split(string(buf[:n]), "\n\n") {
			if strings.Contains(st, "[sync.Mutex.Lock") && strings.Contains(st, fn) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no goroutine running %s parked in sync.Mutex.Lock within a minute", fn)
		}
	}
}

// TestGroupRegistersReads: a read on a goroutine of its own is registered
// with the group's life until it ends, so that the cache's Close waits
// for it; once Close has begun, a read runs on its caller's goroutine,
// unregistered.
func TestGroupRegistersReads(t *testing.T) {
	var l life.Life
	l.Init()
	g := &testGroup{}
	g.Init(0, &l, panicked)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		do(g, ctx, "a", func(context.Context) (int, error) {
			close(started)
			<-release
			return 1, nil
		})
	}()
	<-started
	if n := l.Running(); n != 1 {
		t.Fatalf("Running = %d with one read on a goroutine of its own, want 1", n)
	}
	idle := l.Close()
	select {
	case <-idle:
		t.Fatal("the life is idle while a read runs")
	default:
	}
	var during int64 = -1
	v, err, _ := do(g, ctx, "b", func(context.Context) (int, error) {
		during = l.Running()
		return 2, nil
	})
	if v != 2 || err != nil || during != 1 {
		t.Fatalf("a read after Close: %v, %v, with Running %d during it; want 2, nil, 1 (on the caller's goroutine)", v, err, during)
	}
	close(release)
	<-idle
	<-done
}

// TestReadBeginsWhenRegistered: a read registered by a caller whose clock
// reading is stale (its goroutine waited for a CPU after reading it)
// begins when it is registered, so a caller arriving next shares it for
// the window; registered at the stale time, its window would be over and
// the next caller would read again.
func TestReadBeginsWhenRegistered(t *testing.T) {
	t.Parallel()
	g := &Group[ival, fnWork]{}
	g.window = int64(time.Minute)
	before := time.Now().UnixNano()
	c, joined := g.acquire("k", before-int64(2*time.Minute), false)
	if joined {
		t.Fatal("the first caller joined a read")
	}
	if c.began < before {
		t.Fatalf("the read began %v before it was registered", time.Duration(before-c.began))
	}
	if next, joined := g.acquire("k", time.Now().UnixNano(), false); !joined || next != c {
		t.Fatal("the next caller, within the window of the read's registration, did not share it")
	}
}
