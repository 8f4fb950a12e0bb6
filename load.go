package packcache

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"time"
	"unsafe"
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
// stored. This costs a miss one more round trip to Redis than a plain
// GET and SET; a hit costs nothing more.
//
// With a loader, Get also:
//   - reloads a stored value it cannot decode, reporting the error to the
//     error handler, and overwrites it unless it changed meanwhile;
//   - answers from the loader when Redis fails or the node's circuit
//     breaker is open (unless WithStrictRedis), reporting the Redis error,
//     and stores nothing;
//   - with RefreshAfter, reloads in the background a value that is older,
//     once per key per process at a time, while callers get the cached
//     one; the reload stores its value only if the key still holds the
//     value it began from;
//   - with StaleFor, reloads a value past its TTL and returns it if the
//     reload fails.
//
// WARNING: a Load that calls Get, GetOrLoad or GetOrLoadMany for the key
// it is loading, with the context it was given, gets ErrReentrantLoad at
// once: waiting for its own load, it would wait until the load timeout.
// (With a context not derived from its own, the cache cannot tell, and
// that call waits.)
type Loader[T any] interface {
	Load(ctx context.Context, key string) (T, error)
}

// LoaderFunc adapts a function to a Loader.
type LoaderFunc[T any] func(ctx context.Context, key string) (T, error)

// Load calls f(ctx, key).
func (f LoaderFunc[T]) Load(ctx context.Context, key string) (T, error) { return f(ctx, key) }

// WithLoader makes Get read through l for keys whose prefix's Policy has no
// Loader of its own. l must be a Loader of the cache's T, or New fails.
func WithLoader[T any](l Loader[T]) Option {
	return func(cfg *config) error {
		if l == nil {
			return errors.New("WithLoader: nil loader")
		}
		cfg.base.Loader = l
		return nil
	}
}

// A loadJob is one load: of what key, with what loader, and from what
// state of the key, which decides how it may store its value.
type loadJob[T any] struct {
	c       *Cache[T]
	key     string
	p       *policy[T]
	ld      Loader[T]
	from    judgement[T] // what the read that started the load found
	token   string       // the load's identity in the loads group: see loadToken
	refresh bool         // a background refresh of a value still fresh
}

// unprovenToken is the token of loads that begin with Redis unreachable:
// readers that find Redis unreachable too share such a load only within
// the share window, since nothing proves the key unwritten since.
const unprovenToken = "down"

// loadToken names the state a load begins from, so that only reads that
// found the same state share it: for a miss, the new lease the load will
// write; for a lease, that lease; for a value in place, its digest; with
// Redis unreachable, unprovenToken.
func loadToken[T any](j judgement[T]) string {
	switch j.v {
	case vMiss:
		return newLease()
	case vLease:
		return j.lease
	case vUnavailable:
		return unprovenToken
	default:
		return "sha1:" + j.digest
	}
}

// loading marks a load's context with the keys it loads, to catch a
// loader that waits for its own load.
type loading struct {
	cache  any
	keys   []string
	parent *loading
}

type loadingKey struct{}

