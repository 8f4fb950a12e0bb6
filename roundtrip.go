package packcache

import (
	"context"
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/breaker"
	"github.com/packcache/packcache/internal/tracking"
)

// Every Redis call the cache makes goes through roundTrip (one key) or
// roundTripMany (a pipeline of keys, one round trip per node). They own,
// in one place, the rules of a call:
//
//   - the budget: the call's context ends WithRedisTimeout after it
//     begins, unless the caller's own deadline comes first;
//   - the breaker of the key's node: a node whose breaker is open is not
//     tried, and the call fails with ErrCircuitOpen;
//   - the NOSCRIPT retry of a pipelined script;
//   - the judgement of a failure: the caller's context ending is the
//     caller's own, never Redis's (it is returned as it is, not counted and
//     not told to the breaker); a refused connection opens the node's
//     breaker at once; anything else the node did wrong is one failure;
//   - the error: an *Error matching ErrRedis that names the key and the
//     cause (the refused dial, not only the budget running out);
//   - the counters and the observer.

// remote is the cache's Redis: the client, its nodes' circuit breakers
// (which also judge each call), a Cluster's node clients for retries
// that follow a failover, and what the cache remembers of its leases.
// Its methods are every call the cache makes, and the commands of a miss.
type remote struct {
	rdb          redis.UniversalClient
	nodes        *breaker.Nodes
	peers        peers     // failover.go
	leases       leaseBook // lease.go
	redisTimeout time.Duration
	tracker      *tracking.Tracker // the near caches' invalidation stream; TrackKeys reads go through it

	life *lifetime  // the cache's: a call waits for a slot until Close
	tel  *telemetry // failures are counted and observed
	pols *policies  // a batch's keys' policies, when the caller has not resolved them
}

// The operations Redis calls are made for, as errors name them. Reads
// ("get") begin work; the others finish it, and are given a turn at a
// node before reads (see breaker.Node.Enter).
const (
	opGet    = "get"
	opSet    = "set"
	opDelete = "delete"
	opLease  = "lease"
)

// roundTrip makes one Redis call, f, for key under ctx: op names it in
// errors ("get", "set", "delete", "lease"). f gets the budgeted context.
// The error is nil, redis.Nil, an *Error holding ctx's own error when ctx
// ended first (the call is then no failure of Redis's, and is not
// counted), or an *Error matching ErrRedis (and ErrCircuitOpen when key's
// node's breaker is open and it was not tried).
//
// The call first waits, under ctx alone, for one of the node's slots (see
// breaker.Node.Enter); its budget begins once it has one. A repeatable call (a
// read, or a write whose second copy changes nothing: SET, DEL; never a
// script whose reply tells what it did) that ran out of its budget while
// the node answered other calls (judged late: see judgeCall) is made
// again, each time with a budget of its own, for up to the load timeout
// or until ctx ends.
func (r *remote) roundTrip(ctx context.Context, op, key string, p *policy, repeatable bool, f func(context.Context) error) error {
	b := r.nodes.Find(ctx, key)
	slot, err := b.Enter(ctx, r.life.ctx.Done(), op != opGet)
	if err != nil {
		if err == breaker.ErrClosing {
			err = ErrClosed
		}
		return keyErr(op, key, err)
	}
	defer slot.Leave()
	var first time.Time
	for {
		if op != opInvalidate && !b.Allow() {
			return circuitOpen(op, key, b)
		}
		bud := r.nodes.Budget(ctx, b)
		if first.IsZero() {
			first = bud.Start()
		}
		o, err := judgeCall(ctx, bud, b, op, key, f(bud))
		bud.End()
		b.Feed(o)
		if o == breaker.Late && repeatable && r.life.ctx.Err() == nil && time.Since(first) < r.life.loadTimeout {
			// Redis is fine and the call can be made again: failing it
			// would send a read's surge, which this process cannot keep
			// up with, to the database, and make a write pending. The
			// caller waits under its own context.
			continue
		}
		if o == breaker.Failed || o == breaker.RefusedConn {
			r.redisFailed(p, b, err)
		}
		return err
	}
}

// redisFailed counts a failed Redis operation on key's prefix and tells the
// observer, with the node's address.
//
// On a Cluster it also asks go-redis to reload its map of the slots: a
// node that times out may have been replaced by its replica, which the
// map names only once reloaded (failover.go).
func (r *remote) redisFailed(p *policy, b *breaker.Node, err error) {
	atomic.AddUint64(&p.stats.RedisErrors, 1)
	r.peers.stale()
	if obs := r.tel.obs; obs != nil {
		obs.ObserveRedis(RedisEvent{Prefix: p.prefix, Node: b.Addr(), Err: err})
	}
}

