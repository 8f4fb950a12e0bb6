package packcache

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/internal/heapsize"
	"github.com/packcache/packcache/internal/httpenc"
	"github.com/packcache/packcache/internal/tracking"
)

// LocalCache configures a near cache: decoded values kept in this process
// and served without touching Redis, kept fresh by Redis itself (see
// WithLocalCache). Its fields follow the options' rule: zero means the
// default.
type LocalCache struct {
	// MaxBytes bounds the estimated bytes of the entries held, 64 MiB by
	// default: an entry weighs the heap its decoded value keeps alive
	// (estimated by walking it once, when it is kept: strings, backing
	// arrays by capacity, maps, boxed values, pointers, each rounded as
	// the allocator rounds it), or with WithDecodePerCaller its serialized
	// copy, plus its key's length and a small overhead, and, once Serve
	// has served a key of the near cache, also the value as stored and the
	// bodies Serve made from it (see Cache.Serve). Entries are evicted by
	// the W-TinyLFU policy of github.com/maypok86/otter/v2 once the total
	// passes it. As a Policy's Local, Off turns the near cache off for the
	// prefix.
	MaxBytes int64

	// TTL is the longest an entry is served, however fresh the
	// invalidation stream proves it; a minute by default. An entry never
	// outlives its value in Redis either, nor the moment it turns stale or
	// due for refresh.
	TTL time.Duration

	// MaxLag is how long the near cache trusts its invalidation stream
	// without proof, 500 ms by default. It sends a heartbeat through each
	// invalidation connection every quarter of MaxLag, and serves entries
	// only while a heartbeat sent at most MaxLag ago has come back; since
	// Redis sends a key's invalidation before any later reply, a write
	// that Redis completed more than MaxLag before a Get began is never
	// hidden from it.
	MaxLag time.Duration

	// Tracking is what Redis tells this process of: writes of every key
	// under the near-cached prefixes (TrackPrefixes, the default), or only
	// of the keys this process read into its near cache (TrackKeys). See
	// Tracking.
	Tracking Tracking

	// Untracked, if not zero, makes a near cache that no invalidation
	// keeps: an entry is served for at most Untracked after the read that
	// filled it was sent (and never past TTL, nor past its value's life
	// in Redis), whatever is written meanwhile. It is for a server without
	// CLIENT TRACKING, where New refuses a near cache otherwise (see
	// ErrTrackingRefused). MaxLag and Tracking do not apply; TrackKeys with
	// Untracked is refused.
	//
	// WARNING: entries of an Untracked near cache are never invalidated by
	// writes, not even by the writes of other processes through packcache:
	// a Get may return a value up to Untracked older than what Redis holds.
	// This process's own Set, SetMany and Delete still drop its own entry.
	Untracked time.Duration
}

// Tracking is how a near cache learns that a key was written.
type Tracking uint8

const (
	// TrackPrefixes has Redis send this process the name of every key
	// written under the near-cached prefixes (CLIENT TRACKING in broadcast
	// mode), whether or not the process holds it: one message per write
	// per process, however few keys the process holds. It costs Redis no
	// memory per key.
	TrackPrefixes Tracking = iota

	// TrackKeys has Redis remember which keys this process read into its
	// near cache (CLIENT TRACKING in OPTIN mode: each read that fills the
	// near cache runs, after CLIENT CACHING yes, on a connection of the
	// near cache's own), and send it a key's invalidation only if it read
	// the key since the last one: a process receives about one message per
	// key it read, not one per write of the prefix. Redis keeps a record
	// per key and reading process (its tracking table, bounded by the
	// server's tracking-table-max-keys).
	//
	// WARNING: only Get, GetOrLoad and Serve fill a TrackKeys near cache,
	// not GetMany and GetOrLoadMany (they read many keys in one pipeline
	// per node on the application's client), and only through one of its
	// 4 reading connections per master: a read that finds them all busy is
	// made on the application's client, and fills nothing. Those
	// connections do not run the application's client's hooks. A failure of one of the near
	// cache's reading connections (a timeout, a dropped connection) empties
	// the near cache, since Redis forgets the keys that connection read.
	TrackKeys
)

