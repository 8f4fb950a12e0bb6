package packcache

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/internal/owed"
	"github.com/packcache/packcache/internal/singleflight"
)

// The batch calls read and write many keys in one pipeline: one round trip
// per Redis node, whatever the keys' slots. They judge each stored value
// with judge and act on it by rule, exactly as Get does; what differs is
// only that their Redis calls are pipelined and that GetOrLoadMany loads
// every key it must with one call of its function.

// fetchMany reads keys in one pipeline, one round trip per node (see
// roundTripMany), with the time to live of those whose policy needs it.
func (c *cache) fetchMany(ctx context.Context, keys []string) []reply {
	out := make([]reply, len(keys))
	gets := make([]*redis.StringCmd, len(keys))
	pttls := make([]*redis.DurationCmd, len(keys))
	var sent time.Time
	errs := c.remote.roundTripMany(ctx, "get", keys, nil, false, func(ctx context.Context, pipe redis.Cmdable, i int, _ bool) redis.Cmder {
		gets[i] = pipe.Get(ctx, keys[i])
		if c.pols.of(keys[i]).needsPTTL() {
			pttls[i] = pipe.PTTL(ctx, keys[i])
			sent = time.Now()
		}
		return gets[i]
	})
	for i := range keys {
		out[i] = reply{err: errs[i], left: -1, sent: sent}
		if gets[i] != nil && errs[i] == nil {
			out[i].s = gets[i].Val()
			if pttls[i] != nil {
				out[i].left = ttlLeft(pttls[i])
			}
		}
	}
	c.groups.checkGroups(ctx, out)
	return out
}

// getMany is GetMany, and with a loader GetOrLoadMany: each key is judged
// and acted on by rule, as Get does, over one pipeline per node; the keys
// to load are loaded together, with one call of ld.
func (c *cache) getMany(ctx context.Context, keys []string, ld loadFunc) (map[string]any, error) {
	if err := checkKeys(opGet, keys...); err != nil {
		return nil, err
	}
	if err := c.life.begin(opGet, first(keys)); err != nil {
		return nil, err
	}
	defer c.life.Exit()
	if err := ctx.Err(); err != nil {
		return map[string]any{}, err
	}
	keys = dedupe(keys)
	found := make(map[string]any, len(keys))
	since := c.groups.checks.Load()
	var errs []error
	for len(keys) > 0 {
		// Keys whose value a grouped load checked before the call began
		// are read again, as get does (lateFor).
		var err error
		if keys, err = c.manyOnce(ctx, keys, ld, since, found, &errs); err != nil {
			return found, err
		}
	}
	return found, errors.Join(errs...)
}

// manyOnce is one attempt of getMany for keys: their values into found,
// their errors into errs. It returns the keys to read again (see
// result.lateFor), or the caller's context's error.
func (c *cache) manyOnce(ctx context.Context, keys []string, ld loadFunc, since uint64, found map[string]any, errs *[]error) ([]string, error) {
	readThrough := ld != nil
	var toLoad []string
	from := map[string]judgement{}
	keys, tickets := c.nearMany(keys, found)
	for i, rp := range c.fetchMany(ctx, keys) {
		k := keys[i]
		p := c.pols.of(k)
		j := c.form.judge(k, p, rp, readThrough)
		if c.owed.Has(k) {
			j = judgement{v: vOwed} // see get
		}
		if tickets != nil && p.near != nil && j.v == vHit && !j.refresh {
			p.near.keepRead(k, p, tickets[i], j, rp)
		}
		load, err := c.rule(ctx, k, j, readThrough)
		switch {
		case err != nil:
			if _, err := c.deliver(k, p, j.r, err, false); !errors.Is(err, ErrMiss) && !errors.Is(err, ErrNotFound) {
				*errs = append(*errs, err)
			}
			continue
		case load:
			if err := reentrant(ctx, c, k); err != nil {
				*errs = append(*errs, err)
				continue
			}
			toLoad = append(toLoad, k)
			from[k] = j
			continue
		}
		if j.refresh {
			c.refresh(ctx, k, p, ld, j)
		}
		if v, err := c.deliver(k, p, j.r, nil, false); err != nil {
			*errs = append(*errs, err)
		} else {
			found[k] = v
		}
	}
	if err := ctx.Err(); err != nil {
		// The caller's context ended: not Redis's failure, and keys Redis
		// did not answer for are not loaded, since Redis may well hold
		// them.
		return nil, err
	}
	if len(toLoad) == 0 {
		return nil, nil
	}
	var jobs []loadJob
	calls := make([]*singleflight.Call[result], len(toLoad))
	joined := make([]bool, len(toLoad))
	for i, k := range toLoad {
		p := c.pols.of(k)
		token := loadToken(from[k], &c.remote.leases)
		calls[i], joined[i] = c.loads.Claim(k, token, true, c.coalesce)
		if joined[i] {
			atomic.AddUint64(&p.stats.CoalescedWaits, 1)
		} else {
			jobs = append(jobs, loadJob{key: k, p: p, from: from[k], token: token, cl: calls[i]})
		}
	}
	if len(jobs) > 0 {
		c.goLoad(ctx, ld, jobs)
	}
	var late []string
	for i, k := range toLoad {
		p := c.pols.of(k)
		r, err := c.awaitLoad(ctx, k, p, from[k], calls[i], joined[i])
		if err != nil && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err == nil && r.lateFor(since) {
			late = append(late, k)
			continue
		}
		v, err := c.deliver(k, p, r, err, joined[i])
		switch {
		case err == nil:
			found[k] = v
		case errors.Is(err, ErrNotFound):
		default:
			*errs = append(*errs, err)
		}
	}
	return late, nil
}

