package packcache

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// GetMany returns the values stored under keys, in one round trip per
// Redis node. Keys that hold no value (or a remembered ErrNotFound) are
// absent from the map. Values that cannot be decoded, and keys Redis failed
// on, are left out of the map and reported in the error, which joins one
// *Error per key; the map holds every value that could be read.
func (c *Cache[T]) GetMany(ctx context.Context, keys []string) (map[string]T, error) {
	found, _, errs := c.getMany(ctx, keys)
	return found, errors.Join(errs...)
}

// getMany reads keys; missing lists the keys that hold no value.
func (c *Cache[T]) getMany(ctx context.Context, keys []string) (found map[string]T, missing []string, errs []error) {
	found = make(map[string]T, len(keys))
	if len(keys) == 0 {
		return found, nil, nil
	}
	if !c.breaker.allow() {
		for _, k := range keys {
			errs = append(errs, keyErr("get", k, &kindError{ErrRedis, ErrCircuitOpen}))
		}
		return found, nil, errs
	}
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.Get(ctx, k)
	}
	pipe.Exec(ctx)
	for i, cmd := range cmds {
		k := keys[i]
		p := c.policy(k)
		s, err := cmd.Result()
		if err == redis.Nil {
			p.stats.misses.Add(1)
			missing = append(missing, k)
			continue
		}
		if err != nil {
			c.redisFailed(p, err)
			errs = append(errs, keyErr("get", k, redisErr(err)))
			continue
		}
		c.breaker.success()
		var r result[T]
		if err := c.view(k, p, s, &r); err != nil {
			if err == ErrNotFound {
				p.stats.notFoundHits.Add(1)
			} else {
				errs = append(errs, err)
			}
			continue
		}
		v := r.val
		if r.data != nil {
			if err := c.unmarshal(r.data, &v); err != nil {
				errs = append(errs, keyErr("get", k, err))
				continue
			}
		}
		p.stats.hits.Add(1)
		found[k] = v
	}
	return found, missing, errs
}

// SetMany stores items, each with its key's policy, in one round trip per
// Redis node. The error joins one *Error per key that failed; the others
// are stored.
func (c *Cache[T]) SetMany(ctx context.Context, items map[string]T, opts ...SetOption) error {
	stored, err := c.setMany(ctx, items, opts...)
	for _, k := range stored {
		c.forget(k)
	}
	return err
}

// setMany is SetMany for the cache's own use: it ends the sharing of
// loader-less reads only (see setRaw), and returns the keys it stored.
func (c *Cache[T]) setMany(ctx context.Context, items map[string]T, opts ...SetOption) ([]string, error) {
	if len(items) == 0 {
		return nil, nil
	}
	var so setOptions
	for _, o := range opts {
		o(&so)
	}
	if so.ttlSet {
		if err := checkTTL("SetTTL", so.ttl); err != nil {
			return nil, err
		}
	}
	var errs []error
	bufs := make([]*[]byte, 0, 2*len(items))
	defer func() {
		for _, b := range bufs {
			putBuf(b)
		}
	}()
	pipe := c.rdb.Pipeline()
	keys := make([]string, 0, len(items))
	cmds := make([]*redis.StatusCmd, 0, len(items))
	for k, v := range items {
		p := c.policy(k)
		sbuf, fbuf := getBuf(), getBuf()
		bufs = append(bufs, sbuf, fbuf)
		stored, _, err := c.encode(ctx, k, p, v, sbuf, fbuf)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ttl := p.TTL
		if so.ttlSet {
			ttl = so.ttl
		}
		keys = append(keys, k)
		cmds = append(cmds, pipe.Set(ctx, k, stored, redisTTL(c.expiry(p, ttl))))
	}
	if len(cmds) > 0 {
		pipe.Exec(ctx)
	}
	done := keys[:0]
	for i, cmd := range cmds {
		p := c.policy(keys[i])
		if err := cmd.Err(); err != nil {
			c.redisFailed(p, err)
			errs = append(errs, keyErr("set", keys[i], redisErr(err)))
			continue
		}
		p.stats.sets.Add(1)
		c.lookups.forget(keys[i])
		done = append(done, keys[i])
	}
	return done, errors.Join(errs...)
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