// The near cache's defaults, for its zero fields.
const (
	defaultNearBytes  = 64 << 20
	defaultNearTTL    = time.Minute
	defaultNearMaxLag = 500 * time.Millisecond
)

// entryOverhead is what an entry costs besides its key and value: otter's
// node, the entry struct, map slots.
const entryOverhead = 160

func (lc LocalCache) zero() bool { return lc == LocalCache{} }

// check reports fields outside the rule, and fills in the defaults.
func (lc *LocalCache) check() error {
	switch {
	case lc.MaxBytes == Off:
		return nil
	case lc.MaxBytes == 0:
		lc.MaxBytes = defaultNearBytes
	case lc.MaxBytes < 0:
		return fmt.Errorf("LocalCache: MaxBytes %d is neither a size nor Off", lc.MaxBytes)
	}
	switch {
	case lc.TTL == 0:
		lc.TTL = defaultNearTTL
	case lc.TTL < 0:
		return fmt.Errorf("LocalCache: TTL %v is negative", lc.TTL)
	}
	switch {
	case lc.Tracking > TrackKeys:
		return fmt.Errorf("LocalCache: Tracking %d is neither TrackPrefixes nor TrackKeys", lc.Tracking)
	case lc.Untracked < 0:
		return fmt.Errorf("LocalCache: Untracked %v is negative", lc.Untracked)
	case lc.Untracked > 0 && lc.Tracking == TrackKeys:
		return errors.New("LocalCache: Untracked and TrackKeys: an untracked near cache tracks nothing")
	}
	switch {
	case lc.MaxLag == 0:
		lc.MaxLag = defaultNearMaxLag
	case lc.MaxLag < 0:
		return fmt.Errorf("LocalCache: MaxLag %v is negative", lc.MaxLag)
	}
	return nil
}

// WithLocalCache keeps decoded values in this process, in a near cache in
// front of Redis, for keys whose prefix's Policy does not set Local (see
// LocalCache).
//
// A Get of a key the near cache holds returns its value without touching
// Redis: a surge on a hot key costs its callers a map read each. Values
// are shared among callers as coalesced values are (read-only, unless
// WithDecodePerCaller, which decodes a copy for each caller).
//
// The near cache is kept fresh by Redis: the cache opens one connection
// per Redis master (following a Cluster's topology) on which it enables
// CLIENT TRACKING in broadcast mode for the prefixes that have a near
// cache (Redis 6.0 or later), so that a write of such a key by anyone (any
// process, redis-cli, a Lua script, expiry, eviction, FLUSHALL) removes the
// entry within the invalidation's delivery time: about a millisecond on a
// LAN, and never more than MaxLag (see LocalCache.MaxLag) for writes Redis
// completed before a Get began. If an invalidation connection drops or
// stalls, the near cache stops serving, and is emptied before it serves
// again. This process's own Set, SetMany and Delete remove the entry at
// once. With LocalCache.Tracking set to TrackKeys, Redis tracks only the
// keys this process read into its near cache (see Tracking). New fails
// with ErrTrackingRefused where a server refuses CLIENT TRACKING, unless
// the near cache is LocalCache.Untracked, bounded by time alone. A read or load that began before a write never puts its value in
// the near cache after that write.
//
// Only values read from Redis enter the near cache: not values loaded
// (the store of a load is a write, which removes the entry; the next Get
// reads Redis and keeps the value), not remembered ErrNotFound, not values
// past their TTL kept for StaleFor, and not values due for RefreshAfter. A
// Get that misses the near cache is coalesced and shares reads as
// WithShareWindow says.
func WithLocalCache(lc LocalCache) Option {
	return func(cfg *config) error {
		l := lc // not lc itself: an Option may be applied twice
		if err := l.check(); err != nil {
			return fmt.Errorf("WithLocalCache: %w", err)
		}
		cfg.base.Local = l
		return nil
	}
}