// roundTripMany makes one pipeline of Redis calls, one round trip per node:
// queue adds key i's commands to pipe and returns the one whose error
// tells how key i fared (sha: as EVALSHA, else as EVAL, for scripts; it is
// called again with sha false for keys a node answered NOSCRIPT). Keys
// whose node's breaker is open are not sent. Each node's breaker is told
// once what the pipeline says of it. It returns each key's error, judged
// as roundTrip judges it.
//
// single says that queue sends one command per key: then a batch of one
// key is sent to the client as it is, through roundTrip, since a pipeline
// of one command costs allocations and saves no round trip. (A load of one
// key is a batch of one: its lease and its store are such commands.)
//
// ps, when not nil, holds the keys' policies, which the caller has
// resolved already (ps[i] is key i's); nil: they are looked up.
func (r *remote) roundTripMany(ctx context.Context, op string, keys []string, ps []*policy, single bool, queue func(ctx context.Context, pipe redis.Cmdable, i int, sha bool) redis.Cmder) []error {
	errs := make([]error, len(keys))
	switch {
	case len(keys) == 0:
		return errs
	case len(keys) == 1 && single:
		// A "set" (a plain SET, a store over a lease that also reports its
		// own bytes found in place, a dictionary's publication) or a
		// "delete" changes nothing when made twice: made again if late.
		repeatable := op == opSet || op == opDelete
		errs[0] = r.roundTrip(ctx, op, keys[0], r.policyOf(keys, ps, 0), repeatable, func(ctx context.Context) error {
			cmd := queue(ctx, r.rdb, 0, true)
			if isNoScript(cmd.Err()) {
				cmd = queue(ctx, r.rdb, 0, false)
			}
			return cmd.Err()
		})
		return errs
	}
	bud := r.nodes.Budget(ctx, nil)
	defer bud.End()
	nb := r.nodes.Batch(bud, keys)
	pipe := r.rdb.Pipeline()
	cmds := make([]redis.Cmder, len(keys))
	for i, k := range keys {
		if op != opInvalidate && !nb.Allowed(i) {
			errs[i] = circuitOpen(op, k, nb.Of(i))
			continue
		}
		cmds[i] = queue(bud, pipe, i, true)
	}
	if pipe.Len() > 0 {
		_, _ = pipe.Exec(bud) // each command carries its own error
		again := false
		for i, cmd := range cmds {
			if cmd != nil && isNoScript(cmd.Err()) {
				cmds[i] = queue(bud, pipe, i, false)
				again = true
			}
		}
		if again {
			_, _ = pipe.Exec(bud)
		}
	}
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		o, err := judgeCall(ctx, bud, nb.Of(i), op, keys[i], cmd.Err())
		nb.Saw(i, o)
		if o == breaker.Failed || o == breaker.RefusedConn {
			r.redisFailed(r.policyOf(keys, ps, i), nb.Of(i), err)
		}
		errs[i] = err
	}
	nb.Feed()
	return errs
}

// policyOf is key i's policy: ps[i], or looked up when ps is nil.
func (r *remote) policyOf(keys []string, ps []*policy, i int) *policy {
	if ps != nil {
		return ps[i]
	}
	return r.pols.of(keys[i])
}

// isNoScript reports a node's answer that it has not seen a script yet.
func isNoScript(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }

// judgeCall judges a call to node under bud (see breaker.Judge) and makes
// the error its caller gets: nil or redis.Nil as they are; the caller's
// own context's error, keyed; or an *Error matching ErrRedis that names
// the key and the cause.
func judgeCall(caller context.Context, bud *breaker.Budget, node *breaker.Node, op, key string, err error) (breaker.Outcome, error) {
	o, cause := breaker.Judge(caller, bud, node, err)
	switch {
	case err == nil || err == redis.Nil:
		return o, err
	case o == breaker.Neutral:
		return o, keyErr(op, key, cause)
	}
	return o, keyErr(op, key, redisErr(cause))
}

// circuitOpen is the error of a call that did not try key's node because
// its breaker, b, is open: it names the refused connection that opened
// it, if one did.
func circuitOpen(op, key string, b *breaker.Node) error {
	if cause := b.OpenCause(); cause != nil {
		return keyErr(op, key, &kindError{ErrRedis, &kindError{ErrCircuitOpen, cause}})
	}
	return keyErr(op, key, &kindError{ErrRedis, ErrCircuitOpen})
}

// The commands of a miss, in the order it sends them: the read of one
// key, which places a miss's lease (fetch, read, and the lease's helpers),
// and the guarded store of the loaded value (storeGuarded). The rest of
// the leases' life is in lease.go (what they are) and loader.go (how a
// load keeps them).

