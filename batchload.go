package packcache

import (
	"bytes"
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// runBatch loads the keys of calls with one call of fn, on a goroutine of
// its own: it settles how each key may store, calls fn, stores the values
// in one pipeline and finishes each key's call. Callers still waiting when
// the load's context ends are released with its error.
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
	b := &batchLoad[T]{
		c: c, jobs: jobs, fn: fn, live: timeout, own: calls,
		results: make(map[string]result[T], len(keys)),
		errs:    make(map[string]error, len(keys)),
		joins:   map[string]*call[result[T]]{},
		guards:  make(map[string]guard, len(keys)),
	}
	for _, k := range keys {
		b.errs[k] = keyErr("load", k, errGoexit) // what runtime.Goexit in fn leaves
	}
	// Whatever happens (runtime.Goexit in fn included), every call is
	// finished: a call finished already keeps its result.
	defer func() {
		for k, cl := range calls {
			c.loads.finish(k, cl, b.results[k], b.errs[k])
		}
	}()
	finish := func() {
		for k, cl := range calls {
			if _, joined := b.joins[k]; !joined {
				c.loads.finish(k, cl, b.results[k], b.errs[k])
			}
		}
	}
	_, err := protect(lctx, b, keys, func(ctx context.Context, b *batchLoad[T], keys []string) (struct{}, error) {
		b.run(ctx, keys)
		return struct{}{}, nil
	})
	if err != nil { // a panic in fn, the serializer or a codec
		for _, k := range keys {
			if _, joined := b.joins[k]; !joined {
				b.results[k], b.errs[k] = result[T]{}, keyErr("load", k, err)
			}
		}
	}
	// This batch's own keys are done: finish them before waiting for the
	// loads of other calls that hold some of its keys, which may be
	// waiting for these in turn.
	finish()
	for k, other := range b.joins {
		r, err := wait(lctx, other)
		c.loads.finish(k, calls[k], r, err)
	}
}

// A batchLoad is the work of one GetOrLoadMany load.
type batchLoad[T any] struct {
	c    *Cache[T]
	jobs map[string]loadJob[T]
	own  map[string]*call[result[T]] // the batch's calls, by key
	fn   func(context.Context, []string) (map[string]T, error)
	live func() bool

	results map[string]result[T]
	errs    map[string]error
	guards  map[string]guard            // keys to load, and how each may store
	joins   map[string]*call[result[T]] // keys another load of this process now holds
	seen    map[string]string           // keys another process holds the lease of, and that lease
	stored  map[string]bool             // keys whose value (or tombstone) was written
}

// run settles the keys, loads those that need it with one call of fn, and
// stores what it returns. A lease the batch took and did not store over
// is released however run ends.
func (b *batchLoad[T]) run(ctx context.Context, keys []string) {
	c := b.c
	sctx := context.WithoutCancel(ctx)
	b.stored = map[string]bool{}
	defer func() {
		var held []string
		for k, g := range b.guards {
			if g.kind == guardLease && !b.stored[k] {
				held = append(held, k)
			}
		}
		c.releaseMany(sctx, held, b.guards)
	}()
	b.settle(ctx, keys)
	var loading []string
	for _, k := range keys {
		if _, ok := b.guards[k]; ok {
			loading = append(loading, k)
		}
	}
	if len(loading) == 0 {
		return
	}
	start := time.Now()
	vals, err := protect(ctx, b.fn, loading, func(ctx context.Context, fn func(context.Context, []string) (map[string]T, error), keys []string) (map[string]T, error) {
		return fn(ctx, keys)
	})
	if !b.live() || ctx.Err() != nil {
		for _, k := range loading {
			b.errs[k] = c.loadEnded(ctx, k)
		}
		c.observeLoad(c.policy(loading[0]), len(loading), start, b.errs[loading[0]])
		return
	}
	c.observeLoad(c.policy(loading[0]), len(loading), start, err)
	noStore := errors.Is(err, DoNotCache)
	if err != nil && !noStore {
		for _, k := range loading {
			p := c.policy(k)
			p.stats.loadErrors.Add(1)
			kerr := keyErr("load", k, err)
			if from := b.jobs[k].from; from.v == vStale {
				p.stats.staleServes.Add(1)
				c.report(ctx, k, kerr)
				s := from.r
				s.stale = true
				b.results[k], b.errs[k] = s, nil
				continue
			}
			b.errs[k] = kerr
		}
		return
	}
	var writes []pendingWrite
	defer func() {
		for i := range writes {
			writes[i].enc.release()
		}
	}()
	for _, k := range loading {
		p := c.policy(k)
		p.stats.loads.Add(1)
		g := b.guards[k]
		if g.kind == guardDigest && c.loads.isDetached(b.own[k]) {
			p.stats.superseded.Add(1)
			g = guard{}
		}
		v, ok := vals[k]
		if ok && c.ptr && isNilPointer(v) {
			b.errs[k] = keyErr("load", k, ErrNilValue)
			continue
		}
		if !ok {
			b.errs[k] = ErrNotFound
			if g.kind != guardNone && p.negativeTTL > 0 && !noStore {
				writes = append(writes, pendingWrite{key: k, g: g, stored: []byte{tombstone}, ttl: p.negativeTTL})
			}
			continue
		}
		r := result[T]{val: v, from: fromLoader}
		if g.kind == guardNone || noStore {
			if c.perCaller {
				data, merr := c.marshal(nil, v)
				if merr != nil {
					b.errs[k] = keyErr("load", k, merr)
					continue
				}
				r.data = data
			}
			b.results[k], b.errs[k] = r, nil
			continue
		}
		// Serialized once, for the store and (as storeLoaded does) for
		// the callers that decode their own copy.
		e, eerr := c.encode(ctx, "load", k, p, v)
		if eerr != nil {
			if c.unstored(ctx, k, p, eerr) {
				b.errs[k] = eerr
				continue
			}
			if c.perCaller {
				if r.data, eerr = c.marshal(nil, v); eerr != nil {
					b.errs[k] = keyErr("load", k, eerr)
					continue
				}
			}
			b.results[k], b.errs[k] = r, nil
			continue
		}
		if c.perCaller {
			r.data = bytes.Clone(e.payload)
		}
		b.results[k], b.errs[k] = r, nil
		e.detach()
		writes = append(writes, pendingWrite{key: k, g: g, stored: e.stored, ttl: c.expiry(p, p.ttl), enc: e})
	}
	wrote, failed := c.storeMany(sctx, writes)
	for _, k := range wrote {
		b.stored[k] = true
	}
	for k, err := range failed {
		if c.unstored(ctx, k, c.policy(k), err) {
			b.results[k], b.errs[k] = result[T]{}, err
		}
	}
}

