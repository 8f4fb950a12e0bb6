package packcache

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/internal/singleflight"
)

// A Loader loads the value for a key from the source of truth, such as a
// database, when the cache does not hold it.
//
// Load returns ErrNotFound when the source has no value for key; with a
// NegativeTTL the cache remembers that. It returns a value together with
// DoNotCache for a value that callers may use but the cache must not keep.
// Any other error fails the callers waiting for the load and is not
// cached: the next Get calls the loader again. For a Cache of a pointer
// type, a nil pointer with a nil error is refused (ErrNilValue): return
// ErrNotFound instead.
//
// A Loader is called on a goroutine of the cache's under a context that
// carries the first caller's values but not its cancellation, and ends
// after WithLoadTimeout (or at Close, if the load outlives Close's wait).
// Callers still waiting when it ends get an error matching ErrLoadTimeout,
// and nothing is stored, even if Load returns a value later. A panic in
// Load becomes a *PanicError for every caller waiting for it.
//
// Before a Loader is called for a key that Redis does not hold, the cache
// writes a lease in the key (see FORMAT.md): a Set or Delete of the key
// made while the load runs, by any process, replaces the lease, and the
// loaded value is then returned to the callers waiting for it but not
// stored. The read of a Get with a loader places the lease itself (SET
// key lease NX GET PX, which writes nothing where the key holds a value),
// so a miss costs two round trips, the read and the store, as a plain GET
// and SET do, and a hit one. A lease lives three Redis budgets
// (WithRedisTimeout), and the load extends it every budget while Load
// runs: a lease lives as long as its load, and one whose process stalled,
// died or gave up blocks stores of the key for three budgets at most.
//
// WARNING: reads with a loader are SET commands. They go to the key's
// master even where the client reads from replicas (ReadOnly,
// RouteByLatency, RouteRandomly), and Redis refuses them where it refuses
// writes: under maxmemory with noeviction (OOM), for an ACL user without
// SET, on a server older than 7.0 (a syntax error). A node that refuses
// one is read with GET at once and for a second after, and its misses
// take their lease by script (a third round trip), or, where that is
// refused too, load without storing.
//
// With a loader, Get also:
//   - reloads a stored value it cannot decode, reporting the error to the
//     error handler, and overwrites it unless it changed meanwhile;
//   - answers from the loader when Redis fails or the node's circuit
//     breaker is open (unless WithStrictRedis), reporting the Redis error,
//     and stores nothing;
//   - with RefreshAfter, reloads in the background a value that is older,
//     once per key per process at a time, and not again from a value its
//     reload has replaced, while callers get the cached one; the reload
//     stores its value only if the key still holds the value it began
//     from;
//   - with StaleFor, reloads a value past its TTL and returns it if the
//     reload fails.
//
// WARNING: a Load that calls Get, GetOrLoad or GetOrLoadMany for the key
// it is loading, with the context it was given, gets ErrReentrantLoad at
// once: waiting for its own load, it would wait until the load timeout.
// (With a context not derived from its own, the cache cannot tell, and
// that call waits.)
type Loader[T any] interface {
	// Load returns the value of key from the source, or ErrNotFound when
	// the source does not hold it. It runs under a context with the
	// caller's values, bounded by WithLoadTimeout.
	Load(ctx context.Context, key string) (T, error)
}

// LoaderFunc adapts a function to a Loader.
type LoaderFunc[T any] func(ctx context.Context, key string) (T, error)

// Load calls f(ctx, key).
func (f LoaderFunc[T]) Load(ctx context.Context, key string) (T, error) { return f(ctx, key) }

// WithLoader makes Get read through l for keys whose prefix's Policy has no
// Loader of its own. l must be a Loader of the cache's T, or New fails.
func WithLoader[T any](l Loader[T]) Option {
	return nonNil("WithLoader", "loader", l == nil, func(cfg *config) { cfg.base.Loader = l })
}

// loading marks a load's context with the keys it loads, to catch a
// loader that waits for its own load.
type loading struct {
	cache  any
	keys   []string
	parent *loading

	// What StoreWith set for the keys, until the loader returned.
	mu    sync.Mutex
	opts  map[string]setOptions
	ended bool
}

type loadingKey struct{}

// loadingOf is the load whose context ctx is.
func loadingOf(ctx context.Context) *loading {
	l, _ := ctx.Value(loadingKey{}).(*loading)
	return l
}

// storeOptions ends the window in which StoreWith may be called for the
// load l, and returns what it set.
func (l *loading) storeOptions() map[string]setOptions {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended = true
	return l.opts
}

// reentrant reports a call for key, of the cache c, made from inside
// key's own load.
func reentrant(ctx context.Context, c *cache, key string) error {
	l, _ := ctx.Value(loadingKey{}).(*loading)
	for ; l != nil; l = l.parent {
		if l.cache == any(c) && slices.Contains(l.keys, key) {
			return keyErr("get", key, ErrReentrantLoad)
		}
	}
	return nil
}

