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
// work, later ones wait for its result. Unlike x/sync/singleflight, the work
// runs on a goroutine of its own under a context detached from the first
// caller's, so that every caller, the first included, can leave when its own
// context ends without failing the others.
type group[V any] struct {
	mu sync.Mutex
	m  map[string]*call[V]
	wg *sync.WaitGroup // the cache's, so Close can wait for the work

	// hold says how long a finished call's result stays shared with
	// callers that arrive after it (nil: not at all). A surge's callers
	// do not all arrive within one Redis read; without this, each read
	// that ends lets the next arrivals start another.
	hold func(V, error) time.Duration
}

// A call is one unit of shared work. done is closed once val and err are
// final.
type call[V any] struct {
	done    chan struct{}
	val     V
	err     error
	expires int64 // unix nanoseconds a held result stops being shared; 0 while running
}

// do returns the result of fn for key, starting fn unless a call for key is
// already under way, in which case shared is true. fn runs under work, a
// context the caller derives (detached and bounded); the caller waits until
// fn returns or ctx is done, whichever is first.
func (g *group[V]) do(ctx context.Context, key string, work func() (context.Context, context.CancelFunc), fn func(context.Context) (V, error)) (v V, err error, shared bool) {
	g.mu.Lock()
	if g.m == nil {
		g.m = make(map[string]*call[V])
	}
	c, shared := g.m[key]
	if shared && c.expires != 0 && time.Now().UnixNano() >= c.expires {
		shared = false // a held result past its time
	}
	if !shared {
		c = &call[V]{done: make(chan struct{})}
		g.m[key] = c
		g.wg.Add(1)
		g.mu.Unlock()
		go g.run(key, c, work, fn)
	} else {
		g.mu.Unlock()
	}
	v, err = wait(ctx, c)
	return v, err, shared
}

// claim registers calls for those keys not under way and returns them (to
// be completed by the caller with finish) and the calls already under way
// for the others (to be waited on).
func (g *group[V]) claim(keys []string) (own, others map[string]*call[V]) {
	own = make(map[string]*call[V], len(keys))
	others = make(map[string]*call[V])
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m == nil {
		g.m = make(map[string]*call[V])
	}
	now := time.Now().UnixNano()
	for _, k := range keys {
		if _, mine := own[k]; mine {
			continue
		}
		if c, ok := g.m[k]; ok && (c.expires == 0 || now < c.expires) {
			others[k] = c
			continue
		}
		c := &call[V]{done: make(chan struct{})}
		g.m[k] = c
		own[k] = c
	}
	return own, others
}

// finish publishes c's result and lets later callers of key start anew,
// at once or after the hold.
func (g *group[V]) finish(key string, c *call[V]) {
	var hold time.Duration
	if g.hold != nil {
		hold = g.hold(c.val, c.err)
	}
	g.mu.Lock()
	if g.m[key] == c {
		if hold > 0 {
			c.expires = time.Now().Add(hold).UnixNano()
			time.AfterFunc(hold, func() { g.drop(key, c) })
		} else {
			delete(g.m, key)
		}
	}
	g.mu.Unlock()
	close(c.done)
}

func (g *group[V]) drop(key string, c *call[V]) {
	g.mu.Lock()
	if g.m[key] == c {
		delete(g.m, key)
	}
	g.mu.Unlock()
}

// forget makes later callers of key start new work rather than join work
// under way, whose result may predate a write that has just happened.
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

func (g *group[V]) run(key string, c *call[V], work func() (context.Context, context.CancelFunc), fn func(context.Context) (V, error)) {
	defer g.wg.Done()
	// finish runs deferred so that waiters are released even when fn
	// panics or calls runtime.Goexit.
	defer g.finish(key, c)
	ctx, cancel := work()
	defer cancel()
	protect(ctx, fn, &c.val, &c.err)
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
