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

// A group coalesces concurrent work on one key: the first caller starts
// it, later ones wait for its result. It is modelled on
// golang.org/x/sync/singleflight, typed, and differs in these ways:
//
//   - every caller, the first included, waits under its own context and
//     can leave when it ends, while the work goes on for the others;
//   - the work runs detached from the first caller's cancellation, on a
//     goroutine of its own (or on the first caller's, when its context
//     cannot end);
//   - which callers may share a piece of work is the group's rule: within
//     the share window of the moment the work began (see share.go), or,
//     for loads, only callers that saw that very load's lease in Redis;
//   - forget detaches work from new callers, for writes.
//
// V is the result; A is what the work function takes, passed by value so
// that the uncontended path allocates no closure.
type group[V shareable, A any] struct {
	mu sync.Mutex
	m  map[string]*call[V] // the latest call of each key
	share[V]

	// byToken indexes loads under way by key and token (see loadToken):
	// several loads of one key can be under way, each from a state of its
	// own, and a reader joins the one whose lease it found. (A token alone
	// is not unique: two keys can hold the same bytes, and "down" is every
	// key's token while Redis is down.)
	byToken map[tokenKey]*call[V]

	// spawn, if set, is asked before work starts on a goroutine of its
	// own; false (the cache is closing) runs it on the caller's.
	spawn func() bool
	// done is called when such a goroutine ends.
	done func()
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

	// sealed is set once a read's reply has arrived: with a share window
	// of zero, only callers that come while the read itself is in flight
	// share it (not while it goes on to load, which they join by the
	// lease they find instead).
	sealed atomic.Bool
}

// seal ends the sharing of a read under way with callers that come from
// now on, when the group has no share window.
func (c *call[V]) seal() { c.sealed.Store(true) }

// acquire returns the call for key that a caller arriving at now may
// share, and true; or registers a new call and returns it and false. A load
// (token != "") is shared only by callers that saw its lease. leaderWaits
// says whether a caller that registers the call will wait on it rather
// than do the work: waiters need a channel, the uncontended leader none.
func (g *group[V, A]) acquire(key string, now int64, token string, leaderWaits bool) (*call[V], bool) {
	g.mu.Lock()
	g.expire(now, g.m)
	if g.m == nil {
		g.m = make(map[string]*call[V])
	}
	var c *call[V]
	var ok bool
	if token != "" {
		c, ok = g.byToken[tokenKey{key, token}]
		ok = ok && !c.finished && !c.detached.Load()
		if ok && token == unprovenToken {
			// Nothing proves that no write came since it began: share it
			// only within the window, as a read is.
			ok = now < c.began+g.window
		}
	} else {
		c, ok = g.m[key]
		ok = ok && g.joinable(c, now)
	}
	if !ok {
		c = &call[V]{began: now, token: token}
		c.until.Store(now + g.window)
		if token == "" && g.window > 0 {
			// A read that others may share: findable without the mutex
			// (see share), with a channel to wait on made at once.
			c.done = make(chan struct{})
			c.key = key
			g.slot(key).Store(c)
		}
		if token != "" {
			if prev := g.m[key]; prev != nil && !prev.finished {
				c.prev = prev
			}
			if g.byToken == nil {
				g.byToken = make(map[tokenKey]*call[V])
			}
			g.byToken[tokenKey{key, token}] = c
		}
		g.m[key] = c
	}
	if (ok || leaderWaits) && !c.finished && c.done == nil {
		c.done = make(chan struct{})
	}
	g.mu.Unlock()
	return c, ok
}