// A near is one near cache: the entries of the prefixes that share one
// LocalCache configuration.
type near struct {
	lc      LocalCache
	entries *otter.Cache[string, *nearEntry] // by pointer: a near hit copies a word out of otter, not the entry
	gate    *tracking.Gate                   // whether it may serve now, and take in a key's value; set by New before any call
	marks   *marks                           // the cache's write marks, which tickets are checked against
	// edged is set by the first Serve of a key of this near cache: from
	// then on its entries keep what Serve needs (see edge).
	edged atomic.Bool
}

type nearEntry struct {
	val    any           // a *T
	data   []byte        // the serialized value, when each caller decodes its own
	edge   *httpenc.Edge // what Serve keeps, once the near cache is edged
	weight uint32
	// groups are the marks of a grouped value's groups: the entry is
	// served only while they hold (see groupTickets).
	groups groupTickets
	// expires is when the entry ends, in nanoseconds since the gate's
	// epoch on the monotonic clock (see get): given as a time, not a
	// duration from when the entry is set, so that it ends then however
	// long setting it takes.
	expires int64
}

// newNear makes a near cache whose entries otter expires by clock, a
// coarse one: get checks each entry's end itself, on the gate's reading of
// the precise clock, so that a near hit reads the clock once, and otter's
// expiry only frees the memory of entries past their end.
func newNear(lc LocalCache, m *marks, clock otter.Clock) (*near, error) {
	if err := lc.check(); err != nil {
		return nil, err
	}
	n := &near{lc: lc, marks: m}
	var err error
	n.entries, err = otter.New(&otter.Options[string, *nearEntry]{
		MaximumWeight: uint64(lc.MaxBytes),
		Weigher:       func(_ string, e *nearEntry) uint32 { return e.weight },
		ExpiryCalculator: otter.ExpiryCreatingFunc(func(e otter.Entry[string, *nearEntry]) time.Duration {
			now, _ := n.gate.OpenNow()
			return time.Duration(e.Value.expires - now)
		}),
		Clock: clock,
	})
	if err != nil {
		return nil, fmt.Errorf("packcache: near cache: %w", err)
	}
	return n, nil
}

// get returns key's entry if the near cache may serve it now. The entry
// is never changed once set: the caller only reads it.
func (n *near) get(key string) (*nearEntry, bool) {
	now, open := n.gate.OpenNow()
	if !open {
		return nil, false
	}
	e, ok := n.entries.GetIfPresent(key)
	if !ok || now >= e.expires {
		return nil, false
	}
	if e.groups.stripes != nil && !n.marks.groupsValid(e.groups) {
		// A group of the value was invalidated.
		n.entries.Invalidate(key)
		return nil, false
	}
	return e, true
}

// put keeps r as key's value if nothing invalidated key since ticket was
// taken (before the read that produced r was sent), nor any of its
// groups since gt was. until, if not zero, is when the entry must end.
func (n *near) put(key string, t ticket, gt groupTickets, r result, until time.Time) {
	if !n.gate.Admits(key) || !n.marks.valid(key, t) || !n.marks.groupsValid(gt) {
		return
	}
	if until.IsZero() && n.lc.Untracked > 0 {
		return // an untracked entry's end is always given (see near.keepRead)
	}
	var eg *httpenc.Edge
	var stored int64
	if n.edged.Load() && r.stored != "" {
		eg = httpenc.NewEdge(bytesOf(r.stored))
		stored = int64(len(r.stored))
	}
	w, ok := n.weigh(key, r, gt, stored)
	if !ok {
		return
	}
	if most := time.Now().Add(n.lc.TTL); until.IsZero() || until.After(most) {
		until = most
	}
	e := &nearEntry{val: r.val, data: r.data, edge: eg, groups: gt, weight: uint32(w), expires: int64(until.Sub(n.gate.Epoch()))}
	n.entries.Set(key, e)
	// A write of key may have come between the check of the ticket and
	// the Set: look again, and undo.
	if !n.marks.valid(key, t) || !n.marks.groupsValid(gt) {
		n.entries.Invalidate(key)
	}
}

