package packcache

import (
	"context"
	"errors"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// Coalescing: the one place where concurrent callers share work. A group
// shares a read of one key among the callers that come within its share
// window (Get's reads, with and without a loader); the registry shares a
// load among the reads that found the same state of the key in Redis (a
// lease, a value's digest). Both hand out a call, which callers wait on
// under their own contexts (wait); protect turns a panic in shared work
// into an error for all of them.

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
//   - which callers may share a read is the share window's rule (below):
//     within the window of the moment the read began, never
//     past the value's expiry;
//   - forget detaches reads from new callers, for writes.
//
// V is the result; A is the read, passed by value so that the uncontended
// path allocates no closure. (Loads are shared by another rule, and kept
// by the load registry below.)
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
	own      bool         // for reads: the work runs on a goroutine of its own, not a caller's
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
		c.own = true // before the goroutine starts, which reads it
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

// forgetAll is forget of every key, for an invalidation whose keys are
// not known (a group's): it costs a walk of the reads under way or held.
func (g *group[V, A]) forgetAll() {
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
type share[V shareable] struct {
	window int64 // nanoseconds

	held []heldCall[V] // finished calls still shared, in the order they finished

	// hot holds, for each of a few buckets of keys, the latest read of a
	// key in it, under way or held, so that a caller finds it without the
	// group's mutex: twenty thousand callers of a surge taking a mutex in
	// turn, and growing their stacks through the slow path, would cost
	// more than the read; while the read is under way its callers would
	// contend for the mutex only to wait.
	hot [hotSlots]atomic.Pointer[call[V]]
}

const hotSlots = 64

// A shareable result says until when it may be shared once its work has
// finished (see result.shareUntil).
type shareable interface {
	shareUntil(err error) int64
}

// slot returns key's hot slot. Keys are spread by FNV-1a: which keys
// share a slot matters little, as a slot is checked against its key.
func (s *share[V]) slot(key string) *atomic.Pointer[call[V]] {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h = (h ^ uint32(key[i])) * 16777619
	}
	return &s.hot[h%hotSlots]
}

// lookHot returns the read of key, under way or held, that a caller
// arriving at now may share, without the group's mutex. A read is put in
// its slot when it begins (its key, start and channel set first), left
// there when it ends if its result may be kept, and taken out of it when
// it ends otherwise or by forget; a slot is checked against its key and
// window. The caller waits on the call's channel: closed once val and err
// are final.
func (s *share[V]) lookHot(key string, now int64) (*call[V], bool) {
	c := s.slot(key).Load()
	if c == nil || c.key != key || now >= c.until.Load() || c.detached.Load() {
		return nil, false
	}
	return c, true
}

type heldCall[V any] struct {
	key string
	c   *call[V]
}

// joinable reports whether a caller arriving at now may share the read c.
// (Loads are joined by their token: see registry.) The group's mutex
// is held.
func (s *share[V]) joinable(c *call[V], now int64) bool {
	if !c.finished && s.window == 0 {
		return !c.sealed.Load()
	}
	return now < c.until.Load()
}

// hold keeps the finished call c shared for the rest of its window, if it
// has any left and its result may be kept, and reports whether it does.
// The group's mutex is held.
func (s *share[V]) hold(key string, c *call[V], now int64) bool {
	until := min(c.began+s.window, c.val.shareUntil(c.err))
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
func (s *share[V]) cool(key string, c *call[V]) {
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
func (s *share[V]) expire(now int64, m map[string]*call[V]) {
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

// A registry keeps this process's loads under way, so that reads that
// find the same state of a key share one load: a reader joins the load
// whose lease it found in Redis, which proves that no write has come
// since the load began. Several loads of one key can be under way, each
// from a state of its own.
type registry struct {
	mu      sync.Mutex
	latest  map[string]*call[result]   // the latest load of each key; earlier ones under way hang from its prev
	byToken map[tokenKey]*call[result] // by key and token (a token alone is not unique: two keys can hold the same bytes)
	// window is the share window: a load begun with Redis unreachable
	// (unprovenToken) is shared only within it, as a read is, since
	// nothing proves the key unwritten since.
	window int64
	// replaced holds, for the keys a refresh stored over lately, the
	// token of the value it replaced (see claimRefresh); it is swept of
	// marks past their time when it reaches sweepAt entries.
	replaced map[string]replacedMark
	sweepAt  int
}

// A replacedMark is the value a refresh of a key stored over, until when
// it is remembered (unix nanoseconds).
type replacedMark struct {
	token string
	until int64
}

type tokenKey struct{ key, token string }

// unprovenToken is the token of loads that begin with Redis unreachable.
const unprovenToken = "down"

// owedToken is the token of loads of a key whose invalidation is owed.
const owedToken = "owed"

// claim returns the load of key from token under way that a caller may
// join, and true; or registers a new one and returns it and false (always,
// with share false: WithCoalescing(false)). leaderWaits says whether the
// caller that registers it will wait on it.
func (g *registry) claim(key, token string, leaderWaits, share bool) (*call[result], bool) {
	now := time.Now().UnixNano()
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.claimLocked(key, token, leaderWaits, share, now)
}

// claimLocked is claim with g.mu held.
func (g *registry) claimLocked(key, token string, leaderWaits, share bool, now int64) (*call[result], bool) {
	c, ok := g.byToken[tokenKey{key, token}]
	ok = ok && share && !c.finished && !c.detached.Load()
	if ok && token == unprovenToken {
		ok = now < c.began+g.window
	}
	if !ok && share && token == unprovenToken && g.window > 0 {
		// Redis did not answer the read: rather than start one more load,
		// join the key's latest load under way, whatever state it began
		// from. No write of this process came since it began (a write
		// detaches it), and its value is what the source held when it
		// began, at most the load timeout ago: one load per key in this
		// process, whatever Redis's state. (WithShareWindow(Off) asks for
		// no value older than the call: then it starts its own.)
		if l := g.latest[key]; l != nil && !l.finished && !l.detached.Load() {
			c, ok = l, true
		}
	}
	if !ok {
		c = &call[result]{began: now, token: token}
		if prev := g.latest[key]; prev != nil && !prev.finished {
			c.prev = prev
		}
		if g.latest == nil {
			g.latest = make(map[string]*call[result])
			g.byToken = make(map[tokenKey]*call[result])
		}
		g.latest[key] = c
		g.byToken[tokenKey{key, token}] = c
	}
	if (ok || leaderWaits) && !c.finished && c.done == nil {
		c.done = make(chan struct{})
	}
	return c, ok
}

// claimRefresh registers a refresh of key from the value token names and
// returns it; or nil, if one from that value is under way, or if a
// refresh of this process stored over that value less than RefreshAfter
// ago. A read that found the value before that store can ask for its
// refresh after the refresh ended (its goroutine waiting for a CPU in
// between, on a busy machine): it would start a load of a value Redis
// no longer holds, whose store the digest guard then refuses. A value
// written again with the same bytes has a new TTL, and is not due for
// refresh before the mark ends.
func (g *registry) claimRefresh(key, token string) *call[result] {
	now := time.Now().UnixNano()
	g.mu.Lock()
	defer g.mu.Unlock()
	if m, ok := g.replaced[key]; ok {
		if now < m.until && m.token == token {
			return nil
		}
		if now >= m.until {
			delete(g.replaced, key)
		}
	}
	if cl, joined := g.claimLocked(key, token, false, true, now); !joined {
		return cl
	}
	return nil
}

// storedOver notes that a refresh of key stored over the value token
// names, until until (see claimRefresh). The marks are swept when their
// number doubles, so they hold at most about twice the keys refreshed in
// the last RefreshAfter.
func (g *registry) storedOver(key, token string, until int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.replaced) >= g.sweepAt {
		now := time.Now().UnixNano()
		for k, m := range g.replaced {
			if now >= m.until {
				delete(g.replaced, k)
			}
		}
		g.sweepAt = max(2*len(g.replaced), 64)
	}
	if g.replaced == nil {
		g.replaced = make(map[string]replacedMark)
	}
	g.replaced[key] = replacedMark{token, until}
}

// finish publishes c's result, unless c has finished already (a load
// released at its timeout finishes before its loader returns), and
// reports whether it did.
func (g *registry) finish(key string, c *call[result], v result, err error) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c.finished {
		return false
	}
	c.val, c.err, c.finished = v, err, true
	for _, token := range append(c.aliases, c.token) {
		if tk := (tokenKey{key, token}); g.byToken[tk] == c {
			delete(g.byToken, tk)
		}
	}
	if g.latest[key] == c {
		delete(g.latest, key)
	}
	c.prev = nil
	c.release()
	return true
}

// forget detaches every load of key under way from new callers, for a
// write: a load begun before it stores nothing over a value in place, and
// no later caller joins it.
func (g *registry) forget(key string) {
	g.mu.Lock()
	for c := g.latest[key]; c != nil; c = c.prev {
		c.detached.Store(true)
	}
	delete(g.latest, key)
	g.mu.Unlock()
}

// forgetAll is forget of every key, for an invalidation whose keys are
// not known (a group's).
func (g *registry) forgetAll() {
	g.mu.Lock()
	for _, c := range g.latest {
		for ; c != nil; c = c.prev {
			c.detached.Store(true)
		}
	}
	clear(g.latest)
	g.mu.Unlock()
}

// joinOrWait returns the load of key under way with token, if any may be
// joined; if none, it registers c under token as well, as the load that
// waits for that lease, and returns nil.
func (g *registry) joinOrWait(key, token string, c *call[result]) *call[result] {
	g.mu.Lock()
	defer g.mu.Unlock()
	tk := tokenKey{key, token}
	if o, ok := g.byToken[tk]; ok && o != c && !o.finished && !o.detached.Load() {
		if o.done == nil {
			o.done = make(chan struct{})
		}
		return o
	}
	if !c.finished && g.byToken[tk] != c {
		g.byToken[tk] = c
		c.aliases = append(c.aliases, token)
	}
	return nil
}

// placer reports whether a load other than self has taken token's place
// for key (see load: the load whose read placed a lease does), and
// returns it if it may be joined.
func (g *registry) placer(key, token string, self *call[result]) (*call[result], bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	o, ok := g.byToken[tokenKey{key, token}]
	if !ok || o == self {
		return nil, false
	}
	if o.finished || o.detached.Load() {
		return nil, true
	}
	if o.done == nil {
		o.done = make(chan struct{})
	}
	return o, true
}

// isDetached reports whether a write detached c (see forget).
func (g *registry) isDetached(c *call[result]) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return c.detached.Load()
}