// loadContext returns the context a load of keys runs under: ctx's values,
// marked with the keys, bounded by the load timeout and by Close. Unless
// inline, it is detached from ctx's cancellation, since the load goes on
// for every caller that shares it.
func (l *lifetime) loadContext(ctx context.Context, c *cache, keys []string, inline bool) (context.Context, context.CancelFunc) {
	parent, _ := ctx.Value(loadingKey{}).(*loading)
	if !inline {
		ctx = context.WithoutCancel(ctx)
	}
	ctx = context.WithValue(ctx, loadingKey{}, &loading{cache: c, keys: keys, parent: parent})
	ctx, cancel := context.WithTimeout(ctx, l.loadTimeout)
	stop := context.AfterFunc(l.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// loadEnded is the error of a load whose context ended before its loader
// returned.
func (l *lifetime) loadEnded(ctx context.Context, key string) error {
	if l.ctx.Err() != nil {
		return keyErr("load", key, &kindError{ErrClosed, ctx.Err()})
	}
	return keyErr("load", key, &kindError{ErrLoadTimeout, ctx.Err()})
}

// A loadFunc is what a load calls for its keys: for a Get, the key's
// Loader; for GetOrLoadMany, its function.
type loadFunc interface {
	loadKeys(ctx context.Context, keys []string) (map[string]any, error)
}

// oneLoader is a Loader as a loadFunc of one key. ErrNotFound, or any
// error but DoNotCache, is the load's error for the key.
type oneLoader struct{ ld loadOne }

func (o oneLoader) loadKeys(ctx context.Context, keys []string) (map[string]any, error) {
	v, err := o.ld(ctx, keys[0])
	if err != nil && !errors.Is(err, DoNotCache) {
		return nil, err
	}
	return map[string]any{keys[0]: v}, err
}

// manyLoader is a GetOrLoadMany function as a loadFunc: keys it leaves out
// of its map are not found.
type manyLoader func(ctx context.Context, keys []string) (map[string]any, error)

func (f manyLoader) loadKeys(ctx context.Context, keys []string) (map[string]any, error) {
	return f(ctx, keys)
}

// A loadJob is one key of a load: what the read that started it found,
// and, once the load has settled, how it may store and how it ended.
type loadJob struct {
	key     string
	p       *policy
	from    judgement                  // what the read that started the load found
	token   string                     // the load's identity in the registry: see loadToken
	refresh bool                       // a background refresh of a value still fresh
	cl      *singleflight.Call[result] // the key's call in the registry

	load   bool                       // the loader is to be called for it, storing under g
	g      guard                      // how it may store
	seen   string                     // another process's lease it found, while settling
	own    bool                       // seen is a lease of this process's whose outcome it did not learn
	mine   bool                       // seen is this cache's lease, placed by a read whose load had not registered
	join   *singleflight.Call[result] // another load of this process that now holds the key
	stored bool                       // its value (or tombstone) was written
	loaded bool                       // the loader gave a value or ErrNotFound for it (Loads)
	kept   bool                       // not stored, and counted why (Superseded or TooLarge)
	res    result
	err    error
}

// finishErr is j's error as its callers get it. A job begins with the
// bare ErrGoexit, what it keeps if the loader calls runtime.Goexit (or if
// nothing decides it), and that error is made one naming the key only
// here, as the job finishes: a load that ends as most do makes none.
func (j *loadJob) finishErr() error {
	if j.err == singleflight.ErrGoexit {
		j.err = keyErr("load", j.key, j.err)
	}
	return j.err
}

// load answers a read-through Get whose read found j: it joins this
// process's load of the key begun from the same state, or starts one on a
// goroutine of its own, and waits for it under ctx.
func (c *cache) load(ctx context.Context, f flight, j judgement) (result, error) {
	if err := reentrant(ctx, c, f.key); err != nil {
		if j.placed != "" {
			c.remote.releaseLeases(ctx, []string{f.key}, []string{j.placed})
		}
		return result{}, err
	}
	token := loadToken(j, &c.remote.leases)
	// A load whose read placed its lease is the lease's holder: it never
	// joins another. (A read of this process that found the lease before
	// this one registered may have started a load under the same token;
	// this one takes the token's place, and that load joins it as it
	// settles.)
	cl, joined := c.loads.Claim(f.key, token, true, c.coalesce && j.placed == "")
	jobs := []loadJob{{key: f.key, p: f.p, from: j, token: token, cl: cl}}
	switch {
	case joined:
		atomic.AddUint64(&f.p.stats.CoalescedWaits, 1)
	case f.cl != nil && f.cl.Own():
		// The read runs on a goroutine of its own, which its callers
		// wait for only through the read's call: the load runs on it
		// too, one goroutine hand-off fewer each way, and at the load
		// timeout releases the read's callers with its own. (The group
		// registered that goroutine with the cache's life.)
		c.runLoad(ctx, oneLoader{f.ld}, jobs, func(err error) {
			r, err := c.fallBack(ctx, f.key, j, result{}, err)
			c.reads.Finish(f.key, f.cl, r, err)
		})
	default:
		// On a goroutine of its own even when this caller cannot leave:
		// the callers must be released at the load timeout whether or
		// not the loader heeds its context.
		c.goLoad(ctx, oneLoader{f.ld}, jobs)
	}
	return c.awaitLoad(ctx, f.key, f.p, j, cl, joined)
}

// awaitLoad waits under ctx for the load cl of key, begun from what the
// caller's read found, j. If the load failed and j was a value past its
// TTL, StaleFor says the caller gets that value (a load the caller
// joined may have begun from another state, with no stale value of its
// own to fall back on).
func (c *cache) awaitLoad(ctx context.Context, key string, p *policy, j judgement, cl *singleflight.Call[result], joined bool) (result, error) {
	r, err := singleflight.Wait(ctx, cl)
	r.joined = joined
	return c.fallBack(ctx, key, j, r, err)
}

// fallBack is a load's outcome, r and err, for a caller whose read found
// j: a load that failed from a value past its TTL gives that value, as
// StaleFor says.
func (c *cache) fallBack(ctx context.Context, key string, j judgement, r result, err error) (result, error) {
	if err != nil && j.v == vStale && ctx.Err() == nil && !errors.Is(err, ErrNotFound) {
		c.tel.report(ctx, key, err)
		s := j.r
		s.stale = true
		return s, nil
	}
	return r, err
}

// refresh starts a background reload of a value due for refresh, unless
// one from the same value is under way in this process or has lately
// stored over it (see registry.claimRefresh).
func (c *cache) refresh(ctx context.Context, key string, p *policy, fn loadFunc, j judgement) {
	token := "sha1:" + j.digest
	cl := c.loads.ClaimRefresh(key, token)
	if cl == nil {
		return
	}
	atomic.AddUint64(&p.stats.Refreshes, 1)
	c.goLoad(ctx, fn, []loadJob{{key: key, p: p, from: j, token: token, refresh: true, cl: cl}})
}

// goLoad runs runLoad on a goroutine of its own, which the cache's life
// counts, so that Close waits for it.
func (c *cache) goLoad(ctx context.Context, fn loadFunc, jobs []loadJob) {
	c.life.Go(func() { c.runLoad(ctx, fn, jobs, nil) })
}

// runLoad loads jobs with one call of fn, on a goroutine of its own
// (goLoad's, or a shared read's; both are registered with the cache's
// life), and finishes each job's call: with the job's result, or, for
// callers still waiting when the load's context ends, with its error. It
// is the one load: of one key for a Get, of many for GetOrLoadMany.
//
// released, if not nil, is told the error of a load whose context ended
// before its loader returned: the load runs on a read's goroutine, whose
// callers it must release too.
func (c *cache) runLoad(ctx context.Context, fn loadFunc, jobs []loadJob, released func(error)) {
	keys := make([]string, len(jobs))
	for i := range jobs {
		keys[i] = jobs[i].key
		jobs[i].err = singleflight.ErrGoexit // what runtime.Goexit in fn leaves (see finishErr)
	}
	lctx, cancel := c.life.loadContext(ctx, c, keys, false)
	defer cancel()
	timeout := context.AfterFunc(lctx, func() {
		ended := false
		for i := range jobs {
			ended = c.loads.Finish(jobs[i].key, jobs[i].cl, result{}, c.life.loadEnded(lctx, jobs[i].key)) || ended
		}
		// Only a load that had not finished (its context ended first, not
		// its cancel at the end of runLoad) releases a read's callers.
		if ended && released != nil {
			released(c.life.loadEnded(lctx, jobs[0].key))
		}
	})
	l := &loadRun{c: c, jobs: jobs}
	// However the load ends (runtime.Goexit in fn included), every call is
	// finished: a call finished already keeps its result. (A call finished
	// here, not below, is a load that ended by runtime.Goexit: its read's
	// callers are released with its error too.)
	defer func() {
		ended := false
		for i := range jobs {
			ended = c.loads.Finish(jobs[i].key, jobs[i].cl, jobs[i].res, jobs[i].finishErr()) || ended
		}
		if ended && released != nil {
			released(jobs[0].finishErr())
		}
	}()
	_, err := singleflight.Protect(lctx, l, fn, func(ctx context.Context, l *loadRun, fn loadFunc) (struct{}, error) {
		l.run(ctx, fn, timeout)
		return struct{}{}, nil
	}, panicError)
	for i := range jobs {
		j := &jobs[i]
		switch {
		case j.join != nil:
			continue
		case err != nil: // a panic in fn, the serializer or a codec
			j.res, j.err = result{}, keyErr("load", j.key, err)
		}
		if jerr := j.finishErr(); j.refresh && jerr != nil && !errors.Is(jerr, ErrNotFound) {
			c.tel.report(lctx, j.key, jerr)
		}
		if j.refresh && j.stored {
			// Before finish, so that no refresh from the value it replaced
			// can start in between.
			c.loads.StoredOver(j.key, j.token, time.Now().Add(j.p.refreshAfter).UnixNano())
		}
		// This load's own keys are done: finish them before waiting for
		// the loads of this process that hold some of its keys, which may
		// be waiting for these in turn.
		c.loads.Finish(j.key, j.cl, j.res, j.err)
	}
	for i := range jobs {
		if j := &jobs[i]; j.join != nil {
			j.res, j.err = singleflight.Wait(lctx, j.join)
			c.loads.Finish(j.key, j.cl, j.res, j.err)
		}
	}
}

// A loadRun is the work of one load.
type loadRun struct {
	c       *cache
	jobs    []loadJob
	stamped *groupStamp // the groups' records, readied once the loader returned (groups.go)
	checked uint64      // the number of its last check of them (groupState.checks)
}

// run settles how each key may store, calls fn for those to load, and
// decides, key by key, what the load's outcome means: store it, supersede
// it, fall back to a stale value, or fail. live reports, once fn has
// returned, whether the load's context is still live, and stops its
// timeout; a load past it stores nothing. A lease the load took and did
// not store over is released however run ends.
func (l *loadRun) run(ctx context.Context, fn loadFunc, live func() bool) {
	c := l.c
	// Stores and releases run under their own budget, not the load's
	// deadline, which may be about to end.
	sctx := context.WithoutCancel(ctx)
	defer l.release(sctx)
	l.settle(ctx)
	var loading []int
	var keys []string
	for i := range l.jobs {
		if l.jobs[i].load {
			loading = append(loading, i)
			keys = append(keys, l.jobs[i].key)
		}
	}
	if len(loading) == 0 {
		return
	}
	stop := l.keep(ctx)
	defer stop()
	// The group sequence, before the loader reads the source: a value it
	// puts in groups is stored only with it (groups.go).
	seq, seqErr := uint64(0), errNoGroupSeq
	if c.groups.used.Load() {
		seq, seqErr = c.groups.groupSeq(ctx, keys[0])
	}
	start := time.Now()
	// A panic in fn is the load's error, as any other it returns (a panic
	// past fn, in a serializer or a codec, is caught by runLoad).
	vals, err := singleflight.Protect(ctx, fn, keys, callLoadFunc, panicError)
	opts := loadingOf(ctx).storeOptions()
	// (opts is nil unless the loader called StoreWith: then it put
	// nothing in groups.)
	if opts != nil && seqErr == errNoGroupSeq && l.grouped(opts, err) {
		vals, opts, seq, seqErr, err = l.again(ctx, fn, keys, vals, opts, err)
	}
	for n := 0; n < maxRaced && seqErr == nil && l.raced(sctx, keys, seq, opts, err); n++ {
		vals, opts, seq, seqErr, err = l.again(ctx, fn, keys, vals, opts, err)
	}
	// The keeper goes on until the stores are done (the deferred stop): on
	// a saturated machine a store can wait for a connection longer than a
	// lease lives, and a lease that died meanwhile would refuse it.
	p0 := l.jobs[loading[0]].p
	if !live() || ctx.Err() != nil {
		// Past the load timeout (or Close): the callers have, or are
		// about to get, the timeout, whatever fn returned.
		for _, i := range loading {
			l.jobs[i].err = c.life.loadEnded(ctx, l.jobs[i].key)
			atomic.AddUint64(&l.jobs[i].p.stats.LoadErrors, 1)
		}
		c.tel.observeLoad(p0, len(loading), start, l.jobs[loading[0]].err)
		return
	}
	c.tel.observeLoad(p0, len(loading), start, err)
	noStore := errors.Is(err, DoNotCache)
	if err != nil && !noStore && !errors.Is(err, ErrNotFound) {
		for _, i := range loading {
			l.fail(ctx, i, err)
		}
		return
	}
	var writes []pendingWrite
	for _, i := range loading {
		j := &l.jobs[i]
		p := j.p
		if j.g.kind == guardDigest && c.loads.IsDetached(j.cl) {
			// A write of this process came after the load began: whatever
			// the key holds now, the load's value is older. (A write of
			// another process is caught by the script, unless it wrote
			// the very bytes the load began from and left the TTL no
			// higher.)
			atomic.AddUint64(&p.stats.Superseded, 1)
			j.g, j.kept = guard{}, true
		}
		v, ok := vals[j.key]
		if ok && c.form.kind.isNil != nil && c.form.kind.isNil(v) {
			l.fail(ctx, i, ErrNilValue)
			continue
		}
		atomic.AddUint64(&p.stats.Loads, 1)
		j.loaded = true
		so := opts[j.key] // what the loader chose with StoreWith
		if !ok {
			j.err = ErrNotFound
			nttl := p.negativeTTL
			if so.ttlSet {
				nttl = so.ttl
			}
			if j.g.kind != guardNone && nttl != 0 && !noStore {
				writes = append(writes, pendingWrite{job: i, key: j.key, p: p, g: j.g, stored: []byte{tombstone}, ttl: nttl, so: so})
			}
			continue
		}
		r := result{val: v, from: fromLoader}
		if len(so.groups) > 0 {
			// Not for a caller that began after the groups' last check
			// began (lateFor), nor held for the share window.
			r.checked, r.unshared = l.checked, true
		}
		var e encoded
		if j.g.kind != guardNone && !noStore {
			var eerr error
			e, eerr = c.form.encode(ctx, "load", j.key, p, v)
			j.kept = errors.Is(eerr, ErrTooLarge)
			if eerr != nil && l.unstored(ctx, j.key, p, eerr) {
				j.err = eerr
				continue
			}
		}
		if c.form.perCaller {
			// Each caller decodes its own copy: of the serialized value
			// stored, or, if it is not stored, serialized here. (For raw
			// T this is v's own slice; each caller copies it in deliver.)
			if e.payload != nil {
				r.data = bytes.Clone(e.payload)
			} else if data, merr := c.form.marshal(nil, v); merr != nil {
				e.release()
				j.err = keyErr("load", j.key, merr)
				continue
			} else {
				r.data = data
			}
		}
		j.res, j.err = r, nil
		if e.stored != nil {
			e.detach()
			ttl := p.ttl
			if so.ttlSet {
				ttl = so.ttl
			}
			writes = append(writes, pendingWrite{job: i, key: j.key, p: p, g: j.g, stored: e.stored, ttl: p.expiry(ttl), enc: e, so: so})
		}
	}
	// A write goes in an envelope only where the loader placed it in
	// groups or gave it a TTL of its own (StoreWith); with none such,
	// envelop would return writes as they are.
	if slices.ContainsFunc(writes, func(w pendingWrite) bool { return len(w.so.groups) > 0 || w.so.ttlSet }) {
		writes = l.envelop(sctx, writes, seq, seqErr)
	}
	for i, err := range c.remote.storeGuarded(sctx, writes) {
		w := writes[i]
		switch {
		case err == nil:
			c.changed(stored, w.key)
			l.jobs[w.job].stored = true
		case errors.Is(err, errSuperseded):
			l.jobs[w.job].kept = true
		case l.unstored(ctx, w.key, l.jobs[w.job].p, err):
			l.jobs[w.job].res, l.jobs[w.job].err = result{}, err
		}
	}
	// The stores are made: their buffers go back to the pool. (A panic
	// in a serializer or a codec on the way here leaves them to the
	// garbage collector, which a pool allows.)
	for i := range writes {
		writes[i].enc.release()
	}
	// Every loaded key ends one way: stored, superseded, too large, or
	// (counted here) not stored for any other reason.
	for _, i := range loading {
		if j := &l.jobs[i]; j.loaded && !j.stored && !j.kept {
			atomic.AddUint64(&j.p.stats.Unstored, 1)
		}
	}
}

func callLoadFunc(ctx context.Context, fn loadFunc, keys []string) (map[string]any, error) {
	return fn.loadKeys(ctx, keys)
}

// observeLoad tells the observer of a loader call that began at start.
func (t *telemetry) observeLoad(p *policy, keys int, start time.Time, err error) {
	if t.obs == nil {
		return
	}
	t.obs.ObserveLoad(LoadEvent{Prefix: p.prefix, Keys: keys, Duration: time.Since(start), Err: err})
}

// fail ends job i with the load's error err: its callers get err, or,
// from a value past its TTL, that value (StaleFor).
func (l *loadRun) fail(ctx context.Context, i int, err error) {
	j := &l.jobs[i]
	atomic.AddUint64(&j.p.stats.LoadErrors, 1)
	if !isKeyError(err, j.key) {
		err = keyErr("load", j.key, err)
	}
	if j.from.v == vStale {
		l.c.tel.report(ctx, j.key, err)
		s := j.from.r
		s.stale = true
		j.res, j.err = s, nil
		return
	}
	j.res, j.err = result{}, err
}

// keep keeps the leases the load holds alive while its loader runs and
// its values are stored (see keeper), and returns the function that stops
// it: a lease lives as long as its load, and dies within leaseBook.ttl of the
// load's end, or of its context's.
func (l *loadRun) keep(ctx context.Context) (stop func()) {
	var keys, leases []string
	for i := range l.jobs {
		if j := &l.jobs[i]; j.load && j.g.kind == guardLease {
			keys, leases = append(keys, j.key), append(leases, j.g.value)
		}
	}
	if len(keys) == 0 {
		return func() {}
	}
	return l.c.remote.keepLeases(ctx, keys, leases).stop
}

// extendScript sets the key's expiry to ARGV[2] ms only if it holds the
// lease ARGV[1], and returns 1 if it did, 0 if not.
var extendScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0`)

// A keeper extends the leases of a load, leases[i] on keys[i], every Redis
// budget until it is stopped, its load's context ends or no lease is
// left. A key whose lease is gone (a write replaced it, or it expired) is
// dropped; a failed extension is tried again at the next budget (the
// lease has two more to live). It runs on a timer, not a goroutine of its
// own: a load that ends within a budget, as most do, costs it one timer
// and no goroutine; each extension runs on the timer's goroutine, which
// ends with it.
type keeper struct {
	r            *remote
	ctx          context.Context // the load's
	keys, leases []string

	mu      sync.Mutex
	stopped bool
	t       *time.Timer
}

// keepLeases starts a keeper of leases on keys for the load whose
// context is ctx; it takes keys and leases as its own.
func (r *remote) keepLeases(ctx context.Context, keys, leases []string) *keeper {
	k := &keeper{r: r, ctx: ctx, keys: keys, leases: leases}
	k.mu.Lock()
	k.t = time.AfterFunc(r.redisTimeout, k.extend)
	k.mu.Unlock()
	return k
}

// stop stops k: no extension starts after it returns (one under way
// finds the lease gone, or the load's value in its place, and does
// nothing).
func (k *keeper) stop() {
	k.mu.Lock()
	k.stopped = true
	k.t.Stop()
	k.mu.Unlock()
}

func (k *keeper) extend() {
	k.mu.Lock()
	stopped := k.stopped
	k.mu.Unlock()
	r := k.r
	if stopped || k.ctx.Err() != nil || !r.life.TrySpawn() {
		return
	}
	defer r.life.Exit()
	keys, leases := k.keys, k.leases
	cmds := make([]*redis.Cmd, len(keys))
	ms := r.leases.ttl.Milliseconds()
	errs := r.roundTripMany(context.WithoutCancel(k.ctx), "lease", keys, nil, true, func(ctx context.Context, pipe redis.Cmdable, i int, sha bool) redis.Cmder {
		cmds[i] = runScript(ctx, pipe, extendScript, sha, keys[i], leases[i], ms)
		return cmds[i]
	})
	n := 0
	for i, err := range errs {
		if err == nil {
			if v, _ := cmds[i].Int(); v == 0 {
				continue // replaced by a write, or expired: nothing to keep
			}
		}
		keys[n], leases[n] = keys[i], leases[i]
		n++
	}
	k.keys, k.leases = keys[:n], leases[:n]
	k.mu.Lock()
	if !k.stopped && n > 0 && k.ctx.Err() == nil {
		k.t.Reset(r.redisTimeout)
	}
	k.mu.Unlock()
}

// release releases, in one pipeline, the leases the load took and did not
// store over, so that readers do not take the keys for a load in progress.
func (l *loadRun) release(ctx context.Context) {
	var keys, leases []string
	for i := range l.jobs {
		if j := &l.jobs[i]; j.g.kind == guardLease && !j.stored {
			keys, leases = append(keys, j.key), append(leases, j.g.value)
		}
	}
	l.c.remote.releaseLeases(ctx, keys, leases)
}

// releaseLeases removes leases[i] from keys[i], in one pipeline, where it
// is still there: the loads they stood for store nothing. Failures are
// reported; a lease not released expires by itself.
func (r *remote) releaseLeases(ctx context.Context, keys, leases []string) {
	if len(keys) == 0 {
		return
	}
	errs := r.roundTripMany(ctx, "lease", keys, nil, true, func(ctx context.Context, pipe redis.Cmdable, i int, sha bool) redis.Cmder {
		return runScript(ctx, pipe, releaseScript, sha, keys[i], leases[i])
	})
	for i, err := range errs {
		if err != nil && !errors.Is(err, ErrCircuitOpen) {
			r.tel.report(ctx, keys[i], err)
		}
	}
}

// settle decides for each key how its load may store, from what the key
// held when the load began, with one pipeline per step for all the keys:
// read again the keys that held a lease (it may be that of a load of this
// process that has just ended); take the leases of the missing keys; with
// WithLock, wait for other processes' leases and take over those that
// outlive the wait. A key that turns out to hold a value or a tombstone
// gets it as its result; one whose lease another load of this process
// holds is joined to that load (job.join), to be waited for once this
// load's own keys are finished.
func (l *loadRun) settle(ctx context.Context) {
	c := l.c
	var reread, missing []int
	for i := range l.jobs {
		switch from := l.jobs[i].from; from.v {
		case vLease:
			reread = append(reread, i)
		case vMiss:
			if from.placed != "" {
				// The read placed the lease: the load holds it.
				l.jobs[i].g, l.jobs[i].load = guard{kind: guardLease, value: from.placed}, true
				continue
			}
			missing = append(missing, i)
		default:
			l.decide(ctx, i, from, nil)
		}
	}
	if len(reread) > 0 {
		for n, rp := range c.fetchMany(ctx, l.keysOf(reread)) {
			i := reread[n]
			l.decide(ctx, i, c.form.judge(l.jobs[i].key, l.jobs[i].p, rp, true), &missing)
		}
	}
	l.acquire(ctx, missing, false)
	// Leases of this process's own whose outcome it did not learn (their
	// read or acquire timed out, and ran later): taken over at once, as no
	// load of this process holds them any more.
	var own []int
	for i := range l.jobs {
		if l.jobs[i].own {
			own = append(own, i)
		}
	}
	l.acquire(ctx, own, true)
	for i := range l.jobs {
		if j := &l.jobs[i]; j.mine && j.seen != "" {
			j.mine = false
			other, now, changed := l.awaitPlacer(ctx, i, j.seen)
			switch {
			case other != nil:
				j.seen, j.join = "", other
			case changed:
				// The placer's load ended (its value stored, or not) or
				// the key changed: decide on what it holds now.
				j.seen = ""
				var again []int
				l.decide(ctx, i, now, &again)
				l.acquire(ctx, again, false)
			}
		}
	}
	var waiting []int
	for i := range l.jobs {
		if l.jobs[i].seen != "" {
			waiting = append(waiting, i)
		}
	}
	if len(waiting) == 0 {
		return
	}
	if c.lockWait <= 0 {
		// Another process is loading: load without storing.
		for _, i := range waiting {
			l.jobs[i].seen, l.jobs[i].load = "", true
		}
		return
	}
	waiting = l.awaitLeases(ctx, waiting)
	// The leases that outlived the wait: take them over.
	l.acquire(ctx, waiting, true)
	for _, i := range waiting {
		if j := &l.jobs[i]; j.seen != "" {
			j.seen, j.load = "", true // a lease that came back while taking over
		}
	}
}

// awaitLeases waits, for up to the WithLock wait, for other processes'
// leases on the keys of waiting to give way, polling them all together
// with backoff, and decides each key on what it then holds. It returns
// the keys whose leases outlived the wait. ctx bounds it too.
func (l *loadRun) awaitLeases(ctx context.Context, waiting []int) []int {
	c := l.c
	for _, i := range waiting {
		atomic.AddUint64(&l.jobs[i].p.stats.LockWaits, 1)
	}
	deadline := time.Now().Add(c.lockWait)
	backoff := 2 * time.Millisecond
	for len(waiting) > 0 && time.Now().Before(deadline) {
		t := time.NewTimer(min(backoff, time.Until(deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			for _, i := range waiting {
				l.jobs[i].seen, l.jobs[i].err = "", keyErr("load", l.jobs[i].key, ctx.Err())
			}
			return nil
		case <-t.C:
		}
		backoff = min(2*backoff, 100*time.Millisecond)
		still := waiting[:0]
		for n, rp := range c.fetchMany(ctx, l.keysOf(waiting)) {
			i := waiting[n]
			j := &l.jobs[i]
			if jj := c.form.judge(j.key, j.p, rp, true); jj.v == vLease {
				if other := c.loads.JoinOrWait(j.key, jj.lease, j.cl); other != nil {
					// A load of this process holds it: see decide.
					j.seen, j.join = "", other
					continue
				}
				j.seen = jj.lease
				still = append(still, i)
			} else {
				j.seen = ""
				var again []int
				l.decide(ctx, i, jj, &again)
				l.acquire(ctx, again, false)
			}
		}
		waiting = still
	}
	return waiting
}

// decide acts on what key i holds: a value or a tombstone is its result; a
// value in place (or, for a refresh, the value it began from) or a
// failure settles how it loads; a miss joins missing (nil: it loads
// without storing); a lease is joined if a load of this process holds it,
// or else noted in seen.
func (l *loadRun) decide(ctx context.Context, i int, jd judgement, missing *[]int) {
	j := &l.jobs[i]
	switch jd.v {
	case vHit:
		if j.refresh {
			j.g, j.load = digestGuard(jd), true
			return
		}
		// A value arrived while this load was settling.
		jd.r.from = fromRedis
		j.res, j.err = jd.r, nil
	case vTombstone:
		j.res, j.err = result{}, ErrNotFound
	case vStale, vUndecodable, vInvalid:
		j.g, j.load = digestGuard(jd), true
	case vUnavailable:
		l.c.tel.report(ctx, j.key, jd.err)
		j.g, j.load = guard{}, true
		if jd.unsure != "" {
			l.c.remote.leases.remember(j.key, jd.unsure)
		}
	case vOwed: // loads, and stores nothing until the invalidation lands
		j.g, j.load = guard{}, true
	case vCancelled: // the load's own context ended (its timeout, or Close)
		j.res, j.err = result{}, l.c.life.loadEnded(ctx, j.key)
	case vMiss:
		if missing != nil {
			*missing = append(*missing, i)
		} else {
			j.g, j.load = guard{}, true
		}
	case vLease:
		if l.c.remote.leases.owns(j.key, jd.lease) {
			j.seen, j.own = jd.lease, true
			return
		}
		// Join this process's load that holds the lease, or waits for it
		// (one found by token, which may be this load's own token: the
		// load whose read placed the lease takes the token's place); or
		// become the load that waits for it, which this process's readers
		// that find it join from now on.
		if other := l.c.loads.JoinOrWait(j.key, jd.lease, j.cl); other != nil {
			j.join = other
			return
		}
		// One of this cache's leases, which the load began from (its read
		// found it) and no load of this cache holds: the read that placed
		// it has yet to register its load.
		j.seen, j.mine = jd.lease, l.c.remote.leases.tagged(jd.lease) && j.from.v == vLease && jd.lease == j.token
	}
}

// acquire takes the leases of the keys of idx in one pipeline (over: taking
// over the lease each has seen). A key whose lease it took loads under a
// lease guard; one Redis failed for loads without storing; one that holds
// something else is decided on what it holds, without trying again.
func (l *loadRun) acquire(ctx context.Context, idx []int, over bool) {
	if len(idx) == 0 {
		return
	}
	c := l.c
	leases := make([]string, len(idx))
	olds := make([]string, len(idx))
	for n, i := range idx {
		j := &l.jobs[i]
		switch {
		case over:
			leases[n], olds[n] = c.remote.leases.newToken(), j.seen
		case j.from.v == vMiss:
			leases[n] = j.token // the lease this process's readers join by
		default:
			leases[n] = c.remote.leases.newToken()
		}
	}
	held, errs := c.remote.acquireLeases(ctx, l.keysOf(idx), leases, olds)
	rps := make([]reply, len(idx))
	for n := range idx {
		rps[n] = reply{s: held[n], left: -1, err: errs[n]}
	}
	c.groups.checkGroups(ctx, rps)
	for n, i := range idx {
		j := &l.jobs[i]
		j.own = false
		switch {
		case errs[n] == redis.Nil:
			if over {
				c.remote.leases.forget(j.key, olds[n])
			}
			j.seen, j.g, j.load = "", guard{kind: guardLease, value: leases[n]}, true
		case errs[n] != nil:
			c.tel.report(ctx, j.key, errs[n])
			j.seen, j.g, j.load = "", guard{}, true
			if maybeRan(errs[n]) {
				c.remote.leases.remember(j.key, leases[n])
			}
		default:
			j.seen = ""
			l.decide(ctx, i, c.form.judge(j.key, j.p, rps[n], true), nil)
		}
	}
}

func (l *loadRun) keysOf(idx []int) []string {
	keys := make([]string, len(idx))
	for n, i := range idx {
		keys[n] = l.jobs[i].key
	}
	return keys
}

// unstored handles a loaded value that could not be stored, and reports
// whether the callers fail for it. A value the serializer cannot encode
// fails them. A value too large to store (WithMaxValueSize) is theirs all
// the same: it is counted and reported, and stored nowhere. A Redis
// failure is reported, and fails them only with WithStrictRedis.
func (l *loadRun) unstored(ctx context.Context, key string, p *policy, err error) (fail bool) {
	switch {
	case errors.Is(err, ErrSerialization):
		return true
	case errors.Is(err, ErrTooLarge):
		atomic.AddUint64(&p.stats.TooLarge, 1)
	case l.c.strict:
		return true
	}
	l.c.tel.report(ctx, key, err)
	return false
}

// isKeyError reports whether err is already an *Error naming key.
func isKeyError(err error, key string) bool {
	var e *Error
	return errors.As(err, &e) && e.Key == key
}

// loadToken names the state a load begins from, so that only reads that
// found the same state share it: for a miss, the new lease the load will
// write; for a lease, that lease; for a value in place, its digest; with
// Redis unreachable, singleflight.Unproven.
func loadToken(j judgement, leases *leaseBook) string {
	switch j.v {
	case vMiss:
		if j.placed != "" {
			return j.placed
		}
		return leases.newToken()
	case vLease:
		return j.lease
	case vUnavailable:
		return singleflight.Unproven
	case vOwed:
		return owedToken
	default:
		return "sha1:" + j.digest
	}
}

// owedToken is the token of loads of a key whose invalidation is owed.
const owedToken = "owed"
