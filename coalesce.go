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

// A group coalesces concurrent reads of one key: the first caller starts
// the read, later ones wait for its result. It is modelled on
// golang.org/x/sync/singleflight, typed, and differs in these ways:
//
//   - every caller, the first included, waits under its own context and
//     can leave when it ends, while the read goes on for the others;
//   - the read runs detached from the first caller's cancellation, on a
//     goroutine of its own (or on the first caller's, when its context
//     cannot end, or when the cache is closing);
//   - which callers may share a read is the share window's rule (see
//     share.go): within the window of the moment the read began, never
//     past the value's expiry;
//   - forget detaches reads from new callers, for writes.
//
// V is the result; A is the read, passed by value so that the uncontended
// path allocates no closure. (Loads are shared by another rule, and kept
// by the load registry: see load.go.)
type group[V shareable, A work[V]] struct {
	mu sync.Mutex
	m  map[string]*call[V] // the latest call of each key
	share[V]

	// life, if set, is asked before a read starts on a goroutine of its
	// own (false: the cache is closing, and the read runs on the
	// caller's), and told when such a goroutine ends.
	life spawner
}

// A work is what a group shares: a read of one key.
type work[V any] interface {
	// run does the work for the callers of cl.
	run(ctx context.Context, cl *call[V]) (V, error)
	// joining is told of every caller that shares work another caller
	// began, before it waits; running reports whether the work is still
	// under way. An error it returns is the caller's result: it catches a
	// loader waiting for its own load.
	joining(ctx context.Context, key string, running bool) error
}

// A spawner registers goroutines with the cache's life, so that Close
// waits for them.
type spawner interface {
	trySpawn() bool
	exit()
}

// A call is one unit of shared work. finished, done and the fields of
// share are guarded by the group's mutex; val and err are written once,
// under it, before finished is set and done closed.
type call[V any] struct {
	done     chan struct{} // made by the first caller that must wait; nil until then
	finished bool
	val      V
	err      error
	began    int64        // unix nanoseconds the work began
	until    atomic.Int64 // unix nanoseconds: callers arriving from then on do not share it
	key      string       // set when held in a hot slot (see share)
	token    string       // for loads: the state the load began from; joins must match it
	detached atomic.Bool  // a write came after it began: no one may join it
	prev     *call[V]     // for loads: the call of the key under way when this one began
	aliases  []string     // for loads: other processes' leases it waits for, which joins match too

	// sealed is set once a read's reply has arrived: with a share window
	// of zero, only callers that come while the read itself is in flight
	// share it (not while it goes on to load, which they join by the
	// lease they find instead).
	sealed atomic.Bool
}

// release wakes the callers waiting for c, once its result is final. The
// group's mutex is held.
func (c *call[V]) release() {
	if c.done != nil {
		close(c.done)
	}
}

// seal ends the sharing of a read under way with callers that come from
// now on, when the group has no share window.
func (c *call[V]) seal() { c.sealed.Store(true) }

// acquire returns the read of key that a caller arriving at now may
// share, and true; or registers a new read and returns it and false.
// leaderWaits says whether a caller that registers the read will wait on
// it rather than do it: waiters need a channel, the uncontended leader
// none.
func (g *group[V, A]) acquire(key string, now int64, leaderWaits bool) (*call[V], bool) {
	g.mu.Lock()
	g.expire(now, g.m)
	if g.m == nil {
		g.m = make(map[string]*call[V])
	}
	c, ok := g.m[key]
	ok = ok && g.joinable(c, now)
	if !ok {
		c = &call[V]{began: now}
		c.until.Store(now + g.window)
		if g.window > 0 {
			// A read that others may share: findable without the mutex
			// (see share), with a channel to wait on made at once.
			c.done = make(chan struct{})
			c.key = key
			g.slot(key).Store(c)
		}
		g.m[key] = c
	}
	if (ok || leaderWaits) && !c.finished && c.done == nil {
		c.done = make(chan struct{})
	}
	g.mu.Unlock()
	return c, ok
}

// do returns the result of the read a for key, shared as the window
// allows. If the first caller's context can end, the read runs on a
// goroutine of its own under a context that keeps ctx's values but not
// its cancellation (the read must bound itself), so the first caller can
// leave like any other without failing the rest. If it cannot end, the
// read runs on the caller's goroutine.
func (g *group[V, A]) do(ctx context.Context, key string, a A) (v V, err error, shared bool) {
	done := ctx.Done()
	c, joined := g.acquire(key, time.Now().UnixNano(), done != nil)
	switch {
	case joined:
		if err := a.joining(ctx, key, !c.finishedNow(&g.mu)); err != nil {
			var zero V
			return zero, err, true
		}
	case done == nil || (g.life != nil && !g.life.trySpawn()):
		g.lead(ctx, key, c, a)
		return c.val, c.err, false
	default:
		go g.run(context.WithoutCancel(ctx), key, c, a)
	}
	v, err = wait(ctx, c)
	return v, err, joined
}

// finishedNow reports whether c has finished, under mu.
func (c *call[V]) finishedNow(mu *sync.Mutex) bool {
	mu.Lock()
	defer mu.Unlock()
	return c.finished
}

func (g *group[V, A]) lead(ctx context.Context, key string, c *call[V], a A) {
	// If the work calls runtime.Goexit, protect does not return: err
	// keeps errGoexit, and the deferred finish still releases the
	// waiters.
	var v V
	err := errGoexit
	defer func() { g.finish(key, c, v, err) }()
	v, err = protect(ctx, a, c, runWork[V, A])
}

// runWork calls a's work: protect's form of it.
func runWork[V any, A work[V]](ctx context.Context, a A, c *call[V]) (V, error) { return a.run(ctx, c) }

func (g *group[V, A]) run(ctx context.Context, key string, c *call[V], a A) {
	if g.life != nil {
		defer g.life.exit()
	}
	g.lead(ctx, key, c, a)
}

// finish publishes c's result, unless c has finished already, and
// reports whether it did. Later callers of key start anew, at once or
// after the share window.
func (g *group[V, A]) finish(key string, c *call[V], v V, err error) bool {
	now := time.Now().UnixNano()
	g.mu.Lock()
	defer g.mu.Unlock()
	if c.finished {
		return false
	}
	c.val, c.err, c.finished = v, err, true
	if g.m[key] == c {
		if !g.hold(key, c, now) {
			delete(g.m, key)
		}
	} else {
		g.cool(key, c)
	}
	c.release()
	return true
}

// forget makes later callers of key start a new read rather than join one
// under way or a held result, which may predate a write just made.
func (g *group[V, A]) forget(key string) {
	g.mu.Lock()
	if c := g.m[key]; c != nil {
		c.detached.Store(true)
	}
	delete(g.m, key)
	g.mu.Unlock()
	// After the mutex, and the call is marked detached, which lookHot
	// checks too.
	g.cool(key, nil)
}

// protect calls fn, turning a panic into a *PanicError, so that a
// misbehaving loader fails its callers instead of crashing the process or
// leaving them waiting. (A runtime.Goexit in fn ends the goroutine without
// returning here; callers of protect handle it with a deferred finish.)
func protect[V, A, B any](ctx context.Context, a A, b B, fn func(context.Context, A, B) (V, error)) (v V, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return fn(ctx, a, b)
}

// wait returns c's result once it is final, or ctx's error if ctx ends
// first. The caller acquired c asking to wait: so done is nil only if c
// had finished by then.
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
