package packcache

import (
	"context"
	crand "crypto/rand"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/internal/breaker"
	"github.com/packcache/packcache/internal/singleflight"
)

// Leases: what a process remembers of the leases it may have placed
// without knowing it, and how a load takes one over. (What a lease is
// for, and the scripts that take, store over and release it: see
// FORMAT.md, section 2.2.) Then the guards: how a load stores only over
// its own lease, or over the value it began from, so that writes are
// never undone. How a read places a lease, and the guarded store, are
// Redis commands of a miss (roundtrip.go); how a load keeps its leases
// alive is the load's (loader.go).
//
// A lease lives for leaseBook.ttl, three Redis budgets, from when it is placed
// or last extended. The load that holds it extends it every budget while
// its loader runs (keeper), so a lease lives as long as its load; a lease
// whose holder stalled, died or gave up dies within leaseBook.ttl.

// tagged reports whether lease is one of this cache's (by its tag).
func (b *leaseBook) tagged(lease string) bool {
	return len(lease) == 17 && lease[1:9] == string(b.tag[:])
}

// placerPoll is how often a load waiting for the read that placed a lease
// of its cache to register its load (awaitPlacer) reads the key again.
const placerPoll = 20 * time.Millisecond

// awaitPlacer waits for the load that holds lease, one of this cache's
// found in job i's key, to be registered, and returns it if it may be
// joined. A read of this cache that found the lease may get there before
// the read that placed it has registered its load: that one is on its
// way, as the lease in Redis shows, and is joined rather than loaded
// beside without storing. It waits as long as the key holds the lease
// (reading it again every placerPoll), up to the lease's life, under ctx:
// not for a fixed time, since the placer's goroutine may wait long for a
// CPU on a busy machine. If the key comes to hold something else, or the
// placer has registered and ended (or a write detached it), it returns
// what the key then holds, to be decided on (changed).
func (l *loadRun) awaitPlacer(ctx context.Context, i int, lease string) (other *singleflight.Call[result], now judgement, changed bool) {
	j := &l.jobs[i]
	deadline := time.Now().Add(l.c.remote.leases.ttl)
	read := time.Now().Add(placerPoll)
	t := time.NewTimer(time.Millisecond)
	defer t.Stop()
	for {
		other, registered := l.c.loads.Placer(j.key, lease, j.cl)
		if other != nil {
			return other, judgement{}, false
		}
		if registered || !time.Now().Before(read) {
			jd := l.c.form.judge(j.key, j.p, l.c.fetchMany(ctx, []string{j.key})[0], true)
			if registered || jd.v != vLease || jd.lease != lease {
				return nil, jd, true
			}
			read = time.Now().Add(placerPoll)
		}
		if !time.Now().Before(deadline) {
			return nil, judgement{}, false
		}
		select {
		case <-ctx.Done():
			return nil, judgement{}, false
		case <-t.C:
		}
		t.Reset(time.Millisecond)
	}
}

// maybeRan reports whether a Redis call that failed with err may have run
// all the same: it was sent, and no reply came (the budget ran out, the
// connection broke). A refused call, a node's error reply and an open
// breaker did not run it.
func maybeRan(err error) bool {
	if err == nil || !errors.Is(err, ErrRedis) || errors.Is(err, ErrCircuitOpen) {
		return false
	}
	var re redis.Error
	if errors.As(err, &re) {
		return false
	}
	return !breaker.NotSent(err)
}

// A leaseBook is what a cache remembers of leases beyond a load: the tokens of
// leases it may have placed without knowing it, and the nodes that refuse
// the read that places one.
type leaseBook struct {
	tag   [8]byte        // the random part of this cache's lease tokens: see newToken
	ttl   time.Duration  // how long a lease lives unless its holder extends it: see init
	nodes *breaker.Nodes // the nodes, whose refusals of SET NX GET are kept

	mu sync.Mutex
	// unsure holds, by key, the token of a lease this process sent and
	// whose outcome it does not know (the call timed out: it may run when
	// Redis resumes), until the lease would have expired. A load of this
	// process that finds it takes it over at once, as its own.
	unsure map[string]unsureLease

	// noSetGet holds the nodes (by their breakers) that refused SET NX
	// GET with an error reply, with when to try it again (unix
	// nanoseconds): until then, reads of their keys are plain GETs and a
	// miss takes the lease by script. any says whether it holds any.
	noSetGet sync.Map // *breaker.Node -> int64
	any      atomic.Bool
}

