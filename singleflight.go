package packcache

import (
	"context"
	"errors"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// errGoexit is what callers get when a shared function calls
// runtime.Goexit: they must not wait forever for a result that never comes.
var errGoexit = errors.New("packcache: loader called runtime.Goexit")

// A group coalesces concurrent calls that share a key: the first starts the
// work, later ones wait for its result. It is modelled on
// golang.org/x/sync/singleflight, typed, and differs in three ways:
//
//   - every caller, the first included, waits under its own context and
//     can leave when it ends, while the work goes on for the others;
//   - work runs detached from the first caller's cancellation, on a
//     goroutine of its own (do: bounded by the Redis client's timeouts,
//     or on the first caller's goroutine when its context cannot end;
//     start: bounded by a timeout of its own, for a load);
//   - a result can stay shared for a while after the work ends (hold), so
//     that a surge whose callers straggle in still costs one piece of work.
type group[V, A any] struct {
	mu   sync.RWMutex
	m    map[string]*call[V]
	held []heldCall[V] // results still shared, in the order they finished
	wg   *sync.WaitGroup

	// hold says how long a finished call's result, which took the given
	// time to make, stays shared (nil or a zero duration: not at all).
	hold func(v V, err error, took time.Duration) time.Duration

	// slide extends a held result's time by this much past each caller
	// that takes it, up to slideCap after the work ended (or the hold, if
	// longer): a surge whose callers keep coming shares one result until
	// it ebbs, while a lone later caller still reads afresh.
	slide, slideCap time.Duration
}

// A call is one unit of shared work. Its fields other than val and err
// are guarded by the group's mutex; val and err are final once finished is
// set (and done, if made, is closed).
type call[V any] struct {
	done     chan struct{} // made by the first caller that must wait; nil until then
	finished bool
	val      V
	err      error
	started  int64        // unix nanoseconds the work began
	expires  atomic.Int64 // unix nanoseconds a held result stops being shared; 0 while running
	capAt    int64        // unix nanoseconds past which sliding cannot extend expires
}

type heldCall[V any] struct {
	key string
	c   *call[V]
}

// join returns the call under way (or held) for key, or registers a new
// one. Every caller that joins will wait, so it gets a channel to wait on;
// the caller that registers the call needs one only if it will wait too
// (leaderWaits) rather than do the work itself, which spares an allocation
// on the common, uncontended path. g.mu must be held.
func (g *group[V, A]) join(key string, now int64, leaderWaits bool) (*call[V], bool) {
	g.expire(now)
	if g.m == nil {
		g.m = make(map[string]*call[V])
	}
	c, ok := g.m[key]
	if ok && c.finished && !g.take(c, now) {
		ok = false
	}
	if !ok {
		c = &call[V]{started: now}
		g.m[key] = c
		ok = false
	}
	if (ok || leaderWaits) && !c.finished && c.done == nil {
		c.done = make(chan struct{})
	}
	return c, ok
}

// expire forgets held results whose time is over. It sweeps the list only
// once the oldest has expired: holds differ in length and slide, so a
// later one may expire first and wait for the oldest, a delay bounded by
// the longest hold and the slide cap. g.mu must be held.
func (g *group[V, A]) expire(now int64) {
	if len(g.held) == 0 || g.held[0].c.expires.Load() > now {
		return
	}
	live := g.held[:0]
	for _, h := range g.held {
		if h.c.expires.Load() > now {
			live = append(live, h)
		} else if g.m[h.key] == h.c {
			delete(g.m, h.key)
		}
	}
	clear(g.held[len(live):])
	g.held = live
}

// do returns the result of fn for key; later callers of key wait for
// that result or until their own context ends. If the first caller's
// context can end, fn runs on a goroutine of its own under a context that
// keeps ctx's values but not its cancellation (fn must bound itself, as
// Redis calls are by the client's timeouts), so the first caller can leave
// like any other without failing the rest. If it cannot end, fn runs on the
// caller's goroutine, which costs nothing extra.
//
// fn gets a, and writes its result through its last argument: passing the
// arguments rather than capturing them in a closure, and writing into the
// call rather than returning a value whose address escapes, keeps the
// uncontended path free of allocations of its own.
func (g *group[V, A]) do(ctx context.Context, key string, a A, fn func(context.Context, A, *V) error) (v V, err error, shared bool) {
	if v, err, ok := g.lookHeld(key); ok {
		return v, err, true
	}
	done := ctx.Done()
	g.mu.Lock()
	c, joined := g.join(key, time.Now().UnixNano(), done != nil)
	if !joined && done != nil {
		g.wg.Add(1)
	}
	g.mu.Unlock()
	switch {
	case joined:
	case done == nil:
		g.lead(ctx, key, c, a, fn)
		return c.val, c.err, false
	default:
		go g.run(key, c, func() (context.Context, context.CancelFunc) {
			return context.WithoutCancel(ctx), func() {}
		}, a, fn)
	}
	v, err = wait(ctx, c)
	return v, err, joined
}

// lookHeld returns the held result for key, if any, under the read lock
// only: in a surge, almost every caller arrives after the work is done,
// and tens of thousands of them taking the write lock in turn would cost
// more than the work did.
func (g *group[V, A]) lookHeld(key string) (v V, err error, ok bool) {
	now := time.Now().UnixNano()
	g.mu.RLock()
	c, found := g.m[key]
	ok = found && c.finished && g.take(c, now)
	if ok {
		v, err = c.val, c.err
	}
	g.mu.RUnlock()
	return v, err, ok
}

// take reports whether the finished call c still shares its result at
// now, and slides its expiry on. The caller holds g.mu, for reading at
// least; expires is atomic because readers slide it concurrently.
func (g *group[V, A]) take(c *call[V], now int64) bool {
	e := c.expires.Load()
	if now >= e {
		return false
	}
	if g.slide > 0 {
		if next := min(now+int64(g.slide), c.capAt); next > e {
			c.expires.CompareAndSwap(e, next) // another caller may slide it first: either is fine
		}
	}
	return true
}

func (g *group[V, A]) lead(ctx context.Context, key string, c *call[V], a A, fn func(context.Context, A, *V) error) {
	// Deferred, so that waiters are released even if fn calls
	// runtime.Goexit on this goroutine.
	defer g.finish(key, c)
	protect(ctx, a, fn, &c.val, &c.err)
}

// start is do with fn run on a goroutine of its own under the context work
// returns (detached from the caller's cancellation and bounded), so that
// fn goes on for the others when the first caller leaves.
func (g *group[V, A]) start(ctx context.Context, key string, work func() (context.Context, context.CancelFunc), a A, fn func(context.Context, A, *V) error) (v V, err error, shared bool) {
	g.mu.Lock()
	c, joined := g.join(key, time.Now().UnixNano(), true)
	if !joined {
		g.wg.Add(1)
	}
	g.mu.Unlock()
	if !joined {
		go g.run(key, c, work, a, fn)
	}
	v, err = wait(ctx, c)
	return v, err, joined
}

func (g *group[V, A]) run(key string, c *call[V], work func() (context.Context, context.CancelFunc), a A, fn func(context.Context, A, *V) error) {
	defer g.wg.Done()
	// finish runs deferred so that waiters are released even when fn
	// calls runtime.Goexit.
	defer g.finish(key, c)
	ctx, cancel := work()
	defer cancel()
	protect(ctx, a, fn, &c.val, &c.err)
}

// claim registers calls for those keys not under way and returns them (to
// be completed by the caller with finish) and the calls already under way
// for the others (to be waited on).
func (g *group[V, A]) claim(keys []string) (own, others map[string]*call[V]) {
	own = make(map[string]*call[V], len(keys))
	others = make(map[string]*call[V])
	now := time.Now().UnixNano()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, k := range keys {
		if _, mine := own[k]; mine {
			continue
		}
		if c, joined := g.join(k, now, true); joined {
			others[k] = c
		} else {
			own[k] = c
		}
	}
	return own, others
}

// finish publishes c's result and lets later callers of key start anew,
// at once or after the hold.
func (g *group[V, A]) finish(key string, c *call[V]) {
	var hold time.Duration
	now := time.Now().UnixNano()
	if g.hold != nil {
		hold = g.hold(c.val, c.err, time.Duration(now-c.started))
	}
	g.mu.Lock()
	if g.m[key] == c {
		if hold > 0 {
			c.expires.Store(now + int64(hold))
			c.capAt = now + int64(max(hold, g.slideCap))
			g.held = append(g.held, heldCall[V]{key, c})
		} else {
			delete(g.m, key)
		}
	}
	c.finished = true
	if c.done != nil {
		close(c.done)
	}
	g.mu.Unlock()
}

// forget makes later callers of key start new work rather than join work
// under way or a held result, which may predate a write just made.
func (g *group[V, A]) forget(key string) {
	g.mu.Lock()
	delete(g.m, key)
	g.mu.Unlock()
}

// protect calls fn, turning a panic into a *PanicError and runtime.Goexit
// into errGoexit, so that a misbehaving loader fails its callers instead of
// crashing the process or leaving them waiting. It stores through pointers
// because on runtime.Goexit only deferred code runs: a returned value would
// never be assigned.
func protect[V, A any](ctx context.Context, a A, fn func(context.Context, A, *V) error, vp *V, errp *error) {
	normal := false
	defer func() {
		if normal {
			return
		}
		if r := recover(); r != nil {
			*errp = &PanicError{Value: r, Stack: debug.Stack()}
		} else {
			*errp = errGoexit
		}
	}()
	*errp = fn(ctx, a, vp)
	normal = true
}

// wait returns c's result once it is final, or ctx's error if ctx ends
// first. The caller joined c under the group's mutex, asking to wait: so
// done is nil only if c had finished by then.
func wait[V any](ctx context.Context, c *call[V]) (V, error) {
	if c.done == nil {
		return c.val, c.err
	}
	if ctx.Done() == nil {
		// A plain receive: cheaper than a select, which a surge of
		// thousands of waiters pays for each.
		<-c.done
		return c.val, c.err
	}
	select {
	case <-c.done:
		return c.val, c.err
	default:
	}
	select {
	case <-c.done:
		return c.val, c.err
	case <-ctx.Done():
		var zero V
		return zero, ctx.Err()
	}
}

// detach returns a function that makes the context shared work runs under:
// it keeps ctx's values but not its cancellation, ends after timeout, and
// ends when closed is done.
func detach(ctx, closed context.Context, timeout time.Duration) func() (context.Context, context.CancelFunc) {
	return func() (context.Context, context.CancelFunc) {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		stop := context.AfterFunc(closed, cancel)
		return wctx, func() { stop(); cancel() }
	}
}
