package packcache_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
)

func advNear(lag time.Duration, opts ...packcache.Option) []packcache.Option {
	return append([]packcache.Option{packcache.WithShareWindow(packcache.Off), packcache.WithLocalCache(packcache.LocalCache{MaxBytes: 16 << 20, TTL: time.Minute, MaxLag: lag})}, opts...)
}

// Expiry: a key whose TTL passed is a miss for Redis GET; is it for the near cache?
func TestAdv2ExpiredServed(t *testing.T) {
	s := redistest.Start(t, "--enable-debug-command", "yes")
	redistest.RequireReal(t, s, "the near cache needs CLIENT TRACKING")
	ctx := ctxT(t)
	rdb := s.Client(t, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	c := mustNew[Channel](t, rdb, advNear(200*time.Millisecond)...)
	// Redis's active expiry is slow on a large keyspace; simulate it.
	if err := rdb.Do(ctx, "DEBUG", "SET-ACTIVE-EXPIRE", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "ex:k", Channel{ID: "short"}, packcache.SetTTL(300*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	waitNear(t, c, "ex:k")
	time.Sleep(time.Second)
	v, err := c.Get(ctx, "ex:k")
	if !errors.Is(err, packcache.ErrMiss) {
		n, _ := rdb.Exists(ctx, "ex:k").Result()
		t.Fatalf("700ms after its TTL ended Get returns %+v, %v; Redis EXISTS says %d", v.ID, err, n)
	}
}

// Keyspace ops onto a key: RENAME, COPY REPLACE, MOVE, RESTORE REPLACE, SORT STORE...
func TestAdv2KeyspaceOps(t *testing.T) {
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "the near cache needs CLIENT TRACKING")
	ctx := ctxT(t)
	rdb := s.Client(t, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	other := s.Client(t)
	c := mustNew[Channel](t, rdb, advNear(200*time.Millisecond)...)
	ops := map[string]func(key string){
		"RENAME": func(key string) { other.Set(ctx, "tmp", `{"id":"new"}`, 0); other.Rename(ctx, "tmp", key) },
		"COPY": func(key string) {
			other.Set(ctx, "tmp", `{"id":"new"}`, 0)
			if err := other.Do(ctx, "COPY", "tmp", key, "REPLACE").Err(); err != nil {
				t.Fatal(err)
			}
		},
		"MOVE-from-db1": func(key string) {
			other.Del(ctx, key)
			o1 := s.Client(t, func(o *redis.Options) { o.DB = 1 })
			o1.Set(ctx, key, `{"id":"new"}`, 0)
			o1.Move(ctx, key, 0)
		},
		"RESTORE": func(key string) {
			other.Set(ctx, "tmp", `{"id":"new"}`, 0)
			d, _ := other.Dump(ctx, "tmp").Result()
			other.RestoreReplace(ctx, key, 0, d)
		},
		"APPEND-SETRANGE": func(key string) { other.SetRange(ctx, key, 7, "new\"}   ") },
	}
	for name, op := range ops {
		key := "ks:" + name
		if err := c.Set(ctx, key, Channel{ID: "old"}); err != nil {
			t.Fatal(err)
		}
		waitNear(t, c, key)
		op(key)
		raw, _ := rdb.Get(ctx, key).Result()
		time.Sleep(600 * time.Millisecond)
		v, err := c.Get(ctx, key)
		if v.ID == "old" {
			t.Errorf("%s: Get still returns old after 3x MaxLag; Redis holds %q (err %v)", name, raw, err)
		}
	}
}

// A cache on DB 1: are writes in DB 1 seen?
func TestAdv2NonZeroDB(t *testing.T) {
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "the near cache needs CLIENT TRACKING")
	ctx := ctxT(t)
	rdb := s.Client(t, func(o *redis.Options) { o.ContextTimeoutEnabled = true; o.DB = 1 })
	other := s.Client(t, func(o *redis.Options) { o.DB = 1 })
	c := mustNew[Channel](t, rdb, advNear(200*time.Millisecond)...)
	c.Set(ctx, "d1:k", Channel{ID: "old"})
	waitNear(t, c, "d1:k")
	other.Set(ctx, "d1:k", `{"id":"new"}`, 0)
	time.Sleep(600 * time.Millisecond)
	v, err := c.Get(ctx, "d1:k")
	if v.ID != "new" {
		t.Fatalf("Get %+v %v", v, err)
	}
	// FLUSHDB of db 1
	waitNear(t, c, "d1:k")
	other.FlushDB(ctx)
	time.Sleep(600 * time.Millisecond)
	if v, err := c.Get(ctx, "d1:k"); !errors.Is(err, packcache.ErrMiss) {
		t.Fatalf("after FLUSHDB Get %+v %v", v, err)
	}
}