// init draws the cache's lease tag. A lease lives three Redis budgets
// (redisTimeout) unless its holder extends it, so that one extension that
// fails or waits out its whole budget still leaves the lease a budget to
// live before the next.
func (b *leaseBook) init(nodes *breaker.Nodes, redisTimeout time.Duration) {
	crand.Read(b.tag[:])
	b.nodes, b.ttl = nodes, 3*redisTimeout
}

type unsureLease struct {
	token string
	until int64 // unix nanoseconds
}

// remember notes that key may hold this process's lease token, for as
// long as it would live.
func (l *leaseBook) remember(key, token string) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.unsure == nil {
		l.unsure = map[string]unsureLease{}
	}
	for k, u := range l.unsure { // few: one per stalled read or load
		if now.UnixNano() >= u.until {
			delete(l.unsure, k)
		}
	}
	l.unsure[key] = unsureLease{token: token, until: now.Add(l.ttl).UnixNano()}
}

// owns reports whether lease, found in key, is one this process sent
// without learning its outcome (see remember).
func (l *leaseBook) owns(key, lease string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	u, ok := l.unsure[key]
	return ok && u.token == lease && time.Now().UnixNano() < u.until
}

// forget forgets an unsure lease of key once this process has taken
// it over or released it.
func (l *leaseBook) forget(key, lease string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if u, ok := l.unsure[key]; ok && u.token == lease {
		delete(l.unsure, key)
	}
}

// dropLease releases, on a goroutine of its own, the lease a read sent for
// a caller that gave up before Redis answered: the read may have placed
// it, and no load holds it. It is remembered as this process's until the
// release tells it is gone (the read may yet land after the release).
func (r *remote) dropLease(ctx context.Context, key, lease string) {
	r.leases.remember(key, lease)
	if !r.life.TrySpawn() {
		return
	}
	go func() {
		defer r.life.Exit()
		var cmd *redis.Cmd
		err := r.roundTrip(context.WithoutCancel(ctx), "lease", key, r.pols.of(key), false, func(ctx context.Context) error {
			cmd = runScript(ctx, r.rdb, releaseScript, true, key, lease)
			if isNoScript(cmd.Err()) {
				cmd = runScript(ctx, r.rdb, releaseScript, false, key, lease)
			}
			return cmd.Err()
		})
		if err != nil {
			return // not tried (an open breaker), or failed: remembered
		}
		if n, _ := cmd.Int(); n == 1 {
			r.leases.forget(key, lease)
		}
	}()
}

