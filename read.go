package packcache

import (
	"bytes"
	"context"
	"errors"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
)

func (c *Cache[T]) get(ctx context.Context, key string, p *policy[T], ld Loader[T]) (T, error) {
	f := flight[T]{c: c, key: key, p: p, ld: ld}
	if !c.coalesce {
		var r result[T]
		err := lookup(ctx, f, &r)
		return c.deliver(key, p, r, err)
	}
	g := &c.lookups
	if ld != nil {
		g = &c.reads
	}
	r, err, shared := g.do(ctx, key, f, c.lookupFn)
	if shared {
		p.stats.coalescedWaits.Add(1)
	}
	return c.deliver(key, p, r, err)
}

// deliver counts a caller's outcome and gives it its value.
func (c *Cache[T]) deliver(key string, p *policy[T], r result[T], err error) (T, error) {
	switch {
	case err == nil:
		if r.from == fromRedis {
			p.stats.hits.Add(1)
		} else {
			p.stats.misses.Add(1)
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

// lookup is the work one Get does, shared by the callers that coalesce: read
// Redis and decode into r; on a miss or an undecodable value, load and
// store.
func lookup[T any](ctx context.Context, f flight[T], r *result[T]) error {
	c, key, p, ld := f.c, f.key, f.p, f.ld
	redisUp := c.breaker.allow()
	if redisUp {
		left, err := c.fetch(ctx, key, p, r)
		switch {
		case err == nil:
			if p.expired(left) {
				if ld == nil {
					*r = result[T]{}
					return ErrMiss
				}
				s := *r
				f.stale = &s
				break
			}
			if ld != nil && p.RefreshAfter > 0 && left >= 0 && p.TTL+p.StaleFor-left >= p.RefreshAfter {
				c.refresh(ctx, key, p, ld)
			}
			return nil
		case errors.Is(err, ErrMiss):
			if ld == nil {
				return ErrMiss
			}
		case errors.Is(err, ErrNotFound):
			return ErrNotFound
		case errors.Is(err, ErrRedis):
			if ld == nil || c.strict {
				return err
			}
			c.report(ctx, key, err)
			redisUp = false
		default: // undecodable
			if ld == nil {
				return err
			}
			c.report(ctx, key, err)
		}
	} else {
		if ld == nil || c.strict {
			return keyErr("get", key, &kindError{ErrRedis, ErrCircuitOpen})
		}
	}
	f.redisUp = redisUp
	if !c.coalesce {
		return loadFlight(ctx, f, r)
	}
	// The load runs detached from this caller, who may leave, while the
	// callers sharing this read, and later ones, wait for it.
	var err error
	*r, err, _ = c.loads.start(ctx, key, detach(ctx, c.closed, c.timeout), f, c.loadFlightFn)
	return err
}

// fetch reads key from Redis and decodes it into r. left is the time the
// value has to live, or -1 when it was not asked for or the value has no
// expiry.
func (c *Cache[T]) fetch(ctx context.Context, key string, p *policy[T], r *result[T]) (left time.Duration, err error) {
	left = -1
	var s string
	if p.RefreshAfter > 0 || p.StaleFor > 0 {
		pipe := c.rdb.Pipeline()
		get := pipe.Get(ctx, key)
		pttl := pipe.PTTL(ctx, key)
		pipe.Exec(ctx) // each command carries its own error
		s, err = get.Result()
		if err == nil {
			if d, perr := pttl.Result(); perr == nil && d > 0 {
				left = d
			}
		}
	} else {
		s, err = c.rdb.Get(ctx, key).Result()
	}
	if err != nil {
		if err == redis.Nil {
			c.breaker.success()
			return left, ErrMiss
		}
		c.redisFailed(p, err)
		return left, keyErr("get", key, redisErr(err))
	}
	c.breaker.success()
	return left, c.view(key, p, s, r)
}

// view decodes a Redis reply into r: ErrNotFound for a tombstone, a
// counted decode error for a value it cannot decode.
func (c *Cache[T]) view(key string, p *policy[T], s string, r *result[T]) error {
	// The string is ours alone and is only read: view it as bytes rather
	// than copy a value that may be megabytes.
	data := unsafe.Slice(unsafe.StringData(s), len(s))
	if len(data) == 1 && data[0] == tombstone {
		return ErrNotFound
	}
	err := c.decode(key, data, r)
	if err != nil {
		p.stats.decodeErrors.Add(1)
	}
	return err
}

// decode turns a stored value into a result, written into r: the caller's
// result lives where the shared work keeps it, so decoding into it costs
// no allocation of its own.
func (c *Cache[T]) decode(key string, data []byte, r *result[T]) error {
	*r = result[T]{}
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
		if c.perCaller {
			r.data = b // each caller copies it in deliver
			return nil
		}
		*(*[]byte)(unsafe.Pointer(&r.val)) = b
		return nil
	}
	buf := getBuf()
	defer putBuf(buf)
	payload, err := codec.DecodeValue((*buf)[:0], data, c.maxSize)
	if err != nil {
		return keyErr("get", key, err)
	}
	if !codec.Plain(data) && cap(payload) > cap(*buf) {
		// Keep the grown buffer. (A plain payload is the Redis reply
		// itself, which must never reach the pool.)
		*buf = payload[:0]
	}
	if c.perCaller {
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