// fetch reads key from Redis (see roundTrip): the value, and its time to
// live when the policy needs it.
//
// A read with a loader (lease) is also a miss's lease: it reads with SET
// key lease NX GET PX leaseBook.ttl, which returns what the key holds and
// writes nothing, or, where the key holds nothing, places the lease and
// returns nil (rp.placed). So a miss costs this read and the store, two
// round trips, and a hit the one command, as a GET. A node that refuses
// the command (see setGetRefused) is read with a plain GET at once, in the
// same budget, and for setGetBackoff after; its misses take their lease
// by script.
func (r *remote) fetch(ctx context.Context, key string, p *policy, lease bool) reply {
	rp := reply{left: -1}
	if lease && r.leases.canSetGet(ctx, key) {
		rp.lease = r.leases.newToken()
	}
	rp.err = r.roundTrip(ctx, "get", key, p, true, func(ctx context.Context) error {
		err := r.read(ctx, key, p, &rp)
		if rp.lease != "" && setGetRefused(err) {
			r.leases.refuseSetGet(ctx, key)
			rp.lease = ""
			err = r.read(ctx, key, p, &rp)
		}
		return err
	})
	if rp.lease != "" && rp.err == nil && rp.s == rp.lease {
		// A try of this read that ran out of its budget while the node
		// answered (roundTrip makes such a read again) placed the lease:
		// it is this read's own.
		rp.s, rp.err = "", redis.Nil
	}
	rp.placed = rp.lease != "" && rp.err == redis.Nil
	return rp
}

// read reads key into rp in one round trip: with PTTL when the policy
// needs it, placing rp.lease where the key holds nothing when it is set.
func (r *remote) read(ctx context.Context, key string, p *policy, rp *reply) (err error) {
	var get *redis.StringCmd
	if rp.lease != "" {
		get = setGetCmd(ctx, key, rp.lease, r.leases.ttl)
	} else {
		get = redis.NewStringCmd(ctx, "get", key)
	}
	if !p.needsPTTL() {
		_ = r.rdb.Process(ctx, get)
		rp.s, err = get.Result()
		return err
	}
	pipe, rd := r.nearPipeline(ctx, key, p, rp) // under TrackKeys, a tracked connection's (near_keys.go)
	_ = pipe.Process(ctx, get)
	pttl := pipe.PTTL(ctx, key)
	rp.sent = time.Now()
	_, _ = pipe.Exec(ctx) // each command carries its own error
	if trackedEnd(rd, get, rp) {
		return r.read(ctx, key, p, rp) // again, on the client
	}
	if rp.s, err = get.Result(); err == nil {
		// Only with a value: where the read placed a lease, PTTL tells
		// the lease's time, never a value's.
		rp.left = ttlLeft(pttl)
	}
	return err
}

// ttlLeft turns a PTTL reply into a reply's left.
func ttlLeft(pttl *redis.DurationCmd) time.Duration {
	d, err := pttl.Result()
	switch {
	case err != nil:
		return 0 // unknown: take it as expiring now, so that it is kept nowhere
	case d == -1:
		return -1 // no expiry
	case d < 0:
		return 0 // gone between the GET and the PTTL
	}
	return d
}

// A lease's token is 8 random bytes drawn once per cache (leaseBook.tag)
// and a counter, so that a read that may place a lease makes its token
// with an atomic add, not a call to the system's random source, and a
// cache knows its own leases by their tag.
var leaseSeq atomic.Uint64

// newToken returns a fresh lease value: the lease header byte and a
// 16-byte token unique to this cache (its tag and a counter).
func (l *leaseBook) newToken() string {
	var b [17]byte
	b[0] = codec.HeaderLease
	copy(b[1:9], l.tag[:])
	binary.BigEndian.PutUint64(b[9:], leaseSeq.Add(1))
	return string(b[:])
}

// canSetGet reports whether reads of key may place a lease with SET NX
// GET: unless its node refused it within setGetBackoff. It costs one
// atomic load while no node has.
func (l *leaseBook) canSetGet(ctx context.Context, key string) bool {
	if !l.any.Load() {
		return true
	}
	v, ok := l.noSetGet.Load(l.nodes.ForKey(ctx, key))
	return !ok || time.Now().UnixNano() >= v.(int64)
}