// Writes are never undone. Once Set or Delete of a key returns, no load
// that began before it, in this process or any other, can leave its value
// in Redis; and no Get of this process that starts afterwards returns
// that load's value. Two mechanisms keep the first promise, one per state
// a load can begin from:
//
//   - A load that begins from a miss holds a lease in the key: the header
//     byte 0x0C and a token unique to the load. The read that found the
//     miss placed it: a Get with a loader reads with SET key lease NX GET
//     PX, which writes only where the key holds nothing and otherwise
//     returns what it holds (where a node refuses that command, the read
//     is a GET and the load places its lease by a script that writes it
//     only where the key holds nothing). The loader is called only once
//     the lease is in place, and its value is stored by a script that
//     writes it only if the key still holds that very lease. A Set or
//     Delete meanwhile, by anyone, replaces or removes the lease, and the
//     load's store is refused. A write that came before the lease was
//     placed came before the loader read the source, so the load's value
//     is as new as that write.
//   - A load that begins from a value still in place (a refresh, a stale
//     value past its TTL, a value this reader cannot decode) stores by a
//     script that compares the SHA-1 of what the key holds with that of
//     what the load began from, and checks that the key's TTL has not gone
//     up since (a write sets it anew). A write of this process detaches
//     the load, which then stores nothing. The one write this cannot tell
//     from no write is another process's rewrite of the very same bytes
//     with a TTL no higher than the one left (possible only with
//     TTLJitter, or for an undecodable value without expiry): the reload
//     may then replace it.
//
// The cost: none in round trips. A miss takes two, as a plain GET-then-SET
// does: the read that places the lease, and the store, a script. A hit is
// the one read, which writes nothing where the key holds a value
// (BenchmarkHitWithLease sets it beside a GET). The second promise, within
// this process, is changed's (write.go): a write detaches every read and load of the
// key under way from later callers.
//
// While a lease is in place, readers treat the key as "a load is in
// progress", never as data or as an error: a Get without a loader reports
// a miss; a Get with one joins this process's load if the lease is its
// own, or else loads without storing, or with WithLock waits for the
// other process's value (taking the lease over if it outlives the wait).
//
// A lease lives as long as its load (keeper, loader.go): its TTL is three Redis
// budgets, and the load extends it every budget while its loader runs. A
// lease whose holder stalled, died or gave up dies within three budgets of
// its last extension, and blocks stores of the key no longer.
//
// A read or an acquire that times out may still run when the node
// resumes, and leave a lease no load holds. Its load does not store over
// it: the loader was called before the lease was known to be in place,
// so a write between the two could be undone. The process remembers the
// token for as long as the lease could live, and its next load of the key
// that finds it takes it over at once (a new lease, then the loader),
// instead of loading without storing until it expires.

const (
	guardNone   guardKind = iota // store nothing: Redis is down, or another process holds the lease
	guardLease                   // store only if the key still holds our lease
	guardDigest                  // store only if the key still holds the value the load began from
)

// A guard says whether and how a load may store its value.
type guard struct {
	kind  guardKind
	value string // guardLease: the lease; guardDigest: the digest of the value the load began from

	// guardDigest: the value's time to live, in milliseconds, when the
	// load began (-1: unknown or unlimited). A write resets it upwards,
	// which tells a rewrite of identical bytes from the value left alone.
	maxPTTL int64
}

// digestGuard is the guard of a load that began from the value j judged.
func digestGuard(j judgement) guard {
	g := guard{kind: guardDigest, value: j.digest, maxPTTL: -1}
	if j.left > 0 {
		g.maxPTTL = j.left.Milliseconds() + 1
	}
	return g
}

type guardKind uint8

// acquireScript writes the lease ARGV[1] for ARGV[2] ms where the key holds
// nothing, or holds exactly the lease ARGV[3] being taken over, and returns
// nil; otherwise it returns what the key holds.
var acquireScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and (ARGV[3] == '' or v ~= ARGV[3]) then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false`)

// releaseScript deletes the key only if it holds the lease ARGV[1].
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

// acquireLeases places leases[i] on keys[i], in one pipeline, where the
// key holds nothing or exactly the lease olds[i] being taken over (""
// for none). A key's error is redis.Nil when its lease is in place; nil
// when it holds something else, which held[i] is; otherwise the Redis
// failure (see roundTripMany).
func (r *remote) acquireLeases(ctx context.Context, keys, leases, olds []string) (held []string, errs []error) {
	cmds := make([]*redis.Cmd, len(keys))
	errs = r.roundTripMany(ctx, "lease", keys, nil, true, func(ctx context.Context, pipe redis.Cmdable, i int, sha bool) redis.Cmder {
		cmds[i] = runScript(ctx, pipe, acquireScript, sha, keys[i], leases[i], r.leases.ttl.Milliseconds(), olds[i])
		return cmds[i]
	})
	held = make([]string, len(keys))
	for i, err := range errs {
		if err == nil {
			held[i], _ = cmds[i].Text()
		}
	}
	return held, errs
}
