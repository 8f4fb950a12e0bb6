package packcache

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/breaker"
)

// Leases: how long they live, how their holder keeps them alive, how a
// read places one, and what a process remembers of the leases it may have
// placed without knowing it. (What a lease is for, and the scripts that
// take, store over and release it: see FORMAT.md, section 2.2.)
//
// A lease lives for leaseTTL, three Redis budgets, from when it is placed
// or last extended. The load that holds it extends it every budget while
// its loader runs (keeper), so a lease lives as long as its load; a lease
// whose holder stalled, died or gave up dies within leaseTTL.

// leaseTTL is how long a lease lives unless its holder extends it: three
// Redis budgets, so that one extension that fails or waits out its whole
// budget still leaves the lease a budget to live before the next.
func (c *cache) leaseTTL() time.Duration { return 3 * c.redisTimeout }

// A lease's token is 8 random bytes drawn once per cache (leaseBook.tag)
// and a counter, so that a read that may place a lease makes its token
// with an atomic add, not a call to the system's random source, and a
// cache knows its own leases by their tag.
var leaseSeq atomic.Uint64

// newLease returns a fresh lease value: the lease header byte and a
// 16-byte token unique to this cache (its tag and a counter).
func (c *cache) newLease() string {
	var b [17]byte
	b[0] = codec.HeaderLease
	copy(b[1:9], c.leases.tag[:])
	binary.BigEndian.PutUint64(b[9:], leaseSeq.Add(1))
	return string(b[:])
}

// tagged reports whether lease is one of this cache's (by its tag).
func (c *cache) tagged(lease string) bool {
	return len(lease) == 17 && lease[1:9] == string(c.leases.tag[:])
}

// placerWait bounds how long a load waits for the read that placed a
// lease of its cache to register its load (see awaitPlacer).
const placerWait = 100 * time.Millisecond

