package packcache

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
)

// A verdict is what a stored value means to a reader.
type verdict uint8

const (
	vHit         verdict = iota // a value, decoded
	vStale                      // a value past its TTL, kept only for StaleFor
	vTombstone                  // a remembered ErrNotFound
	vLease                      // a load is in progress somewhere
	vMiss                       // nothing stored
	vUndecodable                // bytes this reader cannot decode
	vUnavailable                // Redis failed, or the node's breaker is open
)

// A judgement is a verdict with what the reader needs to act on it.
type judgement[T any] struct {
	v       verdict
	r       result[T]     // vHit and vStale: the value
	err     error         // vUndecodable and vUnavailable: why, as an *Error
	lease   string        // vLease: the lease value seen
	digest  string        // vStale, vUndecodable, and a vHit due for refresh: the stored bytes' SHA-1
	left    time.Duration // the value's time to live when read; -1 when unknown or unlimited
	refresh bool          // vHit: old enough for a background refresh
}

// judge is the one place that decides what a stored value means. It turns
// a Redis reply for key (s and err, and left, the time the value has to
// live, or -1 when unknown or unlimited) into a judgement, decoding the
// value. Get, GetOrLoad, GetMany, GetOrLoadMany and the loads all use it.
// readThrough says whether the caller has a loader: only then is a digest
// (for a guarded reload) or a refresh worth computing.
func (c *Cache[T]) judge(key string, p *policy[T], s string, err error, left time.Duration, readThrough bool) judgement[T] {
	switch {
	case err == redis.Nil:
		return judgement[T]{v: vMiss}
	case err != nil:
		return judgement[T]{v: vUnavailable, err: err}
	case len(s) == 1 && s[0] == codec.HeaderTombstone:
		return judgement[T]{v: vTombstone}
	case len(s) > 0 && s[0] == codec.HeaderLease:
		return judgement[T]{v: vLease, lease: s}
	}
	j := judgement[T]{left: left}
	if derr := c.decode(key, p, bytesOf(s), &j.r); derr != nil {
		p.stats.decodeErrors.Add(1)
		j.v, j.err = vUndecodable, derr
	} else if p.staleFor > 0 && left >= 0 && left <= p.staleFor {
		j.v = vStale
	} else {
		j.refresh = readThrough && p.refreshAfter > 0 && left >= 0 && p.ttl+p.staleFor-left >= p.refreshAfter
	}
	if readThrough && (j.v != vHit || j.refresh) {
		j.digest = digest(s)
	}
	return j
}

// digest is the SHA-1 of a stored value in hex, as Redis's redis.sha1hex
// computes it, for compare-and-set.
func digest(s string) string {
	sum := sha1.Sum(bytesOf(s))
	return hex.EncodeToString(sum[:])
}