// reentrant reports a call for key made from inside key's own load.
func (c *Cache[T]) reentrant(ctx context.Context, key string) error {
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
func (c *Cache[T]) loadContext(ctx context.Context, keys []string, inline bool) (context.Context, context.CancelFunc) {
	parent, _ := ctx.Value(loadingKey{}).(*loading)
	if !inline {
		ctx = context.WithoutCancel(ctx)
	}
	ctx = context.WithValue(ctx, loadingKey{}, &loading{cache: c, keys: keys, parent: parent})
	ctx, cancel := context.WithTimeout(ctx, c.loadTimeout)
	stop := context.AfterFunc(c.life.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// loadEnded is the error of a load whose context ended before its loader
// returned.
func (c *Cache[T]) loadEnded(ctx context.Context, key string) error {
	if c.life.ctx.Err() != nil {
		return keyErr("load", key, &kindError{ErrClosed, ctx.Err()})
	}
	return keyErr("load", key, &kindError{ErrLoadTimeout, ctx.Err()})
}

// load answers a read-through caller whose read found j: it joins this
// process's load of the key begun from the same state, or starts one on a
// goroutine of its own, and waits for it under ctx.
func (c *Cache[T]) load(ctx context.Context, f flight[T], j judgement[T]) (result[T], error) {
	if err := c.reentrant(ctx, f.key); err != nil {
		return result[T]{}, err
	}
	job := loadJob[T]{c: c, key: f.key, p: f.p, ld: f.ld, from: j, token: loadToken(j)}
	if !c.coalesce {
		lctx, cancel := c.loadContext(ctx, []string{f.key}, true)
		defer cancel()
		r, err := job.protectedRun(lctx, nil, func() bool { return lctx.Err() == nil })
		if err != nil && ctx.Err() != nil {
			return result[T]{}, ctx.Err()
		}
		return r, err
	}
	cl, joined := c.loads.acquire(f.key, time.Now().UnixNano(), job.token, true)
	if joined {
		f.p.stats.coalescedWaits.Add(1)
	} else {
		// On a goroutine of its own even when this caller cannot leave:
		// the callers must be released at the load timeout whether or
		// not the loader heeds its context.
		c.life.spawn()
		go c.runLoad(ctx, cl, job)
	}
	r, err := wait(ctx, cl)
	r.joined = joined
	if err != nil && j.v == vStale && ctx.Err() == nil && !errors.Is(err, ErrNotFound) {
		// The load this caller joined failed (it may have begun as a
		// refresh, with no stale value of its own to fall back on):
		// StaleFor says the caller gets the stale value.
		f.p.stats.staleServes.Add(1)
		c.report(ctx, f.key, err)
		s := j.r
		s.stale = true
		return s, nil
	}
	return r, err
}

// refresh starts a background reload of a value due for refresh, unless
// one from the same value is under way in this process.
func (c *Cache[T]) refresh(ctx context.Context, f flight[T], j judgement[T]) {
	job := loadJob[T]{c: c, key: f.key, p: f.p, ld: f.ld, from: j, token: "sha1:" + j.digest, refresh: true}
	cl, joined := c.loads.acquire(f.key, time.Now().UnixNano(), job.token, false)
	if joined {
		return
	}
	f.p.stats.refreshes.Add(1)
	c.life.spawn()
	go c.runLoad(ctx, cl, job)
}

// runLoad runs job for the callers of cl, on a goroutine of its own, and
// releases them when the load's context ends if the loader has not
// returned by then.
func (c *Cache[T]) runLoad(ctx context.Context, cl *call[result[T]], job loadJob[T]) {
	defer c.life.exit()
	lctx, cancel := c.loadContext(ctx, []string{job.key}, false)
	defer cancel()
	timeout := context.AfterFunc(lctx, func() {
		c.loads.finish(job.key, cl, result[T]{}, c.loadEnded(lctx, job.key))
	})
	// If the loader calls runtime.Goexit, run does not return: err keeps
	// its value and the deferred finish still releases the callers.
	r, err := result[T]{}, keyErr("load", job.key, errGoexit)
	defer func() {
		if job.refresh && err != nil && !errors.Is(err, ErrNotFound) {
			c.report(lctx, job.key, err)
		}
		c.loads.finish(job.key, cl, r, err)
	}()
	r, err = job.protectedRun(lctx, cl, timeout)
}

// protectedRun is run with any panic of what it calls (the loader, the
// serializer, a codec) turned into a *PanicError for the load's callers:
// it runs on a goroutine of the cache's, where a panic would end the
// process.
func (j loadJob[T]) protectedRun(ctx context.Context, cl *call[result[T]], live func() bool) (result[T], error) {
	r, err := protect(ctx, j, runArgs[T]{cl, live}, func(ctx context.Context, j loadJob[T], a runArgs[T]) (result[T], error) {
		return j.run(ctx, a.cl, a.live)
	})
	if err != nil && !isKeyError(err, j.key) {
		err = keyErr("load", j.key, err) // a panic outside the loader
	}
	return r, err
}

type runArgs[T any] struct {
	cl   *call[result[T]]
	live func() bool
}

// run loads the job's key: it settles first how the load may store (taking
// the lease on a miss, waiting for another process's lease with WithLock),
// calls the loader, and stores the value under that guard. live reports,
// once the loader has returned, whether the load's context is still live
// and stops its timeout; a load past it stores nothing. cl is the load's
// call (nil without coalescing): a load a write of this process detached
// stores nothing either.
func (j loadJob[T]) run(ctx context.Context, cl *call[result[T]], live func() bool) (_ result[T], err error) {
	c, key, p := j.c, j.key, j.p
	from := j.from
	var stale *result[T]
	if from.v == vStale {
		stale = &from.r
	}
	// Stores and releases run under their own budget, not the load's
	// deadline, which may be about to end.
	sctx := context.WithoutCancel(ctx)
	var g guard
	stored := false
	defer func() {
		// However the load ends (an error, a panic in the serializer,
		// runtime.Goexit), a lease it took and did not store over goes,
		// so that readers do not take the key for a load in progress.
		if g.kind == guardLease && !stored {
			c.release(sctx, key, p, g.value)
		}
	}()
	var done bool
	var r result[T]
	g, done, r, err = j.settle(ctx, from)
	if done {
		return r, err
	}
	start := time.Now()
	v, err := protect(ctx, j.ld, key, callLoader[T])
	if !live() || ctx.Err() != nil {
		// Past the load timeout (or Close): the callers have, or are
		// about to get, the timeout, whatever the loader returned.
		err := c.loadEnded(ctx, key)
		c.observeLoad(p, 1, start, err)
		return result[T]{}, err
	}
	if err == nil && c.ptr && isNilPointer(v) {
		err = ErrNilValue
	}
	c.observeLoad(p, 1, start, err)
	if g.kind == guardDigest && cl != nil && c.loads.isDetached(cl) {
		// A write of this process came after the load began: whatever
		// the key holds now, the load's value is older. (A write of
		// another process is caught by the script, unless it wrote the
		// very bytes the load began from and left the TTL no higher.)
		p.stats.superseded.Add(1)
		g = guard{}
	}
	switch {
	case err == nil || errors.Is(err, DoNotCache):
		p.stats.loads.Add(1)
		r := result[T]{val: v, from: fromLoader}
		if err == nil && g.kind != guardNone {
			data, ok, serr := c.storeLoaded(sctx, key, p, g, v)
			stored = ok
			if serr != nil && c.unstored(ctx, key, p, serr) {
				return result[T]{}, serr
			}
			r.data = data
		}
		if c.perCaller && r.data == nil {
			// Not stored, so not serialized yet. (For raw T this is v's
			// own slice; each caller copies it in deliver.)
			data, merr := c.marshal(nil, v)
			if merr != nil {
				return result[T]{}, keyErr("load", key, merr)
			}
			r.data = data
		}
		return r, nil
	case errors.Is(err, ErrNotFound):
		p.stats.loads.Add(1)
		if g.kind != guardNone && p.negativeTTL > 0 {
			ok, serr := c.storeGuarded(sctx, key, p, g, []byte{tombstone}, p.negativeTTL)
			stored = ok
			if serr != nil {
				c.report(ctx, key, serr)
			}
		}
		return result[T]{}, ErrNotFound
	default:
		p.stats.loadErrors.Add(1)
		if !isKeyError(err, key) {
			err = keyErr("load", key, err)
		}
		if stale != nil {
			p.stats.staleServes.Add(1)
			c.report(ctx, key, err)
			s := *stale
			s.stale = true
			return s, nil
		}
		return result[T]{}, err
	}
}

// unstored handles a loaded value that could not be stored, and reports
// whether the callers fail for it. A value the serializer cannot encode
// fails them. A value too large to store (WithMaxValueSize) is theirs all
// the same: it is counted and reported, and stored nowhere. A Redis
// failure is reported, and fails them only with WithStrictRedis.
func (c *Cache[T]) unstored(ctx context.Context, key string, p *policy[T], err error) (fail bool) {
	switch {
	case errors.Is(err, ErrSerialization):
		return true
	case errors.Is(err, ErrTooLarge):
		p.stats.tooLarge.Add(1)
	case c.strict:
		return true
	}
	c.report(ctx, key, err)
	return false
}

// isKeyError reports whether err is already an *Error naming key.
func isKeyError(err error, key string) bool {
	var e *Error
	return errors.As(err, &e) && e.Key == key
}

// settle decides, from what the key held when the load began, how the
// load may store: the lease it takes on a miss, the digest of a value in
// place, or nothing. It waits for another process's lease with WithLock.
// done reports that the key turned out to hold a value (or a tombstone)
// after all, which is then the load's result.
func (j loadJob[T]) settle(ctx context.Context, from judgement[T]) (g guard, done bool, r result[T], err error) {
	c, key, p := j.c, j.key, j.p
	// own is the lease this load writes: on a miss, its token, which
	// this process's readers that find it in Redis join by.
	own, over := "", ""
	if from.v == vMiss {
		own = j.token
	}
	waited, reread := false, false
	for range 5 {
		switch from.v {
		case vHit:
			if j.refresh {
				return digestGuard(from), false, r, nil
			}
			// A value arrived while this load was settling.
			from.r.from = fromRedis
			return g, true, from.r, nil
		case vTombstone:
			return g, true, r, ErrNotFound
		case vStale, vUndecodable:
			return digestGuard(from), false, r, nil
		case vUnavailable:
			c.report(ctx, key, from.err)
			return guard{}, false, r, nil
		case vLease:
			if !reread {
				// The lease may be that of a load of this process that
				// has just ended (a reader joins a load of ours under
				// way without coming here): read once more.
				reread = true
				from = c.reread(ctx, key, p)
				if from.v == vLease && from.lease != j.token {
					if cl := c.loads.running(key, from.lease); cl != nil {
						r, err := wait(ctx, cl)
						return g, true, r, err
					}
				}
				if from.v != vLease {
					continue
				}
			}
			if c.lockWait <= 0 || (waited && over != "") {
				return guard{}, false, r, nil
			}
			if !waited {
				waited = true
				from = c.awaitLease(ctx, key, p)
				if from.v != vLease {
					continue
				}
			}
			// The lease outlived the wait: take it over.
			over = from.lease
			fallthrough
		case vMiss:
			if own == "" {
				own = newLease()
			}
			ok, s, aerr := c.acquire(ctx, key, p, own, over)
			switch {
			case aerr != nil:
				c.report(ctx, key, aerr)
				return guard{}, false, r, nil
			case ok || s == own:
				return guard{kind: guardLease, value: own}, false, r, nil
			}
			from = c.judge(key, p, reply{s: s, left: -1}, true)
			if from.v == vLease && from.lease != j.token {
				// Another load of this process took the lease between
				// this one's read and now: its value is as new as this
				// one's would be.
				if cl := c.loads.running(key, from.lease); cl != nil {
					r, err := wait(ctx, cl)
					return g, true, r, err
				}
			}
		}
	}
	return guard{}, false, r, nil
}

// reread reads key again, for a load that must know what it holds now.
func (c *Cache[T]) reread(ctx context.Context, key string, p *policy[T]) judgement[T] {
	return c.judge(key, p, c.fetch(ctx, key, p), true)
}

// storeLoaded encodes v and stores it under g, and reports whether it was
// written. It returns the serialized value when each caller decodes its
// own.
func (c *Cache[T]) storeLoaded(ctx context.Context, key string, p *policy[T], g guard, v T) ([]byte, bool, error) {
	e, err := c.encode(ctx, "load", key, p, v)
	if err != nil {
		return nil, false, err
	}
	var data []byte
	if c.perCaller {
		data = bytes.Clone(e.payload)
	}
	e.detach()
	defer e.release()
	ok, err := c.storeGuarded(ctx, key, p, g, e.stored, c.expiry(p, p.ttl))
	return data, ok, err
}

// isNilPointer reports whether v, of a pointer type T, is nil.
func isNilPointer[T any](v T) bool { return *(*unsafe.Pointer)(unsafe.Pointer(&v)) == nil }

func callLoader[T any](ctx context.Context, ld Loader[T], key string) (T, error) {
	return ld.Load(ctx, key)
}
