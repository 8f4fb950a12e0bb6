package packcache

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type testGroup = group[int, func(context.Context) (int, error)]

func newGroup() *testGroup { return &testGroup{wg: new(sync.WaitGroup)} }

func callFn(ctx context.Context, fn func(context.Context) (int, error), v *int) error {
	var err error
	*v, err = fn(ctx)
	return err
}

// do and start adapt the group's allocation-free calling convention to
// closures, which are handier in tests.
func do(g *testGroup, ctx context.Context, key string, fn func(context.Context) (int, error)) (int, error, bool) {
	return g.do(ctx, key, fn, callFn)
}

func TestGroupFirstCallerLeaves(t *testing.T) {
	g := newGroup()
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
	for {
		g.mu.Lock()
		_, started := g.m["k"]
		g.mu.Unlock()
		if started {
			break
		}
		runtime.Gosched()
	}
	var wg sync.WaitGroup
	var got atomic.Int64
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if v, err, shared := do(g, context.Background(), "k", fn); err == nil && v == 42 && shared {
				got.Add(1)
			}
		}()
	}
	time.Sleep(10 * time.Millisecond)
	cancel()
	if err := <-leaderDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("first caller got %v", err)
	}
	close(release)
	wg.Wait()
	if got.Load() != 10 || calls.Load() != 1 {
		t.Fatalf("%d of 10 waiters got the value; fn ran %d times", got.Load(), calls.Load())
	}
	g.wg.Wait()
}

func TestGroupPanicAndGoexit(t *testing.T) {
	g := newGroup()
	_, err, _ := do(g, context.Background(), "p", func(context.Context) (int, error) { panic("boom") })
	var pe *PanicError
	if !errors.As(err, &pe) || pe.Value != "boom" || len(pe.Stack) == 0 {
		t.Fatalf("panic: %v", err)
	}
	_, err, _ = g.start(context.Background(), "x", detach(context.Background(), context.Background(), time.Second), func(context.Context) (int, error) {
		runtime.Goexit()
		return 0, nil
	}, callFn)
	if !errors.Is(err, errGoexit) {
		t.Fatalf("Goexit: %v", err)
	}
	g.wg.Wait()
	// Errors are not kept: the next call runs again.
	v, err, _ := do(g, context.Background(), "p", func(context.Context) (int, error) { return 1, nil })
	if v != 1 || err != nil {
		t.Fatalf("after panic: %v %v", v, err)
	}
}

func TestGroupHold(t *testing.T) {
	g := newGroup()
	g.hold = func(int, error, time.Duration) time.Duration { return 30 * time.Millisecond }
	var calls atomic.Int64
	fn := func(context.Context) (int, error) { return int(calls.Add(1)), nil }
	ctx := context.Background()
	do(g, ctx, "k", fn)
	if v, _, shared := do(g, ctx, "k", fn); v != 1 || !shared {
		t.Fatalf("within the hold: %v shared=%v", v, shared)
	}
	g.forget("k")
	if v, _, _ := do(g, ctx, "k", fn); v != 2 {
		t.Fatalf("after forget: %v", v)
	}
	time.Sleep(40 * time.Millisecond)
	if v, _, _ := do(g, ctx, "k", fn); v != 3 {
		t.Fatalf("after the hold: %v", v)
	}
	// Expired holds are dropped from the map, so keys never asked for
	// again do not pile up.
	for i := range 100 {
		do(g, ctx, string(rune('a'+i)), fn)
	}
	time.Sleep(40 * time.Millisecond)
	do(g, ctx, "z2", fn)
	g.mu.Lock()
	n := len(g.m)
	g.mu.Unlock()
	if n > 1 {
		t.Fatalf("%d entries left after their holds expired", n)
	}
}

// TestGroupWaitersOfAnInlineLeader: when the first caller's context cannot
// end, it does the work on its own goroutine; callers that join it, with
// contexts of any kind, must still wait for its result.
func TestGroupWaitersOfAnInlineLeader(t *testing.T) {
	g := newGroup()
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
	go func() { v, _, _ := do(g, context.Background(), "k", fn); leader <- v }()
	<-started
	var wg sync.WaitGroup
	var wrong atomic.Int64
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			if i%2 == 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Minute)
				defer cancel()
			}
			if v, err, shared := do(g, ctx, "k", fn); v != 7 || err != nil || !shared {
				wrong.Add(1)
			}
		}()
	}
	for {
		g.mu.Lock()
		ready := g.m["k"].done != nil
		g.mu.Unlock()
		if ready {
			break
		}
		runtime.Gosched()
	}
	time.Sleep(20 * time.Millisecond)
	close(release)
	wg.Wait()
	if v := <-leader; v != 7 || wrong.Load() != 0 || calls.Load() != 1 {
		t.Fatalf("leader %d, %d of 100 waiters wrong, fn ran %d times", v, wrong.Load(), calls.Load())
	}
}

// TestGroupHoldSlides: callers that keep coming within the slide keep
// sharing the held result, up to the cap; after a gap, or past the cap,
// the work runs again.
func TestGroupHoldSlides(t *testing.T) {
	g := newGroup()
	g.hold = func(int, error, time.Duration) time.Duration { return 40 * time.Millisecond }
	g.slide, g.slideCap = 40*time.Millisecond, 150*time.Millisecond
	var calls atomic.Int64
	fn := func(context.Context) (int, error) { return int(calls.Add(1)), nil }
	ctx := context.Background()
	start := time.Now()
	do(g, ctx, "k", fn)
	for time.Since(start) < 120*time.Millisecond {
		time.Sleep(10 * time.Millisecond)
		if v, _, _ := do(g, ctx, "k", fn); v != 1 {
			t.Fatalf("at %v, within the sliding window: fn ran again", time.Since(start))
		}
	}
	time.Sleep(time.Until(start.Add(160 * time.Millisecond)))
	if v, _, _ := do(g, ctx, "k", fn); v != 2 {
		t.Fatalf("past the cap the result was still shared")
	}
	time.Sleep(50 * time.Millisecond) // a gap longer than the slide
	if v, _, _ := do(g, ctx, "k", fn); v != 3 {
		t.Fatalf("after a gap the result was still shared")
	}
}
