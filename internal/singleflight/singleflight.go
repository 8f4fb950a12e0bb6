// Package singleflight is the cache's one coalescing mechanism: a Group
// shares a read of one key among the callers that come within a share
// window, and a Registry shares a load among the readers that found the
// same state of a key in Redis. Both hand out a Call, which callers wait
// on under their own contexts (Wait); Protect turns a panic in shared
// work into an error for all of them. The dictionary set's fetches are a
// Group with no window.
package singleflight

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/packcache/packcache/internal/life"
)

// ErrGoexit is what callers get when a shared function calls
// runtime.Goexit: they must not wait forever for a result that never comes.
var ErrGoexit = errors.New("packcache: loader called runtime.Goexit")

// A Group coalesces concurrent reads of one key: the first caller starts
// the read, later ones wait for its result. It is modelled on
// golang.org/x/sync/singleflight, typed, and differs in these ways:
//
//   - every caller, the first included, waits under its own context and
//     can leave when it ends, while the read goes on for the others;
//   - the read runs detached from the first caller's cancellation, on a
//     goroutine of its own, registered with the cache's life (or on the
//     first caller's, when its context cannot end, or once Close has
//     begun);
//   - which callers may share a read is the share window's rule (below):
//     within the window of the moment the read began, never
//     past the value's expiry;
//   - forget detaches reads from new callers, for writes.
//
// V is the result; A is the read, passed by value so that the uncontended
// path allocates no closure. (Loads are shared by another rule, and kept
// by the load registry below.)
type Group[V Shareable, A Work[V]] struct {
	mu sync.Mutex
	m  map[string]*Call[V] // the latest call of each key
	share[V]

	// panicked makes the error of a read that panicked.
	panicked Panicked

	// life, if set, registers the reads that run on goroutines of their
	// own, so that the cache's Close waits for them; once Close has
	// begun, it refuses them, and reads run on their callers'
	// goroutines.
	life *life.Life
}

// Init sets g's share window, the life its goroutines register with (nil:
// none), and the error of work that panics. It is called before g is
// used.
func (g *Group[V, A]) Init(window time.Duration, l *life.Life, panicked Panicked) {
	g.window, g.life, g.panicked = int64(window), l, panicked
}

// A Work is what a group shares: a read of one key.
type Work[V any] interface {
	// Run does the work for the callers of cl.
	Run(ctx context.Context, cl *Call[V]) (V, error)
	// Joining is told of every caller that shares work another caller
	// began, before it waits; running reports whether the work is still
	// under way. An error it returns is the caller's result: it catches a
	// loader waiting for its own load.
	Joining(ctx context.Context, key string, running bool) error
}

// A Call is one unit of shared work. finished, done and the fields of
// share are guarded by the group's mutex; val and err are written once,
// under it, before finished is set and done closed.
type Call[V any] struct {
	done     chan struct{} // made by the first caller that must wait; nil until then
	finished bool
	val      V
	err      error
	began    int64        // unix nanoseconds the work began
	until    atomic.Int64 // unix nanoseconds: callers arriving from then on do not share it
	key      string       // set when held in a hot slot (see share)
	token    string       // for loads: the state the load began from; joins must match it
	detached atomic.Bool  // a write came after it began: no one may join it
	prev     *Call[V]     // for loads: the call of the key under way when this one began
	own      bool         // for reads: the work runs on a goroutine of its own, not a caller's
	aliases  []string     // for loads: other processes' leases it waits for, which joins match too
	// overDetached: a load registered in the place of one under the
	// same token that a write had detached (see Registry.Placer).
	overDetached bool

	// sealed is set once a read's reply has arrived: with a share window
	// of zero, only callers that come while the read itself is in flight
	// share it (not while it goes on to load, which they join by the
	// lease they find instead).
	sealed atomic.Bool
}

// Own reports whether c's work runs on a goroutine of its own, not a
// caller's (a read's: see Group.Do).
func (c *Call[V]) Own() bool { return c.own }

// Done is closed once c's result is final; nil for a call that no caller
// asked to wait on.
func (c *Call[V]) Done() <-chan struct{} { return c.done }

// release wakes the callers waiting for c, once its result is final. The
// group's mutex is held.
func (c *Call[V]) release() {
	if c.done != nil {
		close(c.done)
	}
}

// Seal ends the sharing of a read under way with callers that come from
// now on, when the group has no share window.
func (c *Call[V]) Seal() { c.sealed.Store(true) }