// nearMany answers from the near caches the keys they hold, into found,
// and returns the others, with the tickets of those that have a near
// cache (nil when none has), taken before they are read.
func (c *cache) nearMany(keys []string, found map[string]any) ([]string, []ticket) {
	if c.nears == nil {
		return keys, nil
	}
	rest := keys[:0:0]
	for _, k := range keys {
		p := c.pols.of(k)
		if p.near != nil {
			if e, ok := p.near.get(k); ok {
				if v, err := c.deliver(k, p, result{val: e.val, data: e.data, from: fromNear}, nil, false); err == nil {
					found[k] = v
					continue
				}
			}
		}
		rest = append(rest, k)
	}
	tickets := make([]ticket, len(rest))
	for i, k := range rest {
		tickets[i] = c.marks.take(k)
	}
	return rest, tickets
}

// setMany is SetMany, with each value a *T.
func (c *cache) setMany(ctx context.Context, items map[string]any, opts []SetOption) error {
	sorted := slices.Sorted(maps.Keys(items))
	if err := checkKeys(opSet, sorted...); err != nil {
		return err
	}
	if err := c.life.begin(opSet, first(sorted)); err != nil {
		return err
	}
	defer c.life.Exit()
	if len(items) == 0 {
		return nil
	}
	var so setOptions
	for _, o := range opts {
		o(&so)
	}
	if so.ttlSet {
		if err := checkTTL("SetTTL", so.ttl); err != nil {
			return err
		}
	}
	var errs []error
	keys := make([]string, 0, len(items))
	ttls := make([]time.Duration, 0, len(items))
	encs := make([]encoded, 0, len(items))
	defer func() {
		for i := range encs {
			encs[i].release()
		}
	}()
	for k, v := range items {
		e, err := c.form.encode(ctx, "set", k, c.pols.of(k), v)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		e.detach()
		keys = append(keys, k)
		encs = append(encs, e)
		p := c.pols.of(k)
		ttl := p.ttl
		if so.ttlSet {
			ttl = so.ttl
		}
		ttls = append(ttls, p.expiry(ttl))
	}
	defer func() { c.changed(written, keys...) }()
	stored := make([][]byte, len(encs))
	for i := range encs {
		stored[i] = encs[i].stored
	}
	serr := c.groups.groupStoredMany(ctx, keys, so, stored, ttls)
	w := owed.Write{Op: "set", Keys: keys, Stored: stored, TTL: so.ttl}
	for i, err := range c.owed.Write(ctx, &w, func() []error {
		if serr != nil {
			// The groups' records could not be readied: nothing written.
			out := make([]error, len(keys))
			for i := range out {
				out[i] = serr
			}
			return out
		}
		return c.remote.roundTripMany(ctx, "set", keys, nil, true, func(ctx context.Context, pipe redis.Cmdable, i int, _ bool) redis.Cmder {
			return pipe.Set(ctx, keys[i], stored[i], redisTTL(ttls[i]))
		})
	}) {
		if err != nil {
			errs = append(errs, err)
			continue
		}
		atomic.AddUint64(&c.pols.of(keys[i]).stats.Sets, 1)
	}
	return errors.Join(errs...)
}

// delMany deletes keys with one DEL per key in a pipeline: a multi-key DEL
// fails on a cluster when the keys' slots differ, and the pipeline still
// costs one round trip per node.
func (c *cache) delMany(ctx context.Context, keys []string) error {
	w := owed.Write{Op: "delete", Keys: keys}
	return errors.Join(c.owed.Write(ctx, &w, func() []error {
		return c.remote.roundTripMany(ctx, "delete", keys, nil, true, func(ctx context.Context, pipe redis.Cmdable, i int, _ bool) redis.Cmder {
			return pipe.Del(ctx, keys[i])
		})
	})...)
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

// first is keys[0], or "" if there is none: the key a batch call's
// closed-cache error names.
func first(keys []string) string {
	if len(keys) == 0 {
		return ""
	}
	return keys[0]
}
