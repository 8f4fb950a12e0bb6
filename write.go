package packcache

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"time"
	"unsafe"

	"github.com/packcache/packcache/codec"
)

// marshal appends v's serialized form to dst. For raw T it returns v's
// own bytes, not a copy.
func (c *Cache[T]) marshal(dst []byte, v T) ([]byte, error) {
	if c.raw {
		return *(*[]byte)(unsafe.Pointer(&v)), nil
	}
	b, err := c.ser.Marshal(dst, &v)
	if err != nil {
		return dst, serializationErr(err)
	}
	return b, nil
}

// store serializes, frames and writes v. With keep, it returns a copy of
// the serialized value.
func (c *Cache[T]) store(ctx context.Context, key string, p *policy[T], v T, ttl time.Duration, keep bool) ([]byte, error) {
	sbuf, fbuf := getBuf(), getBuf()
	defer putBuf(sbuf)
	defer putBuf(fbuf)
	stored, payload, err := c.encode(ctx, key, p, v, sbuf, fbuf)
	if err != nil {
		return nil, err
	}
	if err := c.setRaw(ctx, key, stored, c.expiry(p, ttl)); err != nil {
		return nil, err
	}
	p.stats.sets.Add(1)
	if keep {
		return bytes.Clone(payload), nil
	}
	return nil, nil
}

// encode serializes v into sbuf and frames it into fbuf, returning the
// bytes to store and the serialized value.
func (c *Cache[T]) encode(ctx context.Context, key string, p *policy[T], v T, sbuf, fbuf *[]byte) (stored, payload []byte, err error) {
	payload, err = c.marshal((*sbuf)[:0], v)
	if err != nil {
		return nil, nil, keyErr("set", key, err)
	}
	if !c.raw {
		*sbuf = payload[:0]
	}
	if len(payload) > c.maxSize {
		return nil, nil, keyErr("set", key, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(payload), c.maxSize))
	}
	verbatim := (c.raw || c.ser.Text()) && codec.Plain(payload)
	plainLen := len(payload)
	if !verbatim {
		plainLen++
	}
	if (p.CompressAbove < 0 || len(payload) > p.CompressAbove) && p.Codec.ID() != codec.HeaderNone && len(payload) > 0 {
		out, cerr := codec.AppendValue((*fbuf)[:0], p.Codec, payload)
		if cerr == nil {
			*fbuf = out[:0]
			if len(out)+p.MinSaving <= plainLen {
				p.stats.wrote(p.Codec.ID(), len(payload), len(out))
				return out, payload, nil
			}
		} else {
			c.report(ctx, key, keyErr("set", key, cerr))
		}
	}
	if verbatim {
		p.stats.wrote(codec.HeaderNone, len(payload), len(payload))
		return payload, payload, nil
	}
	out, _ := codec.AppendValue((*fbuf)[:0], codec.None, payload) // None cannot fail
	*fbuf = out[:0]
	p.stats.wrote(codec.HeaderNone, len(payload), len(out))
	return out, payload, nil
}

// expiry applies the policy's jitter and stale window to a TTL.
func (c *Cache[T]) expiry(p *policy[T], ttl time.Duration) time.Duration {
	if ttl == NoExpiration {
		return ttl
	}
	if p.TTLJitter > 0 {
		ttl -= time.Duration(rand.Float64() * p.TTLJitter * float64(ttl))
		if ttl < time.Millisecond {
			ttl = time.Millisecond
		}
	}
	return ttl + p.StaleFor
}

// setRaw writes value under key. Every write the cache makes goes through
// setRaw or setMany, and both end the sharing of loader-less reads of the
// key begun before the write: such a read may have seen a miss, which later
// callers must not be given. (Reads with a loader need no such care: a
// load's store happens inside the very read they share.)
func (c *Cache[T]) setRaw(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	if err := c.rdb.Set(ctx, key, value, redisTTL(ttl)).Err(); err != nil {
		c.redisFailed(c.policy(key), err)
		return keyErr("set", key, redisErr(err))
	}
	c.breaker.success()
	c.lookups.forget(key)
	return nil
}

// redisTTL is ttl as go-redis takes it, where 0 means no expiry.
func redisTTL(ttl time.Duration) time.Duration {
	if ttl == NoExpiration {
		return 0
	}
	return ttl
}

// forget ends the sharing of any earlier read of key, so that this
// process's callers see a write it has just made.
func (c *Cache[T]) forget(key string) {
	c.lookups.forget(key)
	c.reads.forget(key)
}