// weigh returns what an entry of key keeping r and gt weighs, and stored
// bytes of the value as Redis holds it besides (for Serve), unless that is
// over the near cache's bound. An entry weighs the heap it keeps alive:
// its key, its overhead, its groups' marks, and the decoded value (as
// internal/heapsize estimates it: a decoded document is often several
// times its serialized length) or the serialized copy each caller decodes
// its own from. The value is weighed once, here; its walk stops as soon
// as it cannot fit.
func (n *near) weigh(key string, r result, gt groupTickets, stored int64) (int64, bool) {
	w := int64(len(key)+entryOverhead) + stored
	w += heapsize.Alloc(uintptr(cap(gt.stripes))*4, false) + heapsize.Alloc(uintptr(cap(gt.vals))*8, false)
	if r.data != nil {
		w += heapsize.Bytes(r.data)
	}
	if r.val != nil && w <= n.lc.MaxBytes {
		w += heapsize.Of(r.val, n.lc.MaxBytes-w)
	}
	return w, w <= n.lc.MaxBytes && w <= 1<<32-1
}

// grow adds by bytes to the weight of key's entry, if it is still the one
// of eg, or drops the entry if that would take it past the bound: Serve
// keeps the bodies it makes in the entry's edge.
func (n *near) grow(key string, eg *httpenc.Edge, by int) {
	n.entries.ComputeIfPresent(key, func(e *nearEntry) (*nearEntry, otter.ComputeOp) {
		if e.edge != eg {
			return e, otter.CancelOp
		}
		w := int64(e.weight) + int64(by)
		if w > n.lc.MaxBytes || w > 1<<32-1 {
			return e, otter.InvalidateOp
		}
		grown := *e // a copy: readers may hold e
		grown.weight = uint32(w)
		return &grown, otter.WriteOp
	})
}

// A ticket records the invalidation state of a key when a read of it
// began, so that the read's value enters the near cache only if no write of
// the key came since.
type ticket struct {
	epoch, stripe uint64
}

// stripes is the number of invalidation counters keys are spread over: a
// write of one key refuses the near cache the reads in flight of the keys
// that share its counter, one in 4096.
const stripes = 4096

// marks holds the counters that tickets are checked against.
type marks struct {
	epoch   atomic.Uint64 // bumped when everything is invalidated
	stripes [stripes]atomic.Uint64
	groups  [stripes]atomic.Uint64 // by group: see groupTickets
	seed    maphash.Seed
}

func (m *marks) stripe(key string) *atomic.Uint64 {
	return &m.stripes[maphash.String(m.seed, key)%stripes]
}

func (m *marks) take(key string) ticket {
	return ticket{m.epoch.Load(), m.stripe(key).Load()}
}

func (m *marks) valid(key string, t ticket) bool {
	return m.epoch.Load() == t.epoch && m.stripe(key).Load() == t.stripe
}

// touch records a write of key: reads of it in flight keep their values out.
func (m *marks) touch(key string) { m.stripe(key).Add(1) }

// touchAll records that anything may have been written.
func (m *marks) touchAll() { m.epoch.Add(1) }

