package packcache

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// The batch calls read and write many keys in one pipeline: one round trip
// per Redis node, whatever the keys' slots. They judge each stored value
// with judge and act on it by rule, exactly as Get does; what differs is
// only that their Redis calls are pipelined and that GetOrLoadMany loads
// every key it must with one call of its function.

// reply is what Redis returned for one key of a batch.
type reply struct {
	s    string
	left time.Duration
	err  error
}

// fetchMany reads keys in one pipeline under the Redis budget. A key whose
// node's breaker is open is not sent; its reply is an ErrCircuitOpen. Each
// node's breaker is told once what the pipeline says of the node.
func (c *Cache[T]) fetchMany(ctx context.Context, keys []string) []reply {
	out := make([]reply, len(keys))
	gets := make([]*redis.StringCmd, len(keys))
	pttls := make([]*redis.DurationCmd, len(keys))
	rctx, cancel := c.budget(ctx)
	defer cancel()
	nb := c.batchNodes(rctx, keys)
	pipe := c.rdb.Pipeline()
	for i, k := range keys {
		if !nb.allowed(i) {
			out[i] = reply{err: circuitOpen("get", k)}
			continue
		}
		p := c.policy(k)
		gets[i] = pipe.Get(rctx, k)
		if p.needsPTTL() {
			pttls[i] = pipe.PTTL(rctx, k)
		}
	}
	if pipe.Len() > 0 {
		_, _ = pipe.Exec(rctx) // each command carries its own error
	}
	for i, k := range keys {
		if gets[i] == nil {
			continue
		}
		s, err := gets[i].Result()
		nb.saw(i, judgeRedis(ctx, err))
		out[i] = reply{s: s, left: -1, err: err}
		switch {
		case err == redis.Nil:
		case err != nil:
			c.redisFailed(c.policy(k), nb.of[i], err)
			out[i].err = keyErr("get", k, redisErr(err))
		case pttls[i] != nil:
			if d, perr := pttls[i].Result(); perr == nil && d > 0 {
				out[i].left = d
			}
		}
	}
	nb.feed()
	return out
}

// batchNodes is the breakers of a batch's keys: each node is asked once
// whether it may be tried, and told once what the batch says of it. ctx
// is the batch's budgeted context: finding a key's node can be a Redis
// call.
type batchNodes struct {
	of      []*breaker
	allow   map[*breaker]bool
	outcome map[*breaker]outcome
}

func (c *Cache[T]) batchNodes(ctx context.Context, keys []string) *batchNodes {
	nb := &batchNodes{of: make([]*breaker, len(keys)), allow: map[*breaker]bool{}, outcome: map[*breaker]outcome{}}
	for i, k := range keys {
		b := c.nodes.forKey(ctx, k)
		nb.of[i] = b
		if _, asked := nb.allow[b]; !asked {
			nb.allow[b] = b.allow()
		}
	}
	return nb
}

func (nb *batchNodes) allowed(i int) bool { return nb.allow[nb.of[i]] }

// saw records the outcome of key i's command: a node that failed any
// command failed the batch once; one whose caller gave up says nothing.
func (nb *batchNodes) saw(i int, o outcome) {
	b := nb.of[i]
	if cur, ok := nb.outcome[b]; !ok || o > cur {
		nb.outcome[b] = o
	}
}

func (nb *batchNodes) feed() {
	for b, o := range nb.outcome {
		b.feed(o)
	}
}

// GetMany returns the values stored under keys, in one round trip per
// Redis node. Each key is judged as Get without a loader judges it: keys
// that hold no value, a value past its TTL kept only for StaleFor, a lease
// or a remembered ErrNotFound are absent from the map. Values that cannot
// be decoded, and keys Redis failed on (or whose node's breaker is open),
// are left out of the map and reported in the error, which joins one
// *Error per key; the map holds every value that could be read.
func (c *Cache[T]) GetMany(ctx context.Context, keys []string) (map[string]T, error) {
	if !c.life.enter() {
		return nil, ErrClosed
	}
	defer c.life.exit()
	keys = dedupe(keys)
	found := make(map[string]T, len(keys))
	if len(keys) == 0 {
		return found, nil
	}
	var errs []error
	keys, tickets := c.nearMany(keys, found)
	for i, rp := range c.fetchMany(ctx, keys) {
		k := keys[i]
		p := c.policy(k)
		j := c.judge(k, p, rp.s, rp.err, rp.left, false)
		if tickets != nil && p.near != nil && j.v == vHit {
			c.keepNear(k, p, tickets[i], j)
		}
		_, err := c.rule(ctx, k, j, false)
		v, err := c.deliver(k, p, j.r, err, false)
		switch {
		case err == nil:
			found[k] = v
		case errors.Is(err, ErrMiss), errors.Is(err, ErrNotFound):
		default:
			errs = append(errs, err)
		}
	}
	return found, errors.Join(errs...)
}

