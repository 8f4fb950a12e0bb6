package packcache

import "sync/atomic"

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
