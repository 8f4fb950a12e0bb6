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
func (c *Cache[T]) encode(ctx context.Context, op, key string, p *policy[T], v T) (e encoded, err error) {
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
	if !c.raw {
		*sbuf = payload[:0]
	}
	if len(payload) > c.maxSize {
		e.release()
		return e, keyErr(op, key, &kindError{ErrTooLarge, fmt.Errorf("too large to store: %d bytes serialized, over the limit of %d (WithMaxValueSize)", len(payload), c.maxSize)})
	}
	e.payload = payload
	verbatim := (c.raw || c.ser.Text()) && codec.Plain(payload)
	plainLen := len(payload)
	if !verbatim {
		plainLen++
	}
	if p.compress && len(payload) > p.threshold && len(payload) > 0 {
		out, cerr := codec.AppendValue((*fbuf)[:0], p.codec, payload)
		if cerr == nil {
			*fbuf = out[:0]
			if len(out)+p.minSaving <= plainLen {
				p.stats.wrote(p.codec.ID(), len(payload), len(out))
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
func (c *Cache[T]) expiry(p *policy[T], ttl time.Duration) time.Duration {
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
// it can store its value afterwards (see lease.go).
func (c *Cache[T]) set(ctx context.Context, key string, p *policy[T], stored []byte, ttl time.Duration) error {
	err := c.roundTrip(ctx, "set", key, p, func(ctx context.Context) error {
		return c.rdb.Set(ctx, key, stored, redisTTL(ttl)).Err()
	})
	if err == nil {
		p.stats.sets.Add(1)
	}
	return err
}

// forget ends, in this process, the sharing of every read and load of key
// begun before a write of it: callers that come after the write start
// afresh, and see it.
func (c *Cache[T]) forget(key string) {
	c.lookups.forget(key)
	c.reads.forget(key)
	c.loads.forget(key)
	if c.nears != nil {
		c.invalidate([]string{key})
	}
}
