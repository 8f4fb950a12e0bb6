package packcache

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
)

// Zstandard dictionaries (Policy.Dictionary, FORMAT.md section 3.6) are
// internal/dictset's: c.dicts holds them, decode calls its Decode, encode
// asks a policy's dictset.Writer whether it is Published, and a Set tells
// it when it found the dictionary Lost (remote.set). What is left here is
// how the set reaches Redis: through roundTrip, as every call, and which
// writes check that Redis holds the dictionary (dictCheck).

// dictCheck returns the dictionary key that a write of stored under key,
// under p, is to check in its own round trip, or "" for none. A value
// written with p's dictionary checks it, so that a writer learns within
// one write that Redis lost the dictionary (an eviction, a DEL, a
// restart) and publishes it again. The check is EXISTS, which costs Redis
// next to nothing and does not count as a use of the key for
// allkeys-lru; it rides in the write's pipeline only where the dictionary's
// key is on the node of the write: on a single node, or on a Cluster
// when both keys' slots are the same master's. Elsewhere (a Ring, a
// Cluster's other node, a client of another kind) it would be a call to
// another node on every write, and such writes rely on the writer's check
// once a second (dictset.Writer.Published).
func (r *remote) dictCheck(ctx context.Context, key string, p *policy, stored []byte) string {
	if p.dict == nil || len(stored) == 0 || stored[0] != codec.HeaderZstdDict {
		return "" // the policy writes with a dictionary only values with its header
	}
	dk := p.dict.Key()
	switch r.rdb.(type) {
	case *redis.Client:
		return dk
	case *redis.ClusterClient:
		if r.nodes.ForKey(ctx, dk) == r.nodes.ForKey(ctx, key) {
			return dk
		}
	}
	return ""
}

// dictRedis is the dictionary set's way to Redis for the reads and writes
// of keys under p (dictset.Redis).
type dictRedis struct {
	c *cache
	p *policy
}

// GetRange reads key under the cache's Redis budget and with its life's
// context, not a caller's: a fetch serves every read waiting for it.
func (r *dictRedis) GetRange(key string, start, end int64) ([]byte, error) {
	var b []byte
	err := r.c.remote.roundTrip(r.c.life.ctx, "get", key, r.p, true, func(ctx context.Context) (err error) {
		b, err = r.c.remote.rdb.GetRange(ctx, key, start, end).Bytes()
		return err
	})
	return b, redisCause(err)
}

// RunScript runs script on key, as a write of key.
func (r *dictRedis) RunScript(ctx context.Context, script *redis.Script, key string, args ...any) error {
	err := r.c.remote.roundTripMany(ctx, "set", []string{key}, nil, true, func(ctx context.Context, pipe redis.Cmdable, _ int, sha bool) redis.Cmder {
		return runScript(ctx, pipe, script, sha, key, args...)
	})[0]
	return redisCause(err)
}

// Failed reports whether err is a Redis failure (ErrRedis).
func (r *dictRedis) Failed(err error) bool { return errors.Is(err, ErrRedis) }

// redisCause is a roundTrip error for a dictionary's key without the
// *Error naming that key: the error returned names the value's key.
func redisCause(err error) error {
	var ke *Error
	if errors.As(err, &ke) {
		return ke.Err
	}
	return err
}

// lacksDictionary reports whether err, from decoding a value, says that
// the value may be sound but its dictionary cannot be had: such a value
// is kept.
func lacksDictionary(err error) bool {
	return errors.Is(err, codec.ErrUnknownDictionary) || errors.Is(err, ErrRedis)
}
