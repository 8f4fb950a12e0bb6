package packcache

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/breaker"
	"github.com/packcache/packcache/internal/dictset"
	"github.com/packcache/packcache/internal/httpenc"
	"github.com/packcache/packcache/internal/owed"
	"github.com/packcache/packcache/internal/singleflight"
	"github.com/packcache/packcache/internal/tracking"
)

// tombstone is the whole stored value that remembers a loader's
// ErrNotFound. See FORMAT.md.
const tombstone = codec.HeaderTombstone

// cache is the byte-level core behind a Cache[T]: everything but the
// value's type, which kind describes. Values pass through it as an any
// holding a *T (nil: none).
type cache struct {
	rdb          redis.UniversalClient
	ser          Serializer
	kind         kind
	maxSize      int
	loadTimeout  time.Duration
	redisTimeout time.Duration
	coalesce     bool
	perCaller    bool
	strict       bool
	lockWait     time.Duration
	onError      func(ctx context.Context, key string, err error)
	serveError   ServeErrorFunc
	obs          Observer // nil: none
	base         *policy
	prefixes     []*policy      // longest prefix first
	dicts        dictset.Set    // zstd dictionaries: the policies' own and those fetched from Redis
	nodes        *breaker.Nodes // one circuit breaker per Redis node, and the judgement of its calls

	lookups singleflight.Group[result, flight] // Gets without a loader: read and decode
	reads   singleflight.Group[result, flight] // Gets with a loader: read, decode, and load on a miss
	loads   singleflight.Registry[result]      // loads, shared by the reads that found the same state
	leases  leaseBook                          // unsure leases, and nodes that refuse SET NX GET (lease.go)

	groups groupState // groups in use (groups.go)

	life  life
	owed  owed.Ledger // invalidations owed after a write failed on Redis, retried (internal/owed, pending.go)
	peers peers       // a Cluster's node clients, for retries that follow a failover (failover.go)

	served servedCounts // Serve's responses (serve.go)

	// The near caches (WithLocalCache), their invalidation stream, and
	// the marks that keep a read begun before a write out of them.
	nears     []*near
	tracker   *tracking.Tracker
	marks     marks
	nearOnce  sync.Once
	nearClock *otter.CoarseClock // otter's clock for the near caches' expiry (see newNear)
}

// needsPTTL reports whether a read of a key under p must learn the time the
// value has to live: to tell a stale value or one due for refresh, and to
// cap a near-cache entry's life by it (Redis tells of an expiry only when
// it gets round to deleting the key).
func (p *policy) needsPTTL() bool {
	return p.refreshAfter > 0 || p.staleFor > 0 || p.near != nil
}

// policy is a Policy resolved: every field set, in the form the cache
// uses, with its counters.
type policy struct {
	prefix       string
	codec        codec.Codec
	compress     bool // whether values above threshold are compressed
	threshold    int  // values longer than this are compressed
	minSaving    int  // bytes compression must save, at least 1
	ttl          time.Duration
	jitter       float64       // 0: none
	loader       loadOne       // nil: none
	negativeTTL  time.Duration // 0: not remembered
	refreshAfter time.Duration // 0: no refresh
	staleFor     time.Duration // 0: no stale window
	near         *near         // nil: no near cache
	stats        *counters

	// The policy's zstd dictionary, if any, and the dictionary set's way
	// to Redis for keys under the policy (dict.go).
	dict      *dictset.Writer // nil: no dictionary; else codec is its codec
	undict    codec.Codec     // with dict: the zstd codec of its level, for when it cannot be published
	dictRedis dictRedis
}

// result is what shared work hands its callers.
type result struct {
	val   any    // a *T; nil for none
	data  []byte // the serialized value, when each caller decodes its own
	size  int    // the serialized value's length, when decoded from Redis
	from  source
	stale bool
	// unshared: the read cannot be told of a later change of its key (a
	// grouped value, see checked; or a
	// TrackKeys near cache's read that Redis does not track for this
	// process), so it is shared only while in flight, never held.
	unshared bool
	// joined: the read that produced it joined a load another began, so
	// its callers shared work (for Stats and the Observer).
	joined bool
	// checked is, for a grouped value (one a load put in groups, or one
	// read from Redis in an envelope with groups), the number of the
	// last check of its groups (groupState.checks); 0 otherwise. Such a
	// value is unshared too.
	checked uint64
	// expires is when the value read expires in Redis, in unix
	// nanoseconds, when known (0 otherwise): it is shared no later.
	expires int64
	// stored is the value as Redis holds it, when read from there: Serve
	// may send it as it is. edge is what Serve keeps of a near-cache
	// entry (nil: nothing yet). See serve.go.
	stored string
	edge   *httpenc.Edge
}

// lateFor reports whether r is a grouped value whose groups were last
// checked (by its read, or its load) before a call that began when the
// groups' checks numbered since: an
// invalidation of its groups may have come between the check and the
// call (InvalidateGroups promises such a call no value from before it),
// so the call does not take it, and reads again.
func (r *result) lateFor(since uint64) bool {
	return r.checked != 0 && r.checked <= since
}

