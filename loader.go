package packcache

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Loader loads the value for a key from the source of truth, such as a
// database, when the cache does not hold it.
//
// Load returns ErrNotFound when the source has no value for key; with a
// NegativeTTL the cache remembers that. It returns a value together with
// DoNotCache for a value that callers may use but the cache must not keep.
// Any other error fails the callers waiting for the load and is not
// cached: the next Get calls the loader again.
//
// A Loader is called on a goroutine of the cache's under a context that
// carries the first caller's values but not its cancellation, bounded by
// WithLoadTimeout. A panic in Load becomes a *PanicError for every caller
// waiting for it.
//
// With a loader, Get also:
//   - reloads and overwrites a stored value it cannot decode, reporting the
//     error to the error handler, so callers get the fresh value;
//   - answers from the loader when Redis fails or the circuit breaker is
//     open (unless WithStrictRedis), reporting the Redis error;
//   - with RefreshAfter, reloads in the background a value that is older,
//     once per key per process at a time, while callers get the cached one;
//   - with StaleFor, returns the expired value when its reload fails.
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

// GetOrLoadMany returns the values for keys, reading those Redis holds in
// one round trip per node and loading the others with one call of fn, which
// gets only the keys that missed (and that no other call is loading: keys
// already being loaded by a Get or another GetOrLoadMany of this process
// are waited for instead). Loaded values are stored with their keys'
// policies. Keys fn leaves out of its map are not found: they are absent
// from the result and, with a NegativeTTL, remembered as such.
//
// The error joins one *Error per key that failed; the map holds every
// value that could be had. If ctx ends first, the map holds what had
// arrived and the error is ctx.Err().
func (c *Cache[T]) GetOrLoadMany(ctx context.Context, keys []string, fn func(ctx context.Context, missing []string) (map[string]T, error)) (map[string]T, error) {
	if fn == nil {
		return nil, errors.New("packcache: GetOrLoadMany with nil function")
	}
	keys = dedupe(keys)
	found, missing, errs := c.getMany(ctx, keys)
	// Keys Redis failed on or that could not be decoded are loaded too:
	// read-through answers them from the source.
	var kept []error
	for _, err := range errs {
		var e *Error
		if errors.As(err, &e) && !(c.strict && errors.Is(err, ErrRedis)) {
			missing = append(missing, e.Key)
			c.report(ctx, e.Key, err)
			continue
		}
		kept = append(kept, err)
	}
	errs = kept
	redisUp := !c.breaker.open()
	if len(missing) == 0 {
		return found, errors.Join(errs...)
	}
	own, others := c.loads.claim(missing)
	if len(own) > 0 {
		ownKeys := make([]string, 0, len(own))
		for k := range own {
			ownKeys = append(ownKeys, k)
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			wctx, cancel := detach(ctx, c.closed, c.timeout)()
			defer cancel()
			c.loadBatch(wctx, ownKeys, own, fn, redisUp)
		}()
	}
	for _, set := range []map[string]*call[result[T]]{own, others} {
		for k, cl := range set {
			r, err := wait(ctx, cl)
			if err != nil {
				if ctx.Err() != nil {
					return found, ctx.Err()
				}
				if !errors.Is(err, ErrNotFound) {
					errs = append(errs, err)
				}
				continue
			}
			v, err := c.deliver(k, c.policy(k), r, nil)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			found[k] = v
		}
	}
	return found, errors.Join(errs...)
}

// loadBatch calls fn for keys, stores what it returns and completes each
// key's call.
func (c *Cache[T]) loadBatch(ctx context.Context, keys []string, calls map[string]*call[result[T]], fn func(context.Context, []string) (map[string]T, error), store bool) {
	var (
		vals map[string]T
		err  error
	)
	defer func() {
		for _, k := range keys {
			c.loads.finish(k, calls[k])
		}
	}()
	protect(ctx, keys, func(ctx context.Context, keys []string, vals *map[string]T) error {
		var err error
		*vals, err = fn(ctx, keys)
		return err
	}, &vals, &err)
	noStore := errors.Is(err, DoNotCache)
	if err != nil && !noStore {
		for _, k := range keys {
			c.policy(k).stats.loadErrors.Add(1)
			calls[k].err = keyErr("load", k, err)
		}
		return
	}
	items := make(map[string]T, len(vals))
	for _, k := range keys {
		p := c.policy(k)
		p.stats.loads.Add(1)
		v, ok := vals[k]
		if !ok {
			calls[k].err = ErrNotFound
			if store && !noStore {
				c.rememberNotFound(ctx, k, p)
			}
			continue
		}
		r := result[T]{val: v, from: fromLoader}
		if c.perCaller {
			data, err := c.marshal(nil, v)
			if err != nil {
				calls[k].err = keyErr("load", k, err)
				continue
			}
			r.data = data
		}
		calls[k].val = r
		items[k] = v
	}
	if store && !noStore && len(items) > 0 {
		if _, err := c.setMany(ctx, items); err != nil {
			c.report(ctx, "", err)
		}
	}
}