// startNear makes the near caches the policies ask for (one for the base
// and the prefixes that inherit it, one for each prefix with a LocalCache
// of its own) and starts their invalidation stream.
func (c *cache) startNear(rdb redis.UniversalClient, cfg config) (err error) {
	defer func() {
		if err != nil && c.nearClock != nil {
			c.nearClock.Stop()
		}
	}()
	var tracked []string // broadcast prefixes
	minLag := time.Duration(0)
	keys := false // a near cache tracks per key
	anyTracked := false
	track := func(prefix string, lc LocalCache) {
		switch {
		case lc.Untracked > 0:
			return
		case lc.Tracking == TrackKeys:
			keys = true
		default:
			tracked = append(tracked, prefix)
		}
		anyTracked = true
		if minLag == 0 || lc.MaxLag < minLag {
			minLag = lc.MaxLag
		}
	}
	add := func(p *policy, lc LocalCache) error {
		if c.nearClock == nil {
			// Otter's expiry needs no precision (see newNear): one read of
			// the time a second, for all the near caches.
			c.nearClock = otter.NewCoarseClock(time.Second)
		}
		n, err := newNear(lc, &c.marks, c.nearClock)
		if err != nil {
			return err
		}
		p.near = n
		c.nears = append(c.nears, n)
		c.groups.marks = &c.marks
		track(p.prefix, n.lc)
		return nil
	}
	if lc := cfg.base.Local; !lc.zero() && lc.MaxBytes != Off {
		if err := add(c.pols.base, lc); err != nil {
			return err
		}
	}
	for _, p := range c.pols.prefixes {
		switch own := cfg.prefixes[p.prefix].Local; {
		case own.zero():
			if c.pols.base.near != nil {
				p.near = c.pols.base.near
				track(p.prefix, p.near.lc)
			}
		case own.MaxBytes != Off:
			if err := add(p, own); err != nil {
				return err
			}
		}
	}
	if len(c.nears) == 0 {
		return nil
	}
	c.marks.seed = maphash.MakeSeed()
	if !anyTracked {
		// Untracked near caches alone: bounded by time, no stream.
		for _, n := range c.nears {
			n.gate = tracking.Untracked()
		}
		return nil
	}
	// The groups' records too: a near cache drops a group's members when
	// another process invalidates it (groups.go).
	tracked = append(tracked, groupPrefix)
	tr, err := startTracker(rdb, streamHandler{c}, c.remote.redisTimeout, tracked, minLag/4, keys, cfg.readHooks)
	if err != nil {
		for _, n := range c.nears {
			n.entries.StopAllGoroutines()
		}
		return err
	}
	c.remote.tracker = tr
	for _, n := range c.nears {
		if n.lc.Untracked > 0 {
			n.gate = tracking.Untracked()
		} else {
			n.gate = tr.Gate(n.lc.MaxLag)
		}
	}
	return nil
}

// keepRead puts a value read from Redis in key's near cache, unless a
// write of key came since t. The entry lives no longer than the value in
// Redis, counted from when the read was sent (Redis expires it later
// still), nor past the moment it turns stale or due for refresh: a value
// that expires now (PTTL 0) is not kept at all.
//
// Under TrackKeys only a tracked read (rp.tracked) is kept; an Untracked
// entry ends Untracked after its read was sent.
func (n *near) keepRead(key string, p *policy, t ticket, j judgement, rp reply) {
	lc := n.lc
	if lc.Tracking == TrackKeys && !rp.tracked {
		return
	}
	var until time.Time // zero: no expiry; the near cache's TTL caps it
	if lc.Untracked > 0 {
		if rp.sent.IsZero() {
			return
		}
		until = rp.sent.Add(lc.Untracked)
	}
	if j.left >= 0 {
		if stale := j.expires.Add(-p.staleFor); until.IsZero() || stale.Before(until) {
			until = stale // stale from then
		}
		if p.refreshAfter > 0 {
			// Due once its age, TTL + StaleFor - left, reaches RefreshAfter.
			if due := j.expires.Add(p.refreshAfter - j.ttl - p.staleFor); due.Before(until) {
				until = due
			}
		}
	}
	if !until.IsZero() && !time.Now().Before(until) {
		return
	}
	n.put(key, t, j.marks, j.r, until)
}

// A streamHandler is the cache as the invalidation stream's
// tracking.Handler: what the stream says reaches changed, and its
// failures the error handler.
type streamHandler struct{ c *cache }

func (h streamHandler) Invalidate(keys []string) {
	if !slices.ContainsFunc(keys, isGroupKey) {
		h.c.changed(invalidated, keys...)
		return
	}
	var rest []string
	for _, k := range keys {
		if isGroupKey(k) {
			h.c.changed(groupsInvalidated, k)
		} else {
			rest = append(rest, k)
		}
	}
	h.c.changed(invalidated, rest...)
}
func (h streamHandler) Flush()           { h.c.changed(flushed) }
func (h streamHandler) Report(err error) { h.c.tel.report(context.Background(), "", err) }
