package packcache

import (
	"context"
	"errors"
	"runtime/debug"
	"sync"
	"time"
)

// errGoexit is what callers get when a shared function calls
// runtime.Goexit: they must not wait forever for a result that never comes.
var errGoexit = errors.New("packcache: loader called runtime.Goexit")

// A group coalesces concurrent calls that share a key: the first starts the
// work, later ones wait for its result. It is modelled on
// golang.org/x/sync/singleflight, typed, and differs in three ways:
//
//   - every caller waits under its own context and can leave when it ends;
//   - work runs either on the first caller's goroutine (do: cheap, for a
//     Redis read) or on a goroutine of its own under a detached context
//     (start: for a load, which must survive the caller that began it);
//   - a result can stay shared for a while after the work ends (hold), so
//     that a surge whose callers straggle in still costs one piece of work.
type group[V any] struct {
	mu   sync.Mutex
	m    map[string]*call[V]
	held []heldCall[V] // results still shared, oldest first
	wg   *sync.WaitGroup

	// hold says how long a finished call's result stays shared (nil or a
	// zero duration: not at all).
	hold func(V, error) time.Duration
}

// A call is one unit of shared work. done is closed once val and err are
// final.
type call[V any] struct {
	done    chan struct{}
	val     V
	err     error
	expires int64 // unix nanoseconds a held result stops being shared; 0 while running
	retry   bool  // the caller doing the work left; waiters must start anew
}

type heldCall[V any] struct {
	key string
	c   *call[V]
}

// join returns the call under way for key, or registers c as that call.
// g.mu must be held.
func (g *group[V]) join(key string, now int64) (*call[V], bool) {
	g.expire(now)
	if g.m == nil {
		g.m = make(map[string]*call[V])
	}
	if c, ok := g.m[key]; ok && (c.expires == 0 || now < c.expires) {
		return c, true
	}
	c := &call[V]{done: make(chan struct{})}
	g.m[key] = c
	return c, false
}

// expire forgets held results whose time is over. Holds all last equally
// long, so the oldest are first. g.mu must be held.
func (g *group[V]) expire(now int64) {
	n := 0
	for ; n < len(g.held) && g.held[n].c.expires <= now; n++ {
		h := g.held[n]
		if g.m[h.key] == h.c {
			delete(g.m, h.key)
		}
	}
	if n > 0 {
		g.held = append(g.held[:0], g.held[n:]...)
	}
}

// do returns the result of fn for key. The first caller runs fn on its own
// goroutine under its own context; later callers wait for that result or
// until their context ends. If the first caller's context ends before fn
// succeeds, the waiters start the work again, one of them taking the lead,
// so that one caller's cancellation never fails the others.
func (g *group[V]) do(ctx context.Context, key string, fn func(context.Context) (V, error)) (v V, err error, shared bool) {
	for {
		g.mu.Lock()
		c, joined := g.join(key, time.Now().UnixNano())
		g.mu.Unlock()
		if joined {
			v, err = wait(ctx, c)
			if err == nil || !c.retry || ctx.Err() != nil {
				return v, err, true
			}
			continue
		}
		g.lead(ctx, key, c, fn)
		return c.val, c.err, false
	}
}

func (g *group[V]) lead(ctx context.Context, key string, c *call[V], fn func(context.Context) (V, error)) {
	// Deferred, so that waiters are released even if fn calls
	// runtime.Goexit on this goroutine.
	defer func() {
		if c.err != nil && ctx.Err() != nil {
			c.retry = true
		}
		g.finish(key, c)
	}()
	protect(ctx, fn, &c.val, &c.err)
}

// start is do with fn run on a goroutine of its own under the context work
// returns (detached from the caller's cancellation and bounded), so that
// fn goes on for the others when the first caller leaves.
func (g *group[V]) start(ctx context.Context, key string, work func() (context.Context, context.CancelFunc), fn func(context.Context) (V, error)) (v V, err error, shared bool) {
	g.mu.Lock()
	c, joined := g.join(key, time.Now().UnixNano())
	if !joined {
		g.wg.Add(1)
	}
	g.mu.Unlock()
	if !joined {
		go g.run(key, c, work, fn)
	}
	v, err = wait(ctx, c)
	return v, err, joined
}

func (g *group[V]) run(key string, c *call[V], work func() (context.Context, context.CancelFunc), fn func(context.Context) (V, error)) {
	defer g.wg.Done()
	// finish runs deferred so that waiters are released even when fn
	// calls runtime.Goexit.
	defer g.finish(key, c)
	ctx, cancel := work()
	defer cancel()
	protect(ctx, fn, &c.val, &c.err)
}

// claim registers calls for those keys not under way and returns them (to
// be completed by the caller with finish) and the calls already under way
// for the others (to be waited on).
func (g *group[V]) claim(keys []string) (own, others map[string]*call[V]) {
	own = make(map[string]*call[V], len(keys))
	others = make(map[string]*call[V])
	now := time.Now().UnixNano()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, k := range keys {
		if _, mine := own[k]; mine {
			continue
		}
		if c, joined := g.join(k, now); joined {
			others[k] = c
		} else {
			own[k] = c
		}
	}
	return own, others
}

// finish publishes c's result and lets later callers of key start anew,
// at once or after the hold.
func (g *group[V]) finish(key string, c *call[V]) {
	var hold time.Duration
	if g.hold != nil && !c.retry {
		hold = g.hold(c.val, c.err)
	}
	g.mu.Lock()
	if g.m[key] == c {
		if hold > 0 {
			c.expires = time.Now().Add(hold).UnixNano()
			g.held = append(g.held, heldCall[V]{key, c})
		} else {
			delete(g.m, key)
		}
	}
	g.mu.Unlock()
	close(c.done)
}

// forget makes later callers of key start new work rather than join work
// under way or a held result, which may predate a write just made.
func (g *group[V]) forget(key string) {
	g.mu.Lock()
	delete(g.m, key)
	g.mu.Unlock()
}

// inFlight reports whether work for key is under way.
func (g *group[V]) inFlight(key string) bool {
	g.mu.Lock()
	c, ok := g.m[key]
	g.mu.Unlock()
	return ok && c.expires == 0
}

// protect calls fn, turning a panic into a *PanicError and runtime.Goexit
// into errGoexit, so that a misbehaving loader fails its callers instead of
// crashing the process or leaving them waiting. It stores through pointers
// because on runtime.Goexit only deferred code runs: a returned value would
// never be assigned.
func protect[V any](ctx context.Context, fn func(context.Context) (V, error), vp *V, errp *error) {
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
	*vp, *errp = fn(ctx)
	normal = true
}

func wait[V any](ctx context.Context, c *call[V]) (V, error) {
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
