package packcache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/owed"
)

// A SetOption changes how one Set or SetMany stores its values.
type SetOption func(*setOptions)

type setOptions struct {
	ttl    time.Duration
	ttlSet bool
}

// SetTTL stores the value for d, or with no expiry for Off, instead of
// the key's policy's TTL (zero: the policy's). An invalid TTL fails the
// call.
func SetTTL(d time.Duration) SetOption {
	return func(o *setOptions) {
		if d != 0 { // zero: the policy's, as everywhere
			o.ttl, o.ttlSet = d, true
		}
	}
}

// setOne is Set, with value a *T.
func (c *cache) setOne(ctx context.Context, key string, value any, opts []SetOption) error {
	if err := c.life.begin(opSet, key); err != nil {
		return err
	}
	defer c.life.exit()
	p := c.policy(key)
	so := setOptions{ttl: p.ttl}
	for _, o := range opts {
		o(&so)
	}
	if err := checkTTL("SetTTL", so.ttl); err != nil {
		return keyErr("set", key, err)
	}
	e, err := c.encode(ctx, "set", key, p, value)
	if err != nil {
		return err
	}
	e.detach()
	defer e.release()
	w := owed.Write{Op: "set", Keys: []string{key}, Stored: [][]byte{e.stored}, TTL: so.ttl}
	return c.owed.Write(ctx, &w, func() []error {
		err := c.set(ctx, key, p, e.stored, c.expiry(p, so.ttl))
		c.changed(written, key)
		return []error{err}
	})[0]
}

// remove is Delete.
func (c *cache) remove(ctx context.Context, keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	if err := c.life.begin(opDelete, keys[0]); err != nil {
		return err
	}
	defer c.life.exit()
	defer c.changed(written, keys...)
	if len(keys) == 1 {
		return c.del(ctx, keys[0])
	}
	return c.delMany(ctx, keys)
}

func (c *cache) del(ctx context.Context, key string) error {
	w := owed.Write{Op: "delete", Keys: []string{key}}
	return c.owed.Write(ctx, &w, func() []error {
		return []error{c.roundTrip(ctx, "delete", key, c.policy(key), true, func(ctx context.Context) error {
			return c.rdb.Del(ctx, key).Err()
		})}
	})[0]
}

// marshal appends v's serialized form to dst. For raw T it returns v's
// own bytes, not a copy.
func (c *cache) marshal(dst []byte, v any) ([]byte, error) {
	if c.kind.raw {
		return c.kind.bytes(v), nil
	}
	if v == nil {
		v = c.kind.new() // T's zero value
	}
	b, err := c.ser.Marshal(dst, v)
	if err != nil {
		return dst, serializationErr(err)
	}
	return b, nil
}

// An encoded value is what one write stores: the bytes for Redis and the
// serialized value they hold, in pooled buffers that release returns.
type encoded struct {
	stored, payload []byte
	bufs            [2]*[]byte
}

func (e *encoded) release() {
	for _, b := range e.bufs {
		if b != nil {
			putBuf(b)
		}
	}
	e.bufs = [2]*[]byte{}
}

// detach gives e's bytes slices of their own and returns the pooled
// buffers, when the value is small: a write waits on the network, and
// twenty thousand small writes in flight must not each hold two pooled
// buffers sized for large values. Large values keep their buffers, which
// they fill.
func (e *encoded) detach() {
	if len(e.stored) > 4<<10 {
		return
	}
	e.stored = bytes.Clone(e.stored)
	e.payload = nil
	e.release()
}

