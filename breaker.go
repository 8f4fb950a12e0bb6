package packcache

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// A breaker stops calls from waiting on a Redis that keeps failing: after
// cfg.failures consecutive failures it opens for cfg.cooldown, then lets one
// call through to probe. The probe's success closes it; its failure opens it
// again.
type breaker struct {
	cfg       breakerConfig
	failures  atomic.Int64
	openUntil atomic.Int64 // unix nanoseconds; 0 when closed
	probeAt   atomic.Int64 // unix nanoseconds the probe began; 0 when none
}

// allow reports whether a call may try Redis.
func (b *breaker) allow() bool {
	until := b.openUntil.Load()
	if until == 0 {
		return true
	}
	now := time.Now().UnixNano()
	if now < until {
		return false
	}
	// Half open: one probe at a time. A probe that never reported (its
	// caller gave up first) is replaced after a cool-down.
	p := b.probeAt.Load()
	if p != 0 && now-p < int64(b.cfg.cooldown) {
		return false
	}
	return b.probeAt.CompareAndSwap(p, now)
}

func (b *breaker) success() {
	if b.failures.Load() != 0 {
		b.failures.Store(0)
	}
	if b.openUntil.Load() != 0 {
		b.openUntil.Store(0)
		b.probeAt.Store(0)
	}
}

func (b *breaker) failure() {
	if b.cfg.failures <= 0 {
		return
	}
	if n := b.failures.Add(1); n >= int64(b.cfg.failures) || b.openUntil.Load() != 0 {
		b.openUntil.Store(time.Now().Add(b.cfg.cooldown).UnixNano())
		b.probeAt.Store(0)
	}
}

// open reports whether the breaker is open now.
func (b *breaker) open() bool {
	until := b.openUntil.Load()
	return until != 0 && time.Now().UnixNano() < until
}

// redisFailed counts a failed Redis call and feeds the circuit breaker.
func (c *Cache[T]) redisFailed(p *policy[T], err error) {
	p.stats.redisErrors.Add(1)
	var re redis.Error
	if errors.As(err, &re) || errors.Is(err, context.Canceled) {
		// An error reply (WRONGTYPE, say) or a caller giving up says
		// nothing of Redis's health.
		return
	}
	c.breaker.failure()
}

func (c *Cache[T]) report(ctx context.Context, key string, err error) {
	if c.onError != nil {
		c.onError(ctx, key, err)
	}
}