// refuseSetGet notes that key's node refused SET NX GET.
func (l *leaseBook) refuseSetGet(ctx context.Context, key string) {
	l.noSetGet.Store(l.nodes.ForKey(ctx, key), time.Now().Add(setGetBackoff).UnixNano())
	l.any.Store(true)
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

// setGetCmd is SET key lease PX ttl NX GET: it returns what key holds and
// writes nothing, or, where key holds nothing, places lease and returns
// nil.
func setGetCmd(ctx context.Context, key, lease string, ttl time.Duration) *redis.StringCmd {
	return redis.NewStringCmd(ctx, "set", key, lease, "px", strconv.FormatInt(ttl.Milliseconds(), 10), "nx", "get")
}

// needsPTTL reports whether a read of a key under p must learn the time the
// value has to live: to tell a stale value or one due for refresh, and to
// cap a near-cache entry's life by it (Redis tells of an expiry only when
// it gets round to deleting the key).
func (p *policy) needsPTTL() bool {
	return p.refreshAfter > 0 || p.staleFor > 0 || p.near != nil
}

// A pendingWrite is a guarded write of a load's value.
type pendingWrite struct {
	job    int // the load's job it stores for
	key    string
	p      *policy // key's
	g      guard
	stored []byte
	ttl    time.Duration
	enc    encoded
	so     setOptions // what the loader chose for it (StoreWith)
}

// errSuperseded is a guarded write refused because the key was written
// after the load began: the write won, as it must. It is not an error.
var errSuperseded = errors.New("packcache: superseded by a later write")

// storeGuarded makes guarded writes in one pipeline, and returns each
// one's error: nil when it wrote (the caller tells the cache the key
// changed), errSuperseded when its guard no longer
// held, or a Redis failure.
func (r *remote) storeGuarded(ctx context.Context, writes []pendingWrite) []error {
	keys := make([]string, len(writes))
	ps := make([]*policy, len(writes))
	for i, w := range writes {
		keys[i], ps[i] = w.key, w.p
	}
	cmds := make([]*redis.Cmd, len(writes))
	errs := r.roundTripMany(ctx, "set", keys, ps, true, func(ctx context.Context, pipe redis.Cmdable, i int, sha bool) redis.Cmder {
		w := writes[i]
		cmds[i] = runScript(ctx, pipe, storeScript, sha, w.key, storeArgs(w.g, w.stored, w.ttl)...)
		return cmds[i]
	})
	for i, w := range writes {
		if errs[i] != nil {
			continue
		}
		p := w.p
		if n, _ := cmds[i].Int(); n == 0 {
			atomic.AddUint64(&p.stats.Superseded, 1)
			errs[i] = errSuperseded
			continue
		}
		atomic.AddUint64(&p.stats.Stores, 1)
	}
	return errs
}

// storeScript writes ARGV[3] (for ARGV[4] ms; 0: no expiry) only if the
// key holds the lease ARGV[2] (ARGV[1] = 'l') or a value whose SHA-1 is
// ARGV[2] (ARGV[1] = 'd') and, if ARGV[5] is not negative, whose time to
// live is at most ARGV[5] ms (a write in between would have set it
// anew); or if the key holds exactly ARGV[3] already, whose time to live
// it sets anew: so a store made again, after a first copy that ran but
// whose reply came too late, does what the first one did. It returns 1
// if it wrote, 0 if not.
var storeScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur ~= ARGV[3] then
  if ARGV[1] == 'l' then
    if cur ~= ARGV[2] then return 0 end
  elseif not cur or redis.sha1hex(cur) ~= ARGV[2] then
    return 0
  elseif tonumber(ARGV[5]) >= 0 and redis.call('PTTL', KEYS[1]) > tonumber(ARGV[5]) then
    return 0
  end
end
if ARGV[4] == '0' then
  redis.call('SET', KEYS[1], ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
end
return 1`)

// storeArgs are the arguments of storeScript for a guarded write.
func storeArgs(g guard, stored []byte, ttl time.Duration) []any {
	mode := "l"
	if g.kind == guardDigest {
		mode = "d"
	}
	ms := int64(0)
	if ttl != Off {
		ms = max(ttl.Milliseconds(), 1)
	}
	maxPTTL := int64(-1)
	if g.kind == guardDigest {
		maxPTTL = g.maxPTTL
	}
	return []any{mode, g.value, stored, ms, maxPTTL}
}

// runScript queues script on key in pipe (or runs it, on a client): as
// EVALSHA, or as EVAL when sha is false (a node answered NOSCRIPT).
func runScript(ctx context.Context, pipe redis.Cmdable, script *redis.Script, sha bool, key string, args ...any) *redis.Cmd {
	if sha {
		return script.EvalSha(ctx, pipe, []string{key}, args...)
	}
	return script.Eval(ctx, pipe, []string{key}, args...)
}
