package packcache

import (
	"context"
	"crypto/rand"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
)

// Writes are never undone. Once Set or Delete of a key returns, no load
// that began before it, in this process or any other, can leave its value
// in Redis; and no Get of this process that starts afterwards returns
// that load's value. Two mechanisms keep the first promise, one per state
// a load can begin from:
//
//   - A load that begins from a miss first writes a lease in the key: the
//     header byte 0x0C and a random token (SET with PX, by a script that
//     writes it only where the key holds nothing). The loader is called
//     only once the lease is in place, and its value is stored by a script
//     that writes it only if the key still holds that very lease. A Set
//     or Delete meanwhile, by anyone, replaces or removes the lease, and
//     the load's store is refused. A write that came before the lease was
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
// The cost: a miss takes one more round trip (the lease) than a plain
// GET-then-SET, and the final write is a script; a hit costs nothing
// more. The second promise, within this process, is forget's: a write
// detaches every read and load of the key under way from later callers.
//
// While a lease is in place, readers treat the key as "a load is in
// progress", never as data or as an error: a Get without a loader reports
// a miss; a Get with one joins this process's load if the lease is its
// own, or else loads without storing, or with WithLock waits for the
// other process's value (taking the lease over if it outlives the wait).
//
// A lease lives for the load timeout plus two Redis budgets, so that a
// load that ends within its timeout can always store; the lease of a
// process that died mid-load blocks stores of the key for that long.

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
func digestGuard[T any](j judgement[T]) guard {
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

// newLease returns a fresh lease value: the lease header byte and 16
// random bytes.
func newLease() string {
	var b [17]byte
	b[0] = codec.HeaderLease
	rand.Read(b[1:])
	return string(b[:])
}

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
// anew). It returns 1 if it wrote, 0 if not.
var storeScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if ARGV[1] == 'l' then
  if cur ~= ARGV[2] then return 0 end
elseif not cur or redis.sha1hex(cur) ~= ARGV[2] then
  return 0
elseif tonumber(ARGV[5]) >= 0 and redis.call('PTTL', KEYS[1]) > tonumber(ARGV[5]) then
  return 0
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

func (c *Cache[T]) leaseTTL() time.Duration { return c.loadTimeout + 2*c.redisTimeout }

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
func (c *Cache[T]) acquireLeases(ctx context.Context, keys, leases, olds []string) (held []string, errs []error) {
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
func (c *Cache[T]) storeGuarded(ctx context.Context, writes []pendingWrite) []error {
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
			p.stats.superseded.Add(1)
			errs[i] = errSuperseded
			continue
		}
		p.stats.sets.Add(1)
		c.wrote(w.key)
	}
	return errs
}

// wrote ends the sharing of loader-less reads of key begun before a store
// of a load's value: such a read may have found the key missing, which
// later callers must not be given. (Reads with a loader that found it
// missing share the very load that stored.)
func (c *Cache[T]) wrote(key string) {
	c.lookups.forget(key)
	if c.nears != nil {
		c.invalidate([]string{key})
	}
}

// releaseLeases removes leases[i] from keys[i], in one pipeline, where it
// is still there: the loads they stood for store nothing. Failures are
// reported; a lease not released expires by itself.
func (c *Cache[T]) releaseLeases(ctx context.Context, keys, leases []string) {
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