// encode serializes v and frames it with the policy: compressed when its
// size is above the threshold and compression saves at least MinSaving
// bytes, otherwise plain (verbatim for text serializers, behind the none
// header otherwise). The caller releases the result.
//
// op names the call in errors: "set" for a write of the caller's, "load"
// for the store of a loaded value.
func (c *cache) encode(ctx context.Context, op, key string, p *policy, v any) (e encoded, err error) {
	var start time.Time
	if c.obs != nil {
		start = time.Now()
		defer func() {
			if err == nil {
				c.observeCodec(p, e.stored, len(e.payload), false, start)
			}
		}()
	}
	sbuf, fbuf := getBuf(), getBuf()
	e.bufs = [2]*[]byte{sbuf, fbuf}
	payload, err := c.marshal((*sbuf)[:0], v)
	if err != nil {
		e.release()
		return e, keyErr(op, key, err)
	}
	if !c.kind.raw {
		*sbuf = payload[:0]
	}
	if len(payload) > c.maxSize {
		e.release()
		return e, keyErr(op, key, &kindError{ErrTooLarge, fmt.Errorf("too large to store: %d bytes serialized, over the limit of %d (WithMaxValueSize)", len(payload), c.maxSize)})
	}
	e.payload = payload
	verbatim := (c.kind.raw || c.ser.Text()) && codec.Plain(payload)
	plainLen := len(payload)
	if !verbatim {
		plainLen++
	}
	if p.compress && len(payload) > p.threshold && len(payload) > 0 {
		cd := p.codec
		if p.dict != nil {
			ok, err := p.dict.Published(ctx, &p.dictRedis)
			if err != nil {
				c.report(ctx, key, keyErr(op, key, err))
			}
			if !ok {
				cd = p.undict // a value stored with a dictionary Redis may not hold could be unreadable elsewhere
			}
		}
		out, cerr := codec.AppendValue((*fbuf)[:0], cd, payload)
		if cerr == nil {
			*fbuf = out[:0]
			if len(out)+p.minSaving <= plainLen {
				p.stats.wrote(cd.ID(), len(payload), len(out))
				e.stored = out
				return e, nil
			}
		} else {
			c.report(ctx, key, keyErr(op, key, cerr))
		}
	}
	if verbatim {
		p.stats.wrote(codec.HeaderNone, len(payload), len(payload))
		e.stored = payload
		return e, nil
	}
	out, _ := codec.AppendValue((*fbuf)[:0], codec.None, payload) // None cannot fail
	*fbuf = out[:0]
	p.stats.wrote(codec.HeaderNone, len(payload), len(out))
	e.stored = out
	return e, nil
}

// expiry applies the policy's jitter and stale window to a TTL.
func (c *cache) expiry(p *policy, ttl time.Duration) time.Duration {
	if ttl == Off {
		return ttl
	}
	if p.jitter > 0 {
		ttl -= time.Duration(rand.Float64() * p.jitter * float64(ttl))
		if ttl < time.Millisecond {
			ttl = time.Millisecond
		}
	}
	return ttl + p.staleFor
}

// redisTTL is ttl as go-redis takes it, where 0 means no expiry.
func redisTTL(ttl time.Duration) time.Duration {
	if ttl == Off {
		return 0
	}
	return ttl
}