// settle decides for each key how its load may store, as a single load's
// settle does, with one pipeline per step for all the keys: read again the
// keys that held another process's lease when the batch read them; take
// the leases of the missing keys; with WithLock, wait for the other
// processes' leases together and take over those that outlive the wait.
// A key that turns out to hold a value or a tombstone gets it as its
// result; one whose lease another load of this process now holds is
// joined to that load (b.joins), to be waited for only after this batch's
// own keys are finished.
func (b *batchLoad[T]) settle(ctx context.Context, keys []string) {
	c := b.c
	b.seen = map[string]string{}
	var reread, missing []string
	for _, k := range keys {
		switch from := b.jobs[k].from; from.v {
		case vLease:
			reread = append(reread, k)
		case vMiss:
			missing = append(missing, k)
		default:
			b.decide(ctx, k, from, nil)
		}
	}
	// The lease a read found may be that of a load of this process that
	// has just ended.
	for i, rp := range c.fetchMany(ctx, reread) {
		k := reread[i]
		b.decide(ctx, k, c.judge(k, c.policy(k), rp, true), &missing)
	}
	b.acquire(ctx, missing, nil)
	if len(b.seen) == 0 {
		return
	}
	if c.lockWait <= 0 {
		for k := range b.seen {
			b.guards[k] = guard{}
		}
		return
	}
	// WithLock: wait for the other processes' loads, all together.
	waiting := make([]string, 0, len(b.seen))
	for k := range b.seen {
		waiting = append(waiting, k)
	}
	for _, k := range waiting {
		c.policy(k).stats.lockWaits.Add(1)
	}
	deadline := time.Now().Add(c.lockWait)
	backoff := 2 * time.Millisecond
	for len(waiting) > 0 && time.Now().Before(deadline) {
		t := time.NewTimer(min(backoff, time.Until(deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			for _, k := range waiting {
				b.errs[k] = keyErr("load", k, ctx.Err())
				delete(b.seen, k)
			}
			return
		case <-t.C:
		}
		backoff = min(2*backoff, 100*time.Millisecond)
		still := waiting[:0]
		for i, rp := range c.fetchMany(ctx, waiting) {
			k := waiting[i]
			j := c.judge(k, c.policy(k), rp, true)
			if j.v == vLease {
				b.seen[k] = j.lease
				still = append(still, k)
				continue
			}
			delete(b.seen, k)
			var again []string
			b.decide(ctx, k, j, &again)
			b.acquire(ctx, again, nil)
		}
		waiting = still
	}
	// The leases that outlived the wait: take them over.
	over := make(map[string]string, len(waiting))
	for _, k := range waiting {
		over[k] = b.seen[k]
		delete(b.seen, k)
	}
	b.acquire(ctx, waiting, over)
	for k := range b.seen {
		b.guards[k] = guard{} // a lease that came back while taking over
	}
}

// decide acts on what key k holds: a value or tombstone is its result; a
// value in place or a failure settles its guard; a miss joins missing (nil:
// settle it as a load without storing); a lease is joined if this process
// holds it, or else noted in seen.
func (b *batchLoad[T]) decide(ctx context.Context, k string, j judgement[T], missing *[]string) {
	c := b.c
	switch j.v {
	case vHit:
		j.r.from = fromRedis
		b.results[k], b.errs[k] = j.r, nil
	case vTombstone:
		b.errs[k] = ErrNotFound
	case vStale, vUndecodable:
		b.guards[k] = digestGuard(j)
	case vUnavailable:
		c.report(ctx, k, j.err)
		b.guards[k] = guard{}
	case vMiss:
		if missing != nil {
			*missing = append(*missing, k)
		} else {
			b.guards[k] = guard{}
		}
	case vLease:
		if j.lease != b.jobs[k].token {
			if other := c.loads.running(k, j.lease); other != nil {
				b.joins[k] = other
				return
			}
		}
		b.seen[k] = j.lease
	}
}

// acquire takes the leases of keys in one pipeline, taking over the lease
// over[k] where given. A key whose lease it took gets a lease guard; one
// that holds something else is decided on what it holds.
func (b *batchLoad[T]) acquire(ctx context.Context, keys []string, over map[string]string) {
	if len(keys) == 0 {
		return
	}
	c := b.c
	leases := make([]string, len(keys))
	for i, k := range keys {
		if over == nil && b.jobs[k].from.v == vMiss {
			leases[i] = b.jobs[k].token // the lease its readers join by
		} else {
			leases[i] = newLease()
		}
	}
	cmds := make([]*redis.Cmd, len(keys))
	errs := c.roundTripMany(ctx, "lease", keys, func(ctx context.Context, pipe redis.Pipeliner, i int, sha bool) redis.Cmder {
		cmds[i] = runScript(ctx, pipe, acquireScript, sha, keys[i], leases[i], c.leaseTTL().Milliseconds(), over[keys[i]])
		return cmds[i]
	})
	for i, k := range keys {
		switch err := errs[i]; {
		case err == redis.Nil:
			b.guards[k] = guard{kind: guardLease, value: leases[i]}
		case err != nil:
			c.report(ctx, k, err)
			b.guards[k] = guard{}
		default:
			// Something arrived since the read: decide on it, but do not
			// try to take a lease again.
			b.decide(ctx, k, c.judge(k, c.policy(k), reply{s: text(cmds[i]), left: -1}, true), nil)
		}
	}
}

// A pendingWrite is a guarded write of a batch.
type pendingWrite struct {
	key    string
	g      guard
	stored []byte
	ttl    time.Duration
	enc    encoded
}

// storeMany makes guarded writes in one pipeline, and returns the keys it
// wrote and the errors of those Redis failed (or whose breaker is open).
func (c *Cache[T]) storeMany(ctx context.Context, writes []pendingWrite) (wrote []string, failed map[string]error) {
	if len(writes) == 0 {
		return nil, nil
	}
	keys := make([]string, len(writes))
	for i, w := range writes {
		keys[i] = w.key
	}
	cmds := make([]*redis.Cmd, len(writes))
	errs := c.roundTripMany(ctx, "set", keys, func(ctx context.Context, pipe redis.Pipeliner, i int, sha bool) redis.Cmder {
		w := writes[i]
		cmds[i] = runScript(ctx, pipe, storeScript, sha, w.key, storeArgs(w.g, w.stored, w.ttl)...)
		return cmds[i]
	})
	for i, w := range writes {
		p := c.policy(w.key)
		if err := errs[i]; err != nil {
			if failed == nil {
				failed = make(map[string]error)
			}
			failed[w.key] = err
			continue
		}
		if n, _ := cmds[i].Int(); n == 0 {
			p.stats.superseded.Add(1)
			continue
		}
		p.stats.sets.Add(1)
		c.wrote(w.key)
		wrote = append(wrote, w.key)
	}
	return wrote, failed
}

// releaseMany releases the leases guards hold for keys, in one pipeline.
func (c *Cache[T]) releaseMany(ctx context.Context, keys []string, guards map[string]guard) {
	if len(keys) == 0 {
		return
	}
	errs := c.roundTripMany(ctx, "lease", keys, func(ctx context.Context, pipe redis.Pipeliner, i int, sha bool) redis.Cmder {
		return runScript(ctx, pipe, releaseScript, sha, keys[i], guards[keys[i]].value)
	})
	// As release does for one key: failures are reported; a lease not
	// released expires by itself.
	for i, err := range errs {
		if err != nil && !errors.Is(err, ErrCircuitOpen) {
			c.report(ctx, keys[i], err)
		}
	}
}

// runScript queues script on key in pipe: as EVALSHA, or as EVAL when
// sha is false (a node answered NOSCRIPT).
func runScript(ctx context.Context, pipe redis.Pipeliner, script *redis.Script, sha bool, key string, args ...any) *redis.Cmd {
	if sha {
		return script.EvalSha(ctx, pipe, []string{key}, args...)
	}
	return script.Eval(ctx, pipe, []string{key}, args...)
}

// text is a script's string reply.
func text(cmd *redis.Cmd) string {
	s, _ := cmd.Text()
	return s
}
