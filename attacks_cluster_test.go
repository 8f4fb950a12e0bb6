package packcache_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/internal/redistest"
)

func nodeID(t *testing.T, c *redis.Client) string {
	id, err := c.Do(context.Background(), "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// A slot moves to a master that just joined: writes there are unseen until
// the near cache's follow() notices it (a 1 s ticker), longer than MaxLag.
func TestAdv2ClusterNewMaster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	ctx := ctxT(t)
	rdb := cl.Client(t)
	const lag = 100 * time.Millisecond
	c := mustNew[Channel](t, rdb, advNear(lag)...)
	other := cl.Client(t)
	key := "nm:k"
	if err := c.Set(ctx, key, Channel{ID: "old"}); err != nil {
		t.Fatal(err)
	}
	waitNear(t, c, key)

	d := redistest.Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000", "--cluster-announce-ip", "127.0.0.1")
	dc := d.Client(t)
	nodes := cl.Nodes()
	n0 := nodes[0].Client(t)
	_, dport, _ := strings.Cut(d.Addr(), ":")
	if err := n0.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", dport).Err(); err != nil {
		t.Fatal(err)
	}
	did := nodeID(t, dc)
	// wait until every node knows D
	for _, s := range nodes {
		sc := s.Client(t)
		for i := 0; ; i++ {
			out, _ := sc.Do(ctx, "CLUSTER", "NODES").Text()
			if strings.Contains(out, did) {
				break
			}
			if i > 200 {
				t.Fatal("D not known")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for i := 0; ; i++ {
		info, _ := dc.Do(ctx, "CLUSTER", "INFO").Text()
		if strings.Contains(info, "cluster_state:ok") {
			break
		}
		if i > 300 {
			t.Fatal("D never ok")
		}
		time.Sleep(20 * time.Millisecond)
	}
	src := cl.NodeForKey(t, key)
	sc := src.Client(t)
	srcID := nodeID(t, sc)
	slot, _ := rdb.ClusterKeySlot(ctx, key).Result()
	ss := strconv.FormatInt(slot, 10)
	must := func(cmd *redis.Cmd) {
		if err := cmd.Err(); err != nil {
			t.Fatal(cmd.Args(), err)
		}
	}
	must(dc.Do(ctx, "CLUSTER", "SETSLOT", ss, "IMPORTING", srcID))
	must(sc.Do(ctx, "CLUSTER", "SETSLOT", ss, "MIGRATING", did))
	must(sc.Do(ctx, "MIGRATE", "127.0.0.1", dport, "", 0, 5000, "KEYS", key))
	must(dc.Do(ctx, "CLUSTER", "SETSLOT", ss, "NODE", did))
	for _, s := range nodes {
		must(s.Client(t).Do(ctx, "CLUSTER", "SETSLOT", ss, "NODE", did))
	}
	moved := time.Now()
	// Read K again (now on D) into the near cache.
	waitNear(t, c, key)
	if err := other.Set(ctx, key, `{"id":"new"}`, 0).Err(); err != nil {
		t.Fatal(err)
	}
	wrote := time.Now()
	var staleAt []time.Duration
	for time.Since(wrote) < 3*time.Second {
		v, err := c.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if v.ID == "new" {
			break
		}
		staleAt = append(staleAt, time.Since(wrote))
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("slot moved to new master %v before the write; stale Gets after the write: %d, last at %v", wrote.Sub(moved), len(staleAt), func() any {
		if len(staleAt) == 0 {
			return 0
		}
		return staleAt[len(staleAt)-1]
	}())
	if len(staleAt) > 0 && staleAt[len(staleAt)-1] > lag+50*time.Millisecond {
		t.Fatalf("a Get begun %v after another client's write returned (MaxLag %v) saw the old value", staleAt[len(staleAt)-1], lag)
	}
}