// set writes stored under key unconditionally: a write of the caller's,
// which overwrites any value and any lease, so that no load begun before
// it can store its value afterwards (see the leases below).
func (c *cache) set(ctx context.Context, key string, p *policy, stored []byte, ttl time.Duration) error {
	err := c.roundTrip(ctx, "set", key, p, true, func(ctx context.Context) error {
		return c.rdb.Set(ctx, key, stored, redisTTL(ttl)).Err()
	})
	if err == nil {
		inc(&p.stats.Sets)
	}
	return err
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
// this process, is changed's (near.go): a write detaches every read and load of the
// key under way from later callers.
//
// While a lease is in place, readers treat the key as "a load is in
// progress", never as data or as an error: a Get without a loader reports
// a miss; a Get with one joins this process's load if the lease is its
// own, or else loads without storing, or with WithLock waits for the
// other process's value (taking the lease over if it outlives the wait).
//
// A lease lives as long as its load (lease.go): its TTL is three Redis
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

const (
	guardNone   guardKind = iota // store nothing: Redis is down, or another process holds the lease
	guardLease                   // store only if the key still holds our lease
	guardDigest                  // store only if the key still holds the value the load began from
)

// acquireScript writes the lease ARGV[1] for ARGV[2] ms where the key holds
// nothing, or holds exactly the lease ARGV[3] being taken over, and returns
// nil; otherwise it returns what the key holds.
var acquireScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and (ARGV[3] == '' or v ~= ARGV[3]) then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false`)

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

// releaseScript deletes the key only if it holds the lease ARGV[1].
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

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

// acquireLeases places leases[i] on keys[i], in one pipeline, where the
// key holds nothing or exactly the lease olds[i] being taken over (""
// for none). A key's error is redis.Nil when its lease is in place; nil
// when it holds something else, which held[i] is; otherwise the Redis
// failure (see roundTripMany).
func (c *cache) acquireLeases(ctx context.Context, keys, leases, olds []string) (held []string, errs []error) {
	cmds := make([]*redis.Cmd, len(keys))
	errs = c.roundTripMany(ctx, "lease", keys, true, func(ctx context.Context, pipe redis.Cmdable, i int, sha bool) redis.Cmder {
		cmds[i] = runScript(ctx, pipe, acquireScript, sha, keys[i], leases[i], c.leaseTTL().Milliseconds(), olds[i])
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

// A pendingWrite is a guarded write of a load's value.
type pendingWrite struct {
	job    int // the load's job it stores for
	key    string
	g      guard
	stored []byte
	ttl    time.Duration
	enc    encoded
}

// errSuperseded is a guarded write refused because the key was written
// after the load began: the write won, as it must. It is not an error.
var errSuperseded = errors.New("packcache: superseded by a later write")

// storeGuarded makes guarded writes in one pipeline, and returns each
// one's error: nil when it wrote, errSuperseded when its guard no longer
// held, or a Redis failure.
func (c *cache) storeGuarded(ctx context.Context, writes []pendingWrite) []error {
	keys := make([]string, len(writes))
	for i, w := range writes {
		keys[i] = w.key
	}
	cmds := make([]*redis.Cmd, len(writes))
	errs := c.roundTripMany(ctx, "set", keys, true, func(ctx context.Context, pipe redis.Cmdable, i int, sha bool) redis.Cmder {
		w := writes[i]
		cmds[i] = runScript(ctx, pipe, storeScript, sha, w.key, storeArgs(w.g, w.stored, w.ttl)...)
		return cmds[i]
	})
	for i, w := range writes {
		if errs[i] != nil {
			continue
		}
		p := c.policy(w.key)
		if n, _ := cmds[i].Int(); n == 0 {
			inc(&p.stats.Superseded)
			errs[i] = errSuperseded
			continue
		}
		inc(&p.stats.Stores)
		c.changed(stored, w.key)
	}
	return errs
}

// releaseLeases removes leases[i] from keys[i], in one pipeline, where it
// is still there: the loads they stood for store nothing. Failures are
// reported; a lease not released expires by itself.
func (c *cache) releaseLeases(ctx context.Context, keys, leases []string) {
	if len(keys) == 0 {
		return
	}
	errs := c.roundTripMany(ctx, "lease", keys, true, func(ctx context.Context, pipe redis.Cmdable, i int, sha bool) redis.Cmder {
		return runScript(ctx, pipe, releaseScript, sha, keys[i], leases[i])
	})
	for i, err := range errs {
		if err != nil && !errors.Is(err, ErrCircuitOpen) {
			c.report(ctx, keys[i], err)
		}
	}
}

// runScript queues script on key in pipe (or runs it, on a client): as
// EVALSHA, or as EVAL when sha is false (a node answered NOSCRIPT).
func runScript(ctx context.Context, pipe redis.Cmdable, script *redis.Script, sha bool, key string, args ...any) *redis.Cmd {
	if sha {
		return script.EvalSha(ctx, pipe, []string{key}, args...)
	}
	return script.Eval(ctx, pipe, []string{key}, args...)
}