// ShareUntil says until when, in unix nanoseconds, a finished read with
// this outcome may be shared with later callers: values and misses may,
// for the share window but never past the value's expiry; errors and
// stale values may not (0), so that the next caller tries again.
func (r result) ShareUntil(err error) int64 {
	if (err != nil && !errors.Is(err, ErrMiss) && !errors.Is(err, ErrNotFound)) || r.stale || r.unshared {
		return 0
	}
	if r.expires != 0 {
		return r.expires
	}
	return 1<<63 - 1
}

type source uint8

const (
	fromRedis  source = iota
	fromLoader        // a load
	fromNear          // the near cache
)

// newCache is New for a T that k describes.
func newCache(rdb redis.UniversalClient, k kind, opts []Option) (*cache, error) {
	if rdb == nil {
		return nil, errors.New("packcache: nil redis client")
	}
	if err := checkClient(rdb); err != nil {
		return nil, err
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("packcache: %w", err)
		}
	}
	if err := cfg.applyEnv(); err != nil {
		return nil, fmt.Errorf("packcache: %w", err)
	}
	c := &cache{
		rdb:          rdb,
		ser:          cfg.serializer,
		kind:         k,
		maxSize:      cfg.maxValueSize,
		loadTimeout:  cfg.loadTimeout,
		redisTimeout: cfg.redisTimeout,
		coalesce:     cfg.coalesce,
		perCaller:    cfg.perCaller,
		strict:       cfg.strict,
		lockWait:     cfg.lockWait,
		onError:      cfg.errorHandler,
		serveError:   cfg.serveError,
		obs:          cfg.observer,
		nodes:        breaker.New(rdb, cfg.breaker, breakerEvents{cfg.observer}, cfg.redisTimeout),
	}
	for _, g := range []*singleflight.Group[result, flight]{&c.lookups, &c.reads} {
		g.Init(cfg.shareWindow, spawns{&c.life}, panicError)
	}
	c.loads.SetWindow(cfg.shareWindow) // for loads begun with Redis unreachable
	c.life.init()
	c.leases.init()
	c.owed.Init(owedStore{c}, c.redisTimeout)
	var err error
	if c.base, err = resolve(c, "", cfg.base); err != nil {
		return nil, cfg.envErr("", err)
	}
	for _, prefix := range cfg.sortedPrefixes() {
		p, err := resolve(c, prefix, cfg.prefixPolicy(prefix))
		if err != nil {
			return nil, cfg.envErr(prefix, err)
		}
		c.prefixes = append(c.prefixes, p)
	}
	c.peers.watch(rdb) // before the near cache's tracker meets the nodes
	if err := c.startNear(rdb, cfg); err != nil {
		return nil, err
	}
	c.nodes.Watch(rdb)
	return c, nil
}

// checkClient refuses a go-redis client that ignores context deadlines.
func checkClient(rdb redis.UniversalClient) error {
	var on bool
	switch c := rdb.(type) {
	case *redis.Client:
		on = c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		on = c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		on = c.Options().ContextTimeoutEnabled
	default:
		return nil // a client of another kind: its deadlines are its own
	}
	if !on {
		return errors.New("packcache: the redis client ignores context deadlines: set ContextTimeoutEnabled: true in its options, so that the cache's Redis time budget (WithRedisTimeout) bounds each call")
	}
	return nil
}

// resolve turns a merged Policy into c's form of it. Its dictionary, if
// any, joins c.dicts.
func resolve(c *cache, prefix string, p Policy) (*policy, error) {
	rp := &policy{
		stats:     &counters{},
		prefix:    prefix,
		codec:     p.Codec,
		compress:  p.CompressAbove != Off && p.Codec.ID() != codec.HeaderNone,
		threshold: max(p.CompressAbove, 0),
		minSaving: max(p.MinSaving, 1),
		ttl:       p.TTL,
		jitter:    max(p.TTLJitter, 0),
	}
	switch p.CompressAbove {
	case CompressAll:
		rp.threshold = 0
	case 0:
		rp.threshold = defaultCompressAbove
		if p.Dictionary != nil {
			rp.threshold = codec.DictionaryCompressAbove
		}
	}
	if p.Dictionary != nil {
		d, dc, err := c.dicts.Writer(p.Dictionary, p.Codec)
		if err != nil {
			return nil, fmt.Errorf("packcache: prefix %q: %w", prefix, err)
		}
		if rp.compress {
			rp.dict, rp.codec, rp.undict = d, dc, p.Codec
		}
	}
	rp.dictRedis = dictRedis{c, rp}
	rp.negativeTTL, rp.refreshAfter, rp.staleFor = max(p.NegativeTTL, 0), max(p.RefreshAfter, 0), max(p.StaleFor, 0)
	if p.Loader != nil && p.Loader != any(Off) {
		l, ok := c.kind.loader(p.Loader)
		if !ok {
			return nil, fmt.Errorf("packcache: loader for prefix %q is a %T, not a Loader[%s]", prefix, p.Loader, c.kind.t)
		}
		rp.loader = l
	}
	if rp.refreshAfter > 0 && rp.ttl != Off && rp.refreshAfter >= rp.ttl {
		return nil, fmt.Errorf("packcache: prefix %q: RefreshAfter %v is not shorter than TTL %v", prefix, rp.refreshAfter, rp.ttl)
	}
	return rp, nil
}

