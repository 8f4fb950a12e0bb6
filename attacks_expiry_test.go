package packcache_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
)

// No DEBUG: a keyspace of 200k keys with TTLs (a normal cache) makes Redis's
// active expiry take a long time to reach any one expired key.
func TestAdv2ExpiredServedRealistic(t *testing.T) {
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "the near cache needs CLIENT TRACKING")
	ctx := ctxT(t)
	rdb := s.Client(t, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	for b := 0; b < 200; b++ {
		p := rdb.Pipeline()
		for i := 0; i < 1000; i++ {
			p.Set(ctx, fmt.Sprintf("bulk:%d:%d", b, i), "x", time.Hour)
		}
		if _, err := p.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	c := mustNew[Channel](t, rdb, advNear(200*time.Millisecond)...)
	if err := c.Set(ctx, "ex:k", Channel{ID: "short"}, packcache.SetTTL(time.Second)); err != nil {
		t.Fatal(err)
	}
	waitNear(t, c, "ex:k")
	time.Sleep(4 * time.Second)
	v, err := c.Get(ctx, "ex:k")
	if !errors.Is(err, packcache.ErrMiss) {
		n, _ := rdb.Exists(ctx, "ex:k").Result()
		t.Fatalf("3 s after its 1 s TTL ended, Get returns %q, %v (near hits %d); Redis EXISTS: %d", v.ID, err, c.Stats().NearHits, n)
	}
}