// refresh reloads key in the background unless a refresh of it is under
// way in this process (or, with WithLock, in another).
func (c *Cache[T]) refresh(ctx context.Context, key string, p *policy[T], ld Loader[T]) {
	if c.closed.Err() != nil {
		return
	}
	own, _ := c.refreshing.claim([]string{key}) // nothing if one is under way
	cl, ok := own[key]
	if !ok {
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer c.refreshing.finish(key, cl)
		wctx, cancel := detach(ctx, c.closed, c.timeout)()
		defer cancel()
		if c.lockLease > 0 {
			token, ok, err := c.lock(wctx, key)
			if err != nil || !ok {
				return // another process refreshes it
			}
			defer c.unlock(wctx, key, token)
		}
		p.stats.refreshes.Add(1)
		if _, err := c.load(wctx, key, p, ld, nil, true); err != nil && !errors.Is(err, ErrNotFound) {
			c.report(wctx, key, err)
		}
	}()
}

// lockKey names the lock of key. It keeps key's hash tag, if any, so the
// lock lives in key's slot on a cluster.
func lockKey(key string) string { return key + ":packcache-lock" }

var unlockScript = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) end return 0`)

func (c *Cache[T]) lock(ctx context.Context, key string) (token string, ok bool, err error) {
	var b [16]byte
	rand.Read(b[:])
	token = hex.EncodeToString(b[:])
	ok, err = c.rdb.SetNX(ctx, lockKey(key), token, c.lockLease).Result()
	return token, ok, err
}

func (c *Cache[T]) unlock(ctx context.Context, key, token string) {
	// Release only our own lock: after a lease ran out another process may
	// hold it.
	if err := unlockScript.Run(ctx, c.rdb, []string{lockKey(key)}, token).Err(); err != nil && err != redis.Nil {
		c.report(ctx, key, keyErr("unlock", key, redisErr(err)))
	}
}

// loadLocked loads key under the cross-process lock. If another process
// holds it, loadLocked waits for the value that process stores, polling
// with backoff; if the lock is released or expires with no value (its
// holder failed or died), it tries to take the lock again. It waits no
// longer than ctx allows.
func (c *Cache[T]) loadLocked(ctx context.Context, key string, p *policy[T], ld Loader[T], stale *result[T]) (result[T], error) {
	backoff := 2 * time.Millisecond
	waited := false
	for {
		token, ok, err := c.lock(ctx, key)
		if err != nil {
			c.redisFailed(p, err)
			c.report(ctx, key, keyErr("lock", key, redisErr(err)))
			return c.load(ctx, key, p, ld, stale, false)
		}
		if ok {
			r, err := c.load(ctx, key, p, ld, stale, true)
			c.unlock(ctx, key, token)
			return r, err
		}
		if !waited {
			waited = true
			p.stats.lockWaits.Add(1)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return result[T]{}, keyErr("load", key, ctx.Err())
		case <-t.C:
		}
		if backoff *= 2; backoff > 100*time.Millisecond {
			backoff = 100 * time.Millisecond
		}
		var r result[T]
		left, err := c.fetch(ctx, key, p, &r)
		switch {
		case err == nil && !p.expired(left):
			return r, nil
		case errors.Is(err, ErrNotFound):
			return result[T]{}, ErrNotFound
		case err != nil && errors.Is(err, ErrRedis):
			c.report(ctx, key, err)
			return c.load(ctx, key, p, ld, stale, false)
		}
	}
}

func dedupe(keys []string) []string {
	seen := make(map[string]struct{}, len(keys))
	out := keys[:0:0]
	for _, k := range keys {
		if _, ok := seen[k]; ok {
			continue
		}
		seen[k] = struct{}{}
		out = append(out, k)
	}
	return out
}