// bytesOf views s as bytes without copying it. The string is a Redis reply
// that is ours alone and is only read: copying a value that may be
// megabytes would be waste.
func bytesOf(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// fetch reads key from Redis under the cache's time budget: the value, and
// with left the time it has to live when the policy needs it (-1
// otherwise, or when it has no expiry). It tells key's node's breaker what
// the read says of the node, and does not try a node whose breaker is
// open (err is then an ErrCircuitOpen).
func (c *Cache[T]) fetch(ctx context.Context, key string, p *policy[T]) (s string, left time.Duration, err error) {
	left = -1
	rctx, cancel, b, ok := c.op(ctx, key)
	defer cancel()
	if !ok {
		return "", left, circuitOpen("get", key)
	}
	if p.needsPTTL() {
		pipe := c.rdb.Pipeline()
		get := pipe.Get(rctx, key)
		pttl := pipe.PTTL(rctx, key)
		_, _ = pipe.Exec(rctx) // each command carries its own error
		s, err = get.Result()
		if err == nil {
			if d, perr := pttl.Result(); perr == nil && d > 0 {
				left = d
			}
		}
	} else {
		s, err = c.rdb.Get(rctx, key).Result()
	}
	b.feed(judgeRedis(ctx, err))
	if err != nil && err != redis.Nil {
		c.redisFailed(p, b, err)
		err = keyErr("get", key, redisErr(err))
	}
	return s, left, err
}

// budget returns the context for one Redis call made for ctx: ctx bounded
// by the cache's Redis time budget, unless ctx's own deadline comes first.
func (c *Cache[T]) budget(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= c.redisTimeout {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.redisTimeout)
}

// op prepares one Redis operation on key for ctx: the context bounded by
// the budget, which also bounds finding key's node (on a Cluster whose slot
// map the client has yet to load, that is itself a Redis call), and the
// node's breaker; ok is false when the breaker is open and the operation
// must not be tried. The caller calls cancel when the operation is done.
func (c *Cache[T]) op(ctx context.Context, key string) (rctx context.Context, cancel context.CancelFunc, b *breaker, ok bool) {
	rctx, cancel = c.budget(ctx)
	b = c.nodes.forKey(rctx, key)
	return rctx, cancel, b, b.allow()
}

// circuitOpen is the error of a call that did not try key's node because
// its breaker is open.
func circuitOpen(op, key string) error {
	return keyErr(op, key, &kindError{ErrRedis, ErrCircuitOpen})
}

// decode turns a stored value into a result, written into r: the caller's
// result lives where the shared work keeps it, so decoding into it costs
// no allocation of its own.
func (c *Cache[T]) decode(key string, p *policy[T], data []byte, r *result[T]) (err error) {
	*r = result[T]{}
	plain := 0 // the serialized value's size, for the observer and the near cache
	defer func() { r.size = plain }()
	if c.obs != nil {
		start := time.Now()
		defer func() {
			if err == nil {
				c.observeCodec(p, data, plain, true, start)
			}
		}()
	}
	if c.raw {
		// The caller owns what it gets: decompress into a new slice of
		// its own, and copy a plain value out of the Redis reply.
		b, err := codec.DecodeValue(nil, data, c.maxSize)
		if err != nil {
			return keyErr("get", key, err)
		}
		if codec.Plain(data) {
			b = bytes.Clone(b) // b is the reply itself
		} else if b == nil {
			b = []byte{}
		}
		plain = len(b)
		if c.perCaller {
			r.data = b // each caller copies it in deliver
			return nil
		}
		*(*[]byte)(unsafe.Pointer(&r.val)) = b
		return nil
	}
	var payload []byte
	if codec.Plain(data) || len(data) == 0 {
		// A plain value is its own payload: no buffer needed.
		var err error
		if payload, err = codec.DecodeValue(nil, data, c.maxSize); err != nil {
			return keyErr("get", key, err)
		}
	} else {
		buf := getBuf()
		defer putBuf(buf)
		var err error
		if payload, err = codec.DecodeValue((*buf)[:0], data, c.maxSize); err != nil {
			return keyErr("get", key, err)
		}
		if cap(payload) > cap(*buf) {
			*buf = payload[:0] // keep the grown buffer
		}
	}
	plain = len(payload)
	if c.perCaller {
		// Each caller decodes a copy of its own, later; decode one here
		// as well, so that a value the serializer cannot read is judged
		// undecodable now, and reloaded, rather than failing each caller.
		var probe T
		if err := c.ser.Unmarshal(payload, &probe); err != nil {
			return keyErr("get", key, serializationErr(err))
		}
		r.data = bytes.Clone(payload)
		if r.data == nil {
			r.data = []byte{}
		}
		return nil
	}
	if err := c.ser.Unmarshal(payload, &r.val); err != nil {
		return keyErr("get", key, serializationErr(err))
	}
	return nil
}

func (c *Cache[T]) unmarshal(data []byte, v *T) error {
	if c.raw {
		*(*[]byte)(unsafe.Pointer(v)) = bytes.Clone(data)
		return nil
	}
	if err := c.ser.Unmarshal(data, v); err != nil {
		return serializationErr(err)
	}
	return nil
}

// deliver counts a caller's outcome and gives it its value: its own copy
// when each caller decodes its own. shared says whether the caller shared
// work another began.
func (c *Cache[T]) deliver(key string, p *policy[T], r result[T], err error, shared bool) (T, error) {
	c.observeRead(p, r, err, shared || r.joined)
	switch {
	case err == nil:
		if r.from == fromLoader {
			p.stats.misses.Add(1)
		} else {
			p.stats.hits.Add(1)
		}
	case errors.Is(err, ErrMiss):
		p.stats.misses.Add(1)
	case errors.Is(err, ErrNotFound):
		p.stats.notFoundHits.Add(1)
	}
	if err != nil {
		var zero T
		return zero, err
	}
	if r.data == nil {
		return r.val, nil
	}
	var v T
	if err := c.unmarshal(r.data, &v); err != nil {
		return v, keyErr("get", key, err)
	}
	return v, nil
}