// GetOrLoadMany returns the values for keys, reading those Redis holds in
// one round trip per node and loading the others with one call of fn,
// which gets only the keys it must load. Each key is judged and acted on
// as a read-through Get would: a miss, a value past its TTL, an
// undecodable value and a Redis failure load (the last without storing,
// unless WithStrictRedis makes it an error); another process's lease loads
// without storing, or with WithLock is waited for; a value due for refresh
// is returned and refreshed in the background. Keys this process is
// already loading from the same state (by a Get or another GetOrLoadMany)
// are waited for instead of passed to fn. Loaded values are stored with
// their keys' policies, under the same leases and digests as Get's loads,
// so a write during the load is never undone. Keys fn leaves out of its
// map are not found: absent from the result and, with a NegativeTTL,
// remembered as such.
//
// fn runs on a goroutine of the cache's, under a context with the caller's
// values, bounded by WithLoadTimeout; a panic in it becomes a *PanicError
// for its keys. The error joins one *Error per key that failed; the map
// holds every value that could be had. If ctx ends first, the map holds
// what had arrived and the error is ctx.Err().
func (c *Cache[T]) GetOrLoadMany(ctx context.Context, keys []string, fn func(ctx context.Context, missing []string) (map[string]T, error)) (map[string]T, error) {
	if fn == nil {
		return nil, errors.New("packcache: GetOrLoadMany with nil function")
	}
	if !c.life.enter() {
		return nil, ErrClosed
	}
	defer c.life.exit()
	keys = dedupe(keys)
	found := make(map[string]T, len(keys))
	if len(keys) == 0 {
		return found, nil
	}
	ld := batchLoader[T](fn)
	var errs []error
	var toLoad []string
	from := map[string]judgement[T]{}
	keys, tickets := c.nearMany(keys, found)
	for i, rp := range c.fetchMany(ctx, keys) {
		k := keys[i]
		p := c.policy(k)
		j := c.judge(k, p, rp.s, rp.err, rp.left, true)
		if tickets != nil && p.near != nil && j.v == vHit && !j.refresh {
			c.keepNear(k, p, tickets[i], j)
		}
		load, err := c.rule(ctx, k, j, true)
		switch {
		case err != nil:
			if _, err := c.deliver(k, p, j.r, err, false); !errors.Is(err, ErrNotFound) {
				errs = append(errs, err)
			}
			continue
		case load:
			if err := c.reentrant(ctx, k); err != nil {
				errs = append(errs, err)
				continue
			}
			toLoad = append(toLoad, k)
			from[k] = j
			continue
		}
		if j.refresh {
			c.refresh(ctx, flight[T]{c: c, key: k, p: p, ld: ld}, j)
		}
		if v, err := c.deliver(k, p, j.r, nil, false); err != nil {
			errs = append(errs, err)
		} else {
			found[k] = v
		}
	}
	if len(toLoad) == 0 {
		return found, errors.Join(errs...)
	}
	tokens := make(map[string]string, len(toLoad))
	for _, k := range toLoad {
		tokens[k] = loadToken(from[k])
	}
	own, others := c.loads.claim(toLoad, tokens)
	if len(own) > 0 {
		jobs := make(map[string]loadJob[T], len(own))
		for k := range own {
			jobs[k] = loadJob[T]{c: c, key: k, p: c.policy(k), ld: ld, from: from[k], token: tokens[k]}
		}
		c.life.spawn()
		go c.runBatch(ctx, own, jobs, fn)
	}
	for k := range others {
		c.policy(k).stats.coalescedWaits.Add(1)
	}
	for i, set := range []map[string]*call[result[T]]{own, others} {
		for k, cl := range set {
			r, err := wait(ctx, cl)
			if err != nil && ctx.Err() != nil {
				return found, ctx.Err()
			}
			if j := from[k]; err != nil && j.v == vStale && !errors.Is(err, ErrNotFound) {
				// The load failed (a joined one may have had no stale
				// value to fall back on): StaleFor serves the stale one.
				c.policy(k).stats.staleServes.Add(1)
				c.report(ctx, k, err)
				r, err = j.r, nil
				r.stale = true
			}
			v, err := c.deliver(k, c.policy(k), r, err, i == 1)
			switch {
			case err == nil:
				found[k] = v
			case errors.Is(err, ErrNotFound):
			default:
				errs = append(errs, err)
			}
		}
	}
	return found, errors.Join(errs...)
}