// life counts the calls and the background work in progress, so that
// Close can refuse new calls and wait for those under way.
type life struct {
	// state is closedBit once Close has begun, plus the number of calls
	// and goroutines of the cache's in progress.
	state  atomic.Int64
	idle   chan struct{} // closed when, after Close, nothing is in progress
	once   sync.Once
	ctx    context.Context // ends background work that outlives Close's wait
	cancel context.CancelFunc
}

const closedBit = 1 << 62

func (l *life) init() {
	l.idle = make(chan struct{})
	l.ctx, l.cancel = context.WithCancel(context.Background())
}

// enter registers a call, unless the cache is closed.
func (l *life) enter() bool {
	if l.state.Add(1)&closedBit != 0 {
		l.exit()
		return false
	}
	return true
}

// begin registers a call of op on key (a batch call's first key) with the
// cache's life, as enter does, or returns the error every call made once
// the cache is closed returns: an *Error naming op and key, matching
// ErrClosed.
func (l *life) begin(op, key string) error {
	if !l.enter() {
		return keyErr(op, key, ErrClosed)
	}
	return nil
}

// exit ends a call or a piece of background work.
func (l *life) exit() {
	if l.state.Add(-1) == closedBit {
		l.once.Do(func() { close(l.idle) })
	}
}

// spawn registers background work started by a call in progress, whose
// own registration keeps Close waiting: so it may start even after Close
// has begun.
func (l *life) spawn() { l.state.Add(1) }

// trySpawn is spawn for work that a caller could as well do itself: it
// refuses once Close has begun.
func (l *life) trySpawn() bool {
	if l.state.Load()&closedBit != 0 {
		return false
	}
	l.spawn()
	return true
}

// close is Close.
func (c *cache) close() error {
	if old := c.life.state.Or(closedBit); old&^closedBit == 0 {
		c.life.once.Do(func() { close(c.life.idle) })
	}
	defer c.closeNear()
	defer c.nodes.Close()
	t := time.NewTimer(c.loadTimeout + 2*c.redisTimeout)
	defer t.Stop()
	select {
	case <-c.life.idle:
		return closeOwed(&c.owed, &c.peers)
	case <-t.C:
	}
	c.life.cancel()
	t.Reset(c.redisTimeout)
	select {
	case <-c.life.idle:
		return closeOwed(&c.owed, &c.peers)
	case <-t.C:
		return errors.Join(fmt.Errorf("packcache: Close: %d calls or loads still running %v after Close began (a loader ignoring its context?)",
			c.life.state.Load()&^closedBit, c.loadTimeout+3*c.redisTimeout), closeOwed(&c.owed, &c.peers))
	}
}

// stats is Stats.
func (c *cache) stats() Stats {
	s := Stats{Prefixes: make(map[string]Counters, len(c.prefixes)+1)}
	s.Counters.Codecs = map[string]CodecStats{}
	for _, p := range append([]*policy{c.base}, c.prefixes...) {
		snap := p.stats.snapshot()
		s.Prefixes[p.prefix] = snap
		s.Counters.add(snap)
	}
	for _, n := range c.nears {
		s.NearBytes += n.entries.WeightedSize()
	}
	s.NearServing = len(c.nears) > 0 && c.nears[0].gate.Open()
	o := c.owed.Stats()
	s.Pending, s.PendingKept, s.PendingApplied, s.PendingExpired, s.PendingDropped = o.Owed, o.Kept, o.Applied, o.Expired, o.Dropped
	c.nodes.Each(func(b *breaker.Node) {
		open, since := b.State()
		s.Breakers = append(s.Breakers, BreakerState{Addr: b.Addr(), Open: open, Since: since})
	})
	s.Served = c.served.snapshot()
	return s
}

// closeNear stops the near caches' goroutines, once.
func (c *cache) closeNear() {
	c.nearOnce.Do(func() {
		if c.tracker != nil {
			c.tracker.Close()
		}
		for _, n := range c.nears {
			n.entries.StopAllGoroutines()
		}
		if c.nearClock != nil {
			c.nearClock.Stop()
		}
		c.changed(flushed)
	})
}

func (c *cache) policy(key string) *policy {
	for _, p := range c.prefixes {
		if strings.HasPrefix(key, p.prefix) {
			return p
		}
	}
	return c.base
}

func (c *cache) report(ctx context.Context, key string, err error) {
	if c.onError != nil {
		c.onError(ctx, key, err)
	}
}