// do returns the result of fn for key, shared as the group's rule allows.
// If the first caller's context can end, fn runs on a goroutine of its own
// under a context that keeps ctx's values but not its cancellation (fn
// must bound itself), so the first caller can leave like any other without
// failing the rest. If it cannot end, fn runs on the caller's goroutine.
//
// joining, if not nil, is asked before a caller waits for work already
// under way; an error it returns is the caller's result. It catches a
// loader waiting for its own load.
func (g *group[V, A]) do(ctx context.Context, key string, a A, fn func(context.Context, A, *call[V]) (V, error), joining func(context.Context, string) error) (v V, err error, shared bool) {
	done := ctx.Done()
	c, joined := g.acquire(key, time.Now().UnixNano(), "", done != nil)
	switch {
	case joined:
		if joining != nil && !c.finishedNow(&g.mu) {
			if err := joining(ctx, key); err != nil {
				var zero V
				return zero, err, true
			}
		}
	case done == nil || (g.spawn != nil && !g.spawn()):
		g.lead(ctx, key, c, a, fn)
		return c.val, c.err, false
	default:
		go g.run(context.WithoutCancel(ctx), key, c, a, fn)
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

func (g *group[V, A]) lead(ctx context.Context, key string, c *call[V], a A, fn func(context.Context, A, *call[V]) (V, error)) {
	// If fn calls runtime.Goexit, protect does not return: err keeps
	// errGoexit, and the deferred finish still releases the waiters.
	var v V
	err := errGoexit
	defer func() { g.finish(key, c, v, err) }()
	v, err = protect(ctx, a, c, fn)
}

func (g *group[V, A]) run(ctx context.Context, key string, c *call[V], a A, fn func(context.Context, A, *call[V]) (V, error)) {
	if g.done != nil {
		defer g.done()
	}
	g.lead(ctx, key, c, a, fn)
}

// finish publishes c's result, unless c has finished already (a load
// released at its timeout finishes before its loader returns), and
// reports whether it did. Later callers of key start anew, at once or
// after the share window.
func (g *group[V, A]) finish(key string, c *call[V], v V, err error) bool {
	now := time.Now().UnixNano()
	g.mu.Lock()
	defer g.mu.Unlock()
	if c.finished {
		return false
	}
	c.val, c.err = v, err
	c.finished = true
	if tk := (tokenKey{key, c.token}); c.token != "" && g.byToken[tk] == c {
		delete(g.byToken, tk)
	}
	c.prev = nil
	if g.m[key] == c {
		if !g.hold(key, c, now) {
			delete(g.m, key)
		}
	} else {
		g.cool(key, c)
	}
	if c.done != nil {
		close(c.done)
	}
	return true
}

// claim registers loads for those keys no load of which is under way, and
// returns them (to be completed with finish) and, for the others, the
// loads under way whose leases the caller saw (tokens[k]), to be waited
// on. Keys under way with another lease are claimed anew.
func (g *group[V, A]) claim(keys []string, tokens map[string]string) (own, others map[string]*call[V]) {
	own = make(map[string]*call[V], len(keys))
	others = make(map[string]*call[V])
	now := time.Now().UnixNano()
	for _, k := range keys {
		if _, mine := own[k]; mine {
			continue
		}
		if c, joined := g.acquire(k, now, tokens[k], true); joined {
			others[k] = c
		} else {
			own[k] = c
		}
	}
	return own, others
}

// forget makes later callers of key start new work rather than join work
// under way or a held result, which may predate a write just made.
func (g *group[V, A]) forget(key string) {
	g.mu.Lock()
	for c := g.m[key]; c != nil; c = c.prev {
		c.detached.Store(true)
	}
	delete(g.m, key)
	g.mu.Unlock()
	// After the mutex, and the calls are marked detached, which lookHot
	// checks too.
	g.cool(key, nil)
}

type tokenKey struct{ key, token string }

// isDetached reports whether a write detached c (see forget).
func (g *group[V, A]) isDetached(c *call[V]) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return c.detached.Load()
}

// running returns the load of key under way with token, if any may be
// joined.
func (g *group[V, A]) running(key, token string) *call[V] {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, ok := g.byToken[tokenKey{key, token}]
	if !ok || c.finished || c.detached.Load() {
		return nil
	}
	if c.done == nil {
		c.done = make(chan struct{})
	}
	return c
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
