package packcache

import (
	"context"
	"errors"
	"strings"
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
	nb := c.batchNodes(ctx, keys)
	rctx, cancel := c.budget(ctx)
	defer cancel()
	pipe := c.rdb.Pipeline()
	for i, k := range keys {
		if !nb.allowed(i) {
			out[i] = reply{err: circuitOpen("get", k)}
			continue
		}
		p := c.policy(k)
		gets[i] = pipe.Get(rctx, k)
		if p.refreshAfter > 0 || p.staleFor > 0 {
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
// whether it may be tried, and told once what the batch says of it.
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
	for i, rp := range c.fetchMany(ctx, keys) {
		k := keys[i]
		p := c.policy(k)
		j := c.judge(k, p, rp.s, rp.err, rp.left, false)
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
	for i, rp := range c.fetchMany(ctx, keys) {
		k := keys[i]
		p := c.policy(k)
		j := c.judge(k, p, rp.s, rp.err, rp.left, true)
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

// runBatch loads the keys of calls with one call of fn, on a goroutine of
// its own, settles each key's guard, stores the values in one pipeline and
// finishes each key's call. Callers still waiting when the load's context
// ends are released with its error.
func (c *Cache[T]) runBatch(ctx context.Context, calls map[string]*call[result[T]], jobs map[string]loadJob[T], fn func(context.Context, []string) (map[string]T, error)) {
	defer c.life.exit()
	keys := make([]string, 0, len(calls))
	for k := range calls {
		keys = append(keys, k)
	}
	lctx, cancel := c.loadContext(ctx, keys, false)
	defer cancel()
	timeout := context.AfterFunc(lctx, func() {
		for k, cl := range calls {
			c.loads.finish(k, cl, result[T]{}, c.loadEnded(lctx, k))
		}
	})
	results := make(map[string]result[T], len(keys))
	errs := make(map[string]error, len(keys))
	for _, k := range keys {
		errs[k] = errGoexit
	}
	defer func() {
		for k, cl := range calls {
			c.loads.finish(k, cl, results[k], errs[k])
		}
	}()
	c.loadBatch(lctx, keys, jobs, fn, timeout, results, errs)
}

// loadBatch is the work of runBatch, writing each key's outcome into
// results and errs.
func (c *Cache[T]) loadBatch(ctx context.Context, keys []string, jobs map[string]loadJob[T], fn func(context.Context, []string) (map[string]T, error), live func() bool, results map[string]result[T], errs map[string]error) {
	guards := c.settleMany(ctx, keys, jobs, results, errs)
	var loading []string
	for _, k := range keys {
		if _, settled := guards[k]; settled {
			loading = append(loading, k)
		}
	}
	if len(loading) == 0 {
		return
	}
	start := time.Now()
	vals, err := protect(ctx, fn, loading, func(ctx context.Context, fn func(context.Context, []string) (map[string]T, error), keys []string) (map[string]T, error) {
		return fn(ctx, keys)
	})
	sctx := context.WithoutCancel(ctx)
	if !live() {
		c.releaseMany(sctx, loading, guards)
		for _, k := range loading {
			errs[k] = c.loadEnded(ctx, k)
		}
		c.observeLoad(c.policy(loading[0]), len(loading), start, errs[loading[0]])
		return
	}
	c.observeLoad(c.policy(loading[0]), len(loading), start, err)
	noStore := errors.Is(err, DoNotCache)
	if err != nil && !noStore {
		c.releaseMany(sctx, loading, guards)
		for _, k := range loading {
			p := c.policy(k)
			p.stats.loadErrors.Add(1)
			kerr := keyErr("load", k, err)
			if from := jobs[k].from; from.v == vStale {
				p.stats.staleServes.Add(1)
				c.report(ctx, k, kerr)
				s := from.r
				s.stale = true
				results[k], errs[k] = s, nil
				continue
			}
			errs[k] = kerr
		}
		return
	}
	var writes []pendingWrite
	var unstored []string
	for _, k := range loading {
		p := c.policy(k)
		p.stats.loads.Add(1)
		g := guards[k]
		v, ok := vals[k]
		if ok && c.ptr && isNilPointer(v) {
			ok, errs[k] = false, keyErr("load", k, ErrNilValue)
			unstored = append(unstored, k)
			continue
		}
		if !ok {
			errs[k] = ErrNotFound
			if g.kind != guardNone && p.negativeTTL > 0 && !noStore {
				writes = append(writes, pendingWrite{key: k, g: g, stored: []byte{tombstone}, ttl: p.negativeTTL})
			} else {
				unstored = append(unstored, k)
			}
			continue
		}
		r := result[T]{val: v, from: fromLoader}
		if c.perCaller {
			data, merr := c.marshal(nil, v)
			if merr != nil {
				errs[k] = keyErr("load", k, merr)
				unstored = append(unstored, k)
				continue
			}
			r.data = data
		}
		results[k], errs[k] = r, nil
		if g.kind == guardNone || noStore {
			unstored = append(unstored, k)
			continue
		}
		e, eerr := c.encode(ctx, k, p, v)
		if eerr != nil {
			errs[k] = eerr
			unstored = append(unstored, k)
			continue
		}
		e.detach()
		writes = append(writes, pendingWrite{key: k, g: g, stored: e.stored, ttl: c.expiry(p, p.ttl), enc: e})
	}
	c.releaseMany(sctx, unstored, guards)
	c.storeMany(sctx, writes)
}

// settleMany settles the guards of a batch's loads as settle does for one
// (see load.go), taking the leases of all the missing keys in one
// pipeline. A key whose guard is settled is in the returned map; a key
// that turned out to hold a value or a tombstone has its result instead.
func (c *Cache[T]) settleMany(ctx context.Context, keys []string, jobs map[string]loadJob[T], results map[string]result[T], errs map[string]error) map[string]guard {
	guards := make(map[string]guard, len(keys))
	var missing []string
	for _, k := range keys {
		if jobs[k].from.v == vMiss {
			missing = append(missing, k)
			continue
		}
		c.settleOne(ctx, jobs[k], jobs[k].from, guards, results, errs)
	}
	if len(missing) == 0 {
		return guards
	}
	nb := c.batchNodes(ctx, missing)
	rctx, cancel := c.budget(ctx)
	defer cancel()
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(missing))
	for i, k := range missing {
		if nb.allowed(i) {
			cmds[i] = acquireScript.EvalSha(rctx, pipe, []string{k}, jobs[k].token, c.leaseTTL().Milliseconds(), "")
		}
	}
	execScripts(rctx, pipe, cmds, func(i int, p redis.Pipeliner) *redis.Cmd {
		k := missing[i]
		return acquireScript.Eval(rctx, p, []string{k}, jobs[k].token, c.leaseTTL().Milliseconds(), "")
	})
	for i, k := range missing {
		p := c.policy(k)
		if cmds[i] == nil {
			c.report(ctx, k, circuitOpen("lease", k))
			guards[k] = guard{}
			continue
		}
		s, err := cmds[i].Text()
		nb.saw(i, judgeRedis(ctx, err))
		switch {
		case err == redis.Nil:
			guards[k] = guard{guardLease, jobs[k].token}
		case err != nil:
			c.redisFailed(p, nb.of[i], err)
			c.report(ctx, k, keyErr("lease", k, redisErr(err)))
			guards[k] = guard{}
		default:
			// Something arrived since the read: judge it and settle as
			// a single load would.
			c.settleOne(ctx, jobs[k], c.judge(k, p, s, nil, -1, true), guards, results, errs)
		}
	}
	nb.feed()
	return guards
}

// settleOne settles one key of a batch with the single-key settle.
func (c *Cache[T]) settleOne(ctx context.Context, job loadJob[T], from judgement[T], guards map[string]guard, results map[string]result[T], errs map[string]error) {
	g, done, r, err := job.settle(ctx, from)
	if done {
		results[job.key], errs[job.key] = r, err
		return
	}
	guards[job.key] = g
}

// A pendingWrite is a guarded write of a batch.
type pendingWrite struct {
	key    string
	g      guard
	stored []byte
	ttl    time.Duration
	enc    encoded
}

// storeMany makes guarded writes in one pipeline.
func (c *Cache[T]) storeMany(ctx context.Context, writes []pendingWrite) {
	if len(writes) == 0 {
		return
	}
	defer func() {
		for i := range writes {
			writes[i].enc.release()
		}
	}()
	keys := make([]string, len(writes))
	for i, w := range writes {
		keys[i] = w.key
	}
	nb := c.batchNodes(ctx, keys)
	rctx, cancel := c.budget(ctx)
	defer cancel()
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(writes))
	for i, w := range writes {
		if nb.allowed(i) {
			cmds[i] = storeScript.EvalSha(rctx, pipe, []string{w.key}, storeArgs(w.g, w.stored, w.ttl)...)
		}
	}
	execScripts(rctx, pipe, cmds, func(i int, p redis.Pipeliner) *redis.Cmd {
		w := writes[i]
		return storeScript.Eval(rctx, p, []string{w.key}, storeArgs(w.g, w.stored, w.ttl)...)
	})
	for i, w := range writes {
		p := c.policy(w.key)
		if cmds[i] == nil {
			c.report(ctx, w.key, circuitOpen("set", w.key))
			continue
		}
		n, err := cmds[i].Int()
		nb.saw(i, judgeRedis(ctx, err))
		switch {
		case err != nil:
			c.redisFailed(p, nb.of[i], err)
			c.report(ctx, w.key, keyErr("set", w.key, redisErr(err)))
		case n == 0:
			p.stats.superseded.Add(1)
		default:
			p.stats.sets.Add(1)
			c.wrote(w.key)
		}
	}
	nb.feed()
}

// releaseMany releases the leases among guards of keys, in one pipeline.
func (c *Cache[T]) releaseMany(ctx context.Context, keys []string, guards map[string]guard) {
	var held []string
	for _, k := range keys {
		if guards[k].kind == guardLease {
			held = append(held, k)
		}
	}
	if len(held) == 0 {
		return
	}
	rctx, cancel := c.budget(ctx)
	defer cancel()
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(held))
	for i, k := range held {
		cmds[i] = releaseScript.EvalSha(rctx, pipe, []string{k}, guards[k].value)
	}
	execScripts(rctx, pipe, cmds, func(i int, p redis.Pipeliner) *redis.Cmd {
		k := held[i]
		return releaseScript.Eval(rctx, p, []string{k}, guards[k].value)
	})
	// A lease not released expires by itself; failures are not reported.
}

// execScripts runs a pipeline of EVALSHA commands and sends again, with
// EVAL, those a node answered NOSCRIPT (it had not seen the script yet),
// replacing them in cmds.
func execScripts(ctx context.Context, pipe redis.Pipeliner, cmds []*redis.Cmd, eval func(i int, p redis.Pipeliner) *redis.Cmd) {
	if pipe.Len() == 0 {
		return
	}
	_, _ = pipe.Exec(ctx)
	var again redis.Pipeliner
	for i, cmd := range cmds {
		if cmd != nil && cmd.Err() != nil && strings.HasPrefix(cmd.Err().Error(), "NOSCRIPT") {
			if again == nil {
				again = pipe
			}
			cmds[i] = eval(i, again)
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
	}
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
	nb := c.batchNodes(ctx, keys)
	rctx, cancel := c.budget(ctx)
	defer cancel()
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
	nb := c.batchNodes(ctx, keys)
	rctx, cancel := c.budget(ctx)
	defer cancel()
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
