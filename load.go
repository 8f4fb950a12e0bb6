package packcache

import (
	"context"
	"errors"
)

// loadFlight is the load of a flight: under the cross-process lock when
// there is one and Redis is up.
func loadFlight[T any](ctx context.Context, f flight[T], r *result[T]) error {
	var err error
	if f.redisUp && f.c.lockLease > 0 {
		*r, err = f.c.loadLocked(ctx, f.key, f.p, f.ld, f.stale)
	} else {
		*r, err = f.c.load(ctx, f.key, f.p, f.ld, f.stale, f.redisUp)
	}
	return err
}

// load calls the loader and, when Redis is up, stores what it returns.
func (c *Cache[T]) load(ctx context.Context, key string, p *policy[T], ld Loader[T], stale *result[T], store bool) (result[T], error) {
	var v T
	var err error
	protect(ctx, loaderCall[T]{ld, key}, c.callLoaderFn, &v, &err)
	switch {
	case err == nil || errors.Is(err, DoNotCache):
		p.stats.loads.Add(1)
		r := result[T]{val: v, from: fromLoader}
		if err == nil && store {
			data, serr := c.store(ctx, key, p, v, p.TTL, c.perCaller)
			if serr != nil {
				if c.strict || errors.Is(serr, ErrSerialization) || errors.Is(serr, ErrTooLarge) {
					return result[T]{}, serr
				}
				c.report(ctx, key, serr)
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
		if store {
			c.rememberNotFound(ctx, key, p)
		}
		return result[T]{}, ErrNotFound
	default:
		p.stats.loadErrors.Add(1)
		if stale != nil {
			p.stats.staleServes.Add(1)
			c.report(ctx, key, keyErr("load", key, err))
			s := *stale
			s.stale = true
			return s, nil
		}
		return result[T]{}, keyErr("load", key, err)
	}
}

// rememberNotFound stores key's tombstone for its policy's NegativeTTL,
// if it has one.
func (c *Cache[T]) rememberNotFound(ctx context.Context, key string, p *policy[T]) {
	if p.NegativeTTL <= 0 {
		return
	}
	if err := c.setRaw(ctx, key, []byte{tombstone}, p.NegativeTTL); err != nil {
		c.report(ctx, key, err)
	}
}

// loaderCall is a loader and its key, for protect.
type loaderCall[T any] struct {
	ld  Loader[T]
	key string
}

func callLoader[T any](ctx context.Context, l loaderCall[T], v *T) error {
	var err error
	*v, err = l.ld.Load(ctx, l.key)
	return err
}

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