// acquire returns the read of key that a caller arriving at now may
// share, and true; or registers a new read and returns it and false.
// leaderWaits says whether a caller that registers the read will wait on
// it rather than do it: waiters need a channel, the uncontended leader
// none.
//
// A new read begins when it is registered, under the mutex, not at now:
// a caller whose goroutine waited for a CPU between reading the clock and
// taking the mutex would otherwise register a read whose window had
// already passed, and every caller after it would read again (on two
// busy cores, a surge of 20,000 Gets of a hot key made 18 reads in 120 ms
// of 10 ms windows). A caller joins by its own now, when its call began:
// a read begun less than a window before that is one the window allows
// it.
func (g *Group[V, A]) acquire(key string, now int64, leaderWaits bool) (*Call[V], bool) {
	g.mu.Lock()
	g.expire(now, g.m)
	if g.m == nil {
		g.m = make(map[string]*Call[V])
	}
	c, ok := g.m[key]
	ok = ok && g.joinable(c, now)
	if !ok {
		began := max(now, time.Now().UnixNano())
		c = &Call[V]{began: began}
		c.until.Store(began + g.window)
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

// Do returns the result of the read a for key, shared as the window
// allows. If the first caller's context can end, the read runs on a
// goroutine of its own under a context that keeps ctx's values but not
// its cancellation (the read must bound itself), so the first caller can
// leave like any other without failing the rest. If it cannot end, the
// read runs on the caller's goroutine.
func (g *Group[V, A]) Do(ctx context.Context, key string, a A) (v V, err error, shared bool) {
	done := ctx.Done()
	c, joined := g.acquire(key, time.Now().UnixNano(), done != nil)
	switch {
	case joined:
		if err := a.Joining(ctx, key, !c.finishedNow(&g.mu)); err != nil {
			var zero V
			return zero, err, true
		}
	case done == nil || !g.spawn(context.WithoutCancel(ctx), key, c, a):
		g.lead(ctx, key, c, a)
		return c.val, c.err, false
	}
	v, err = Wait(ctx, c)
	return v, err, joined
}

// finishedNow reports whether c has finished, under mu.
func (c *Call[V]) finishedNow(mu *sync.Mutex) bool {
	mu.Lock()
	defer mu.Unlock()
	return c.finished
}

func (g *Group[V, A]) lead(ctx context.Context, key string, c *Call[V], a A) {
	// If the work calls runtime.Goexit, protect does not return: err
	// keeps ErrGoexit, and the deferred finish still releases the
	// waiters.
	var v V
	err := ErrGoexit
	defer func() { g.Finish(key, c, v, err) }()
	v, err = Protect(ctx, a, c, runWork[V, A], g.panicked)
}

// runWork calls a's work: protect's form of it.
func runWork[V any, A Work[V]](ctx context.Context, a A, c *Call[V]) (V, error) { return a.Run(ctx, c) }

// spawn leads c on a goroutine of its own (the life's, when the group has
// one), unless the life has begun to close: then it reports false, and
// the caller leads c itself.
func (g *Group[V, A]) spawn(ctx context.Context, key string, c *Call[V], a A) bool {
	c.own = true // before the goroutine starts, which reads it
	if g.life == nil {
		go g.lead(ctx, key, c, a)
		return true
	}
	if !g.life.TryGo(func() { g.lead(ctx, key, c, a) }) {
		c.own = false
		return false
	}
	return true
}

// Finish publishes c's result, unless c has finished already, and
// reports whether it did. Later callers of key start anew, at once or
// after the share window.
func (g *Group[V, A]) Finish(key string, c *Call[V], v V, err error) bool {
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

// Forget makes later callers of key start a new read rather than join one
// under way or a held result, which may predate a write just made.
func (g *Group[V, A]) Forget(key string) {
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

// ForgetAll is Forget of every key, for an invalidation whose keys are
// not known (a group's): it costs a walk of the reads under way or held.
func (g *Group[V, A]) ForgetAll() {
	g.mu.Lock()
	if len(g.m) == 0 {
		g.mu.Unlock()
		return
	}
	keys := make([]string, 0, len(g.m))
	for k, c := range g.m {
		c.detached.Store(true)
		keys = append(keys, k)
	}
	clear(g.m)
	g.mu.Unlock()
	for _, k := range keys {
		g.cool(k, nil)
	}
}

// A Panicked makes the error of shared work that panicked with value,
// from the stack where it did (the cache's is a *packcache.PanicError).
type Panicked func(value any, stack []byte) error

// Protect calls fn, turning a panic into panicked's error (nil: an error
// that gives the panic's value), so that
// misbehaving work (a loader) fails its callers instead of crashing the
// process or leaving them waiting. (A runtime.Goexit in fn ends the
// goroutine without returning here; callers of Protect handle it with a
// deferred finish.)
func Protect[V, A, B any](ctx context.Context, a A, b B, fn func(context.Context, A, B) (V, error), panicked Panicked) (v V, err error) {
	defer func() {
		if r := recover(); r != nil {
			if panicked == nil {
				err = fmt.Errorf("panicked: %v", r)
				return
			}
			err = panicked(r, debug.Stack())
		}
	}()
	return fn(ctx, a, b)
}

// Wait returns c's result once it is final, or ctx's error if ctx ends
// first. The caller acquired c asking to wait: so done is nil only if c
// had finished by then.
func Wait[V any](ctx context.Context, c *Call[V]) (V, error) {
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

// share is a group's rule for who may share a piece of work, and the
// results it keeps shared after the work ends.
//
// The rule in one sentence: a caller shares work on its key begun at most
// the window before it arrived, still under way or ended, so that what it
// gets is never from a read sent more than one window before its own would
// have been; with a window of zero it shares only a read whose reply has
// not yet arrived.
// A load is the exception: it is shared, while under way, with exactly
// the callers whose own read found that load's lease in Redis, which
// proves that no write has come since it began.
type share[V Shareable] struct {
	window int64 // nanoseconds

	held []heldCall[V] // finished calls still shared, in the order they finished

	// hot holds, for each of a few buckets of keys, the latest read of a
	// key in it, under way or held, so that a caller finds it without the
	// group's mutex: twenty thousand callers of a surge taking a mutex in
	// turn, and growing their stacks through the slow path, would cost
	// more than the read; while the read is under way its callers would
	// contend for the mutex only to wait.
	hot [hotSlots]atomic.Pointer[Call[V]]
}

const hotSlots = 64

// A Shareable result says until when it may be shared once its work has
// finished (see result.ShareUntil).
type Shareable interface {
	ShareUntil(err error) int64
}

// slot returns key's hot slot. Keys are spread by FNV-1a: which keys
// share a slot matters little, as a slot is checked against its key.
func (s *share[V]) slot(key string) *atomic.Pointer[Call[V]] {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h = (h ^ uint32(key[i])) * 16777619
	}
	return &s.hot[h%hotSlots]
}

// LookHot returns the read of key, under way or held, that a caller
// arriving at now may share, without the group's mutex. A read is put in
// its slot when it begins (its key, start and channel set first), left
// there when it ends if its result may be kept, and taken out of it when
// it ends otherwise or by forget; a slot is checked against its key and
// window. The caller waits on the call's channel: closed once val and err
// are final.
func (s *share[V]) LookHot(key string, now int64) (*Call[V], bool) {
	c := s.slot(key).Load()
	if c == nil || c.key != key || now >= c.until.Load() || c.detached.Load() {
		return nil, false
	}
	return c, true
}

type heldCall[V any] struct {
	key string
	c   *Call[V]
}

// joinable reports whether a caller arriving at now may share the read c.
// (Loads are joined by their token: see registry.) The group's mutex
// is held.
func (s *share[V]) joinable(c *Call[V], now int64) bool {
	if !c.finished && s.window == 0 {
		return !c.sealed.Load()
	}
	return now < c.until.Load()
}

// hold keeps the finished call c shared for the rest of its window, if it
// has any left and its result may be kept, and reports whether it does.
// The group's mutex is held.
func (s *share[V]) hold(key string, c *Call[V], now int64) bool {
	until := min(c.began+s.window, c.val.ShareUntil(c.err))
	if s.window == 0 || c.detached.Load() || now >= until {
		c.until.Store(0)
		s.cool(key, c)
		return false
	}
	c.until.Store(until)
	s.held = append(s.held, heldCall[V]{key, c})
	return true
}

// cool takes key's call out of its hot slot, if it is there (c, or any
// call of key when c is nil): it ended with a result that is not kept, or
// a write detached it.
func (s *share[V]) cool(key string, c *Call[V]) {
	sl := s.slot(key)
	if cur := sl.Load(); cur != nil && cur.key == key && (c == nil || cur == c) {
		sl.CompareAndSwap(cur, nil)
	}
}

// expire forgets held results whose window is over. Calls are held in the
// order they finished, which is nearly the order their windows end: the
// sweep stops at the first still live, so a result may stay in the map up
// to one window past its end, unshared (joinable checks the time). The
// group's mutex is held; m is the group's map.
func (s *share[V]) expire(now int64, m map[string]*Call[V]) {
	i := 0
	for ; i < len(s.held) && now >= s.held[i].c.began+s.window; i++ {
		if h := s.held[i]; m[h.key] == h.c {
			delete(m, h.key)
		}
	}
	if i > 0 {
		n := copy(s.held, s.held[i:])
		clear(s.held[n:])
		s.held = s.held[:n]
	}
}
