package singleflight

import (
	"sync"
	"time"
)

// A Registry keeps this process's loads under way, so that reads that
// find the same state of a key share one load: a reader joins the load
// whose lease it found in Redis, which proves that no write has come
// since the load began. Several loads of one key can be under way, each
// from a state of its own.
type Registry[V any] struct {
	mu      sync.Mutex
	latest  map[string]*Call[V]   // the latest load of each key; earlier ones under way hang from its prev
	byToken map[tokenKey]*Call[V] // by key and token (a token alone is not unique: two keys can hold the same bytes)
	// window is the share window: a load begun with Redis unreachable
	// (Unproven) is shared only within it, as a read is, since
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

// Unproven is the token of loads that begin with Redis unreachable.
const Unproven = "down"

// Claim returns the load of key from token under way that a caller may
// join, and true; or registers a new one and returns it and false (always,
// with share false: WithCoalescing(false)). leaderWaits says whether the
// caller that registers it will wait on it.
func (g *Registry[V]) Claim(key, token string, leaderWaits, share bool) (*Call[V], bool) {
	now := time.Now().UnixNano()
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.claimLocked(key, token, leaderWaits, share, now)
}

// claimLocked is claim with g.mu held.
func (g *Registry[V]) claimLocked(key, token string, leaderWaits, share bool, now int64) (*Call[V], bool) {
	c, ok := g.byToken[tokenKey{key, token}]
	ok = ok && share && !c.finished && !c.detached.Load()
	if ok && token == Unproven {
		ok = now < c.began+g.window
	}
	if !ok && share && token == Unproven && g.window > 0 {
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
		prev := g.byToken[tokenKey{key, token}]
		c = &Call[V]{began: now, token: token, overDetached: prev != nil && prev.detached.Load()}
		if prev := g.latest[key]; prev != nil && !prev.finished {
			c.prev = prev
		}
		if g.latest == nil {
			g.latest = make(map[string]*Call[V])
			g.byToken = make(map[tokenKey]*Call[V])
		}
		g.latest[key] = c
		g.byToken[tokenKey{key, token}] = c
	}
	if (ok || leaderWaits) && !c.finished && c.done == nil {
		c.done = make(chan struct{})
	}
	return c, ok
}

// ClaimRefresh registers a refresh of key from the value token names and
// returns it; or nil, if one from that value is under way, or if a
// refresh of this process stored over that value less than RefreshAfter
// ago. A read that found the value before that store can ask for its
// refresh after the refresh ended (its goroutine waiting for a CPU in
// between, on a busy machine): it would start a load of a value Redis
// no longer holds, whose store the digest guard then refuses. A value
// written again with the same bytes has a new TTL, and is not due for
// refresh before the mark ends.
func (g *Registry[V]) ClaimRefresh(key, token string) *Call[V] {
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

// StoredOver notes that a refresh of key stored over the value token
// names, until until (see claimRefresh). The marks are swept when their
// number doubles, so they hold at most about twice the keys refreshed in
// the last RefreshAfter.
func (g *Registry[V]) StoredOver(key, token string, until int64) {
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

// Finish publishes c's result, unless c has finished already (a load
// released at its timeout finishes before its loader returns), and
// reports whether it did.
func (g *Registry[V]) Finish(key string, c *Call[V], v V, err error) bool {
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

// Forget detaches every load of key under way from new callers, for a
// write: a load begun before it stores nothing over a value in place, and
// no later caller joins it.
func (g *Registry[V]) Forget(key string) {
	g.mu.Lock()
	for c := g.latest[key]; c != nil; c = c.prev {
		c.detached.Store(true)
	}
	delete(g.latest, key)
	g.mu.Unlock()
}

// ForgetAll is Forget of every key, for an invalidation whose keys are
// not known (a group's).
func (g *Registry[V]) ForgetAll() {
	g.mu.Lock()
	for _, c := range g.latest {
		for ; c != nil; c = c.prev {
			c.detached.Store(true)
		}
	}
	clear(g.latest)
	g.mu.Unlock()
}

// JoinOrWait returns the load of key under way with token, if any may be
// joined; if none, it registers c under token as well, as the load that
// waits for that lease, and returns nil.
func (g *Registry[V]) JoinOrWait(key, token string, c *Call[V]) *Call[V] {
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

// Placer reports whether a load other than self has taken token's place
// for key (see load: the load whose read placed a lease does), and
// returns it if it may be joined. A self that took the place of a load
// under token that a write had detached reports that one: the placer
// registered long since.
func (g *Registry[V]) Placer(key, token string, self *Call[V]) (*Call[V], bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	o, ok := g.byToken[tokenKey{key, token}]
	if o == self {
		return nil, self.overDetached
	}
	if !ok {
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

// IsDetached reports whether a write detached c (see forget).
func (g *Registry[V]) IsDetached(c *Call[V]) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return c.detached.Load()
}

// SetWindow sets the share window of loads begun with Redis unreachable
// (see Unproven).
func (g *Registry[V]) SetWindow(window time.Duration) { g.window = int64(window) }

// Len is the number of loads under way, by key and token: for tests that
// must know a load has ended, not only that its value is stored.
func (g *Registry[V]) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.byToken)
}
