package packcache_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/internal/redistest"
)

// TestAdv2SentinelFailover: after a Sentinel failover, the near cache
// follows the new master: a write to it is seen within MaxLag.
func TestAdv2SentinelFailover(t *testing.T) {
	m := redistest.Start(t)
	host, mport, _ := strings.Cut(m.Addr(), ":")
	r := redistest.Start(t, "--replicaof", host, mport)
	saddr := redistest.StartSentinel(t, m, "pc")
	ctx := ctxT(t)
	sc := redis.NewSentinelClient(&redis.Options{Addr: saddr})
	defer sc.Close()
	for i := 0; ; i++ {
		reps, _ := sc.Replicas(ctx, "pc").Result()
		if len(reps) > 0 && strings.Contains(reps[0]["flags"], "slave") && !strings.Contains(reps[0]["flags"], "disconnected") {
			break
		}
		if i > 300 {
			t.Fatal("sentinel never saw the replica")
		}
		time.Sleep(50 * time.Millisecond)
	}
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "pc", SentinelAddrs: []string{saddr}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	other := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "pc", SentinelAddrs: []string{saddr}})
	t.Cleanup(func() { other.Close() })
	const lag = 200 * time.Millisecond
	c := mustNew[Channel](t, rdb, advNear(lag)...)
	key := "sf:k"
	if err := c.Set(ctx, key, Channel{ID: "old"}); err != nil {
		t.Fatal(err)
	}
	waitNear(t, c, key)
	if err := sc.Failover(ctx, "pc").Err(); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		a, _ := sc.GetMasterAddrByName(ctx, "pc").Result()
		if len(a) == 2 && a[0]+":"+a[1] == r.Addr() {
			break
		}
		if i > 400 {
			t.Fatal("no failover")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// wait until the new master accepts writes through the failover client
	for i := 0; ; i++ {
		if err := other.Set(ctx, "probe", "1", 0).Err(); err == nil {
			break
		}
		if i > 400 {
			t.Fatal("new master never writable")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	for round := 0; round < 3; round++ {
		// The old master may have resynchronised from the new one (and
		// lost the key meanwhile): write it again before near-caching it.
		if err := other.Set(ctx, key, `{"id":"before"}`, 0).Err(); err != nil {
			t.Fatal(err)
		}
		waitNear(t, c, key)
		want := "v" + string(rune('0'+round))
		if err := other.Set(ctx, key, `{"id":"`+want+`"}`, 0).Err(); err != nil {
			t.Fatal(err)
		}
		wrote := time.Now()
		var last time.Duration
		for time.Since(wrote) < 20*time.Second {
			v, err := c.Get(ctx, key)
			if err == nil && v.ID == want {
				break
			}
			last = time.Since(wrote)
			time.Sleep(5 * time.Millisecond)
		}
		info, _ := m.Client(t).Info(context.Background(), "replication").Result()
		role := "?"
		for _, l := range strings.Split(info, "\n") {
			if strings.HasPrefix(l, "role:") || strings.HasPrefix(l, "master_link_status") {
				role += " " + strings.TrimSpace(l)
			}
		}
		t.Logf("round %d: last stale Get %v after the write; old master: %s", round, last, role)
		if last > lag+50*time.Millisecond {
			t.Errorf("after failover, a write to the new master unseen for %v", last)
		}
	}
	cl, _ := m.Client(t).ClientList(ctx).Result()
	t.Logf("old master clients:\n%s", cl)
}
