package packcache

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// lockKey names the lock of key. It keeps key's hash tag, if any, so the
// lock lives in key's slot on a cluster.
func lockKey(key string) string { return key + ":packcache-lock" }

var unlockScript = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) end return 0`)

func (c *Cache[T]) lock(ctx context.Context, key string) (token string, ok bool, err error) {
	var b [16]byte
	rand.Read(b[:])
	token = hex.EncodeToString(b[:])
	ok, err = c.rdb.SetNX(ctx, lockKey(key), token, c.lockLease).Result()
	return token, ok, err
}

func (c *Cache[T]) unlock(ctx context.Context, key, token string) {
	// Release only our own lock: after a lease ran out another process may
	// hold it.
	if err := unlockScript.Run(ctx, c.rdb, []string{lockKey(key)}, token).Err(); err != nil && err != redis.Nil {
		c.report(ctx, key, keyErr("unlock", key, redisErr(err)))
	}
}

// loadLocked loads key under the cross-process lock. If another process
// holds it, loadLocked waits for the value that process stores, polling
// with backoff; if the lock is released or expires with no value (its
// holder failed or died), it tries to take the lock again. It waits no
// longer than ctx allows.
func (c *Cache[T]) loadLocked(ctx context.Context, key string, p *policy[T], ld Loader[T], stale *result[T]) (result[T], error) {
	backoff := 2 * time.Millisecond
	waited := false
	for {
		token, ok, err := c.lock(ctx, key)
		if err != nil {
			c.redisFailed(p, err)
			c.report(ctx, key, keyErr("lock", key, redisErr(err)))
			return c.load(ctx, key, p, ld, stale, false)
		}
		if ok {
			r, err := c.load(ctx, key, p, ld, stale, true)
			c.unlock(ctx, key, token)
			return r, err
		}
		if !waited {
			waited = true
			p.stats.lockWaits.Add(1)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return result[T]{}, keyErr("load", key, ctx.Err())
		case <-t.C:
		}
		if backoff *= 2; backoff > 100*time.Millisecond {
			backoff = 100 * time.Millisecond
		}
		var r result[T]
		left, err := c.fetch(ctx, key, p, &r)
		switch {
		case err == nil && !p.expired(left):
			return r, nil
		case errors.Is(err, ErrNotFound):
			return result[T]{}, ErrNotFound
		case err != nil && errors.Is(err, ErrRedis):
			c.report(ctx, key, err)
			return c.load(ctx, key, p, ld, stale, false)
		}
	}
}
