package packcache_test

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
)

// TestSentinel runs a round trip through a Sentinel-managed master: the
// third kind of redis.UniversalClient the cache is for. The sentinel is
// redis-server in sentinel mode, started and stopped by this test.
func TestSentinel(t *testing.T) {
	t.Parallel()
	master := redistest.Start(t)
	saddr := redistest.StartSentinel(t, master, "packcache")
	ctx := ctxT(t)

	rdb := redis.NewUniversalClient(&redis.UniversalOptions{
		MasterName: "packcache", Addrs: []string{saddr}, ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { rdb.Close() })
	if _, ok := rdb.(*redis.Client); !ok {
		t.Fatalf("UniversalClient with MasterName is a %T, want a failover *redis.Client", rdb)
	}
	c := mustNew[Channel](t, rdb, packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
		return makeChannel(1, 50_000), nil
	})))
	want := makeChannel(1, 50_000)
	got, err := c.Get(ctx, "via:sentinel")
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("read-through Get via Sentinel: %v", err)
	}
	raw := master.Client(t).Get(ctx, "via:sentinel").Val()
	if !strings.HasPrefix(raw, "\x04") {
		t.Fatalf("value not stored zstd-compressed on the master: % x", raw[:4])
	}
}