// nearMany answers from the near caches the keys they hold, into found,
// and returns the others, with the tickets of those that have a near
// cache (nil when none has), taken before they are read.
func (c *Cache[T]) nearMany(keys []string, found map[string]T) ([]string, []ticket) {
	if c.nears == nil {
		return keys, nil
	}
	rest := keys[:0:0]
	for _, k := range keys {
		p := c.policy(k)
		if p.near != nil {
			if e, ok := p.near.get(k); ok {
				p.stats.nearHits.Add(1)
				if v, err := c.deliver(k, p, result[T]{val: e.val, data: e.data, from: fromNear}, nil, false); err == nil {
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

// batchLoader adapts a GetOrLoadMany function to a Loader of one key, for
// the refreshes it starts.
func batchLoader[T any](fn func(context.Context, []string) (map[string]T, error)) Loader[T] {
	return LoaderFunc[T](func(ctx context.Context, key string) (T, error) {
		m, err := fn(ctx, []string{key})
		v, ok := m[key]
		switch {
		case err != nil:
			return v, err
		case !ok:
			return v, ErrNotFound
		}
		return v, nil
	})
}

// SetMany stores items, each with its key's policy, in one round trip per
// Redis node. The error joins one *Error per key that failed; the others
// are stored. Each stored key has Set's guarantee: no load begun before it
// stores over it.
func (c *Cache[T]) SetMany(ctx context.Context, items map[string]T, opts ...SetOption) error {
	if !c.life.enter() {
		return ErrClosed
	}
	defer c.life.exit()
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
	encs := make([]encoded, 0, len(items))
	defer func() {
		for i := range encs {
			encs[i].release()
		}
	}()
	for k, v := range items {
		e, err := c.encode(ctx, k, c.policy(k), v)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		e.detach()
		keys = append(keys, k)
		encs = append(encs, e)
	}
	defer func() {
		for _, k := range keys {
			c.forget(k)
		}
	}()
	rctx, cancel := c.budget(ctx)
	defer cancel()
	nb := c.batchNodes(rctx, keys)
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.StatusCmd, len(keys))
	for i, k := range keys {
		if !nb.allowed(i) {
			errs = append(errs, circuitOpen("set", k))
			continue
		}
		p := c.policy(k)
		ttl := p.ttl
		if so.ttlSet {
			ttl = so.ttl
		}
		cmds[i] = pipe.Set(rctx, k, encs[i].stored, redisTTL(c.expiry(p, ttl)))
	}
	if pipe.Len() > 0 {
		_, _ = pipe.Exec(rctx)
	}
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		p := c.policy(keys[i])
		err := cmd.Err()
		nb.saw(i, judgeRedis(ctx, err))
		if err != nil {
			c.redisFailed(p, nb.of[i], err)
			errs = append(errs, keyErr("set", keys[i], redisErr(err)))
			continue
		}
		p.stats.sets.Add(1)
	}
	nb.feed()
	return errors.Join(errs...)
}

// delMany deletes keys with one DEL per key in a pipeline: a multi-key DEL
// fails on a cluster when the keys' slots differ, and the pipeline still
// costs one round trip per node.
func (c *Cache[T]) delMany(ctx context.Context, keys []string) error {
	rctx, cancel := c.budget(ctx)
	defer cancel()
	nb := c.batchNodes(rctx, keys)
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, len(keys))
	var errs []error
	for i, k := range keys {
		if !nb.allowed(i) {
			errs = append(errs, circuitOpen("delete", k))
			continue
		}
		cmds[i] = pipe.Del(rctx, k)
	}
	if pipe.Len() > 0 {
		_, _ = pipe.Exec(rctx)
	}
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		err := cmd.Err()
		nb.saw(i, judgeRedis(ctx, err))
		if err != nil {
			c.redisFailed(c.policy(keys[i]), nb.of[i], err)
			errs = append(errs, keyErr("delete", keys[i], redisErr(err)))
		}
	}
	nb.feed()
	return errors.Join(errs...)
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