// awaitPlacer waits, for up to placerWait (or a Redis budget, if
// shorter), for the load that holds lease, one of this cache's, to be
// registered, and returns it if it may be joined; nil if none is, or if
// the one registered may not be joined (a write detached it, or it has
// ended). A read of this cache that found the lease may get there before
// the read that placed it has registered its load: that one is on its
// way, as the lease in Redis shows, and is joined rather than loaded
// beside without storing.
func (l *loadRun) awaitPlacer(ctx context.Context, key, lease string, self *call[result]) *call[result] {
	deadline := time.Now().Add(min(l.c.redisTimeout, placerWait))
	t := time.NewTimer(time.Millisecond)
	defer t.Stop()
	for {
		if other, registered := l.c.loads.placer(key, lease, self); registered {
			return other
		}
		if !time.Now().Before(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		t.Reset(time.Millisecond)
	}
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
	c            *cache
	ctx          context.Context // the load's
	keys, leases []string

	mu      sync.Mutex
	stopped bool
	t       *time.Timer
}

// keepLeases starts a keeper of leases on keys for the load whose
// context is ctx; it takes keys and leases as its own.
func (c *cache) keepLeases(ctx context.Context, keys, leases []string) *keeper {
	k := &keeper{c: c, ctx: ctx, keys: keys, leases: leases}
	k.mu.Lock()
	k.t = time.AfterFunc(c.redisTimeout, k.extend)
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
	c := k.c
	if stopped || k.ctx.Err() != nil || !c.life.trySpawn() {
		return
	}
	defer c.life.exit()
	keys, leases := k.keys, k.leases
	cmds := make([]*redis.Cmd, len(keys))
	ms := c.leaseTTL().Milliseconds()
	errs := c.roundTripMany(context.WithoutCancel(k.ctx), "lease", keys, true, func(ctx context.Context, pipe redis.Cmdable, i int, sha bool) redis.Cmder {
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
		k.t.Reset(c.redisTimeout)
	}
	k.mu.Unlock()
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
	tag [8]byte // the random part of this cache's lease tokens: see newLease

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

// init draws the cache's lease tag.
func (b *leaseBook) init() { crand.Read(b.tag[:]) }

type unsureLease struct {
	token string
	until int64 // unix nanoseconds
}

// remember notes that key may hold this process's lease token, for as
// long as it would live.
func (c *cache) rememberLease(key, token string) {
	now := time.Now()
	l := &c.leases
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
	l.unsure[key] = unsureLease{token: token, until: now.Add(c.leaseTTL()).UnixNano()}
}

// ownsLease reports whether lease, found in key, is one this process sent
// without learning its outcome (see rememberLease).
func (c *cache) ownsLease(key, lease string) bool {
	l := &c.leases
	l.mu.Lock()
	defer l.mu.Unlock()
	u, ok := l.unsure[key]
	return ok && u.token == lease && time.Now().UnixNano() < u.until
}

// forgetLease forgets an unsure lease of key once this process has taken
// it over or released it.
func (c *cache) forgetLease(key, lease string) {
	l := &c.leases
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
func (c *cache) dropLease(ctx context.Context, key, lease string) {
	c.rememberLease(key, lease)
	if !c.life.trySpawn() {
		return
	}
	go func() {
		defer c.life.exit()
		var cmd *redis.Cmd
		err := c.roundTrip(context.WithoutCancel(ctx), "lease", key, c.policy(key), false, func(ctx context.Context) error {
			cmd = runScript(ctx, c.rdb, releaseScript, true, key, lease)
			if isNoScript(cmd.Err()) {
				cmd = runScript(ctx, c.rdb, releaseScript, false, key, lease)
			}
			return cmd.Err()
		})
		if err != nil {
			return // not tried (an open breaker), or failed: remembered
		}
		if n, _ := cmd.Int(); n == 1 {
			c.forgetLease(key, lease)
		}
	}()
}

// setGetBackoff is how long a node that refused SET NX GET is read with
// GET before it is tried again: it may have been under maxmemory, or
// replaced by a newer server.
const setGetBackoff = time.Second

// setGetRefused reports whether err is a node's error reply to SET NX GET
// that a plain GET would not get: a server older than 7.0 (a syntax
// error), a write refused under maxmemory with noeviction (OOM), an ACL
// that allows reads only (NOPERM), a read-only replica (READONLY). Replies
// that say the node cannot serve at all (LOADING, CLUSTERDOWN, ...) are
// failures, not refusals, and WRONGTYPE is the key's, not the node's.
func setGetRefused(err error) bool {
	if err == nil || err == redis.Nil {
		return false // a hit or a miss: the common case, without errors.As
	}
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	if strings.HasPrefix(re.Error(), "WRONGTYPE") {
		return false // the key's own: a GET gets it too
	}
	return !breaker.Unavailable(re)
}

// canSetGet reports whether reads of key may place a lease with SET NX
// GET: unless its node refused it within setGetBackoff. It costs one
// atomic load while no node has.
func (c *cache) canSetGet(ctx context.Context, key string) bool {
	if !c.leases.any.Load() {
		return true
	}
	v, ok := c.leases.noSetGet.Load(c.nodes.ForKey(ctx, key))
	return !ok || time.Now().UnixNano() >= v.(int64)
}

// refuseSetGet notes that key's node refused SET NX GET.
func (c *cache) refuseSetGet(ctx context.Context, key string) {
	c.leases.noSetGet.Store(c.nodes.ForKey(ctx, key), time.Now().Add(setGetBackoff).UnixNano())
	c.leases.any.Store(true)
}

// setGetCmd is SET key lease PX ttl NX GET: it returns what key holds and
// writes nothing, or, where key holds nothing, places lease and returns
// nil.
func setGetCmd(ctx context.Context, key, lease string, ttl time.Duration) *redis.StringCmd {
	return redis.NewStringCmd(ctx, "set", key, lease, "px", strconv.FormatInt(ttl.Milliseconds(), 10), "nx", "get")
}
