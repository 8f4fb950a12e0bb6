package packcache

import (
	"context"
	"testing"
	"time"

	"github.com/packcache/packcache/internal/redistest"
)

// TestProbeSendsGroupScript: a failover probe (failover.go) of an owed
// group's record sends InvalidateGroups's own script, as the ledger's
// retry through the client does (owedStore.Invalidate), not a plain DEL:
// the group sequence moves on with the record's deletion, so that a load
// that began before the invalidation cannot store afterwards. The probe
// is sent here to the node that owns the groups' slot, standing for a
// promoted replica.
func TestProbeSendsGroupScript(t *testing.T) {
	t.Parallel() // a cluster of its own
	cl := redistest.StartCluster(t, 3)
	rdb := cl.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := New[string](rdb, WithRedisTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Set(ctx, "probe:1", "v", InGroups("probed")); err != nil {
		t.Fatal(err)
	}
	before, _ := rdb.Get(ctx, groupSeqKey).Int64()
	owner, err := rdb.MasterForKey(ctx, groupSeqKey)
	if err != nil {
		t.Fatal(err)
	}
	rec := groupKey("probed")
	if n := rdb.Exists(ctx, rec).Val(); n != 1 {
		t.Fatalf("the group's record is missing before the probe")
	}
	// "elsewhere": the master the client's map names, which is not the
	// node probed.
	ran := c.core.remote.peers.invalidate(ctx, owner, "elsewhere:1", []string{rec}, []string{""}, []int{0})
	if len(ran) != 1 {
		t.Fatalf("the probe did not run on the slot's owner: ran %v", ran)
	}
	if n := rdb.Exists(ctx, rec).Val(); n != 0 {
		t.Errorf("the group's record is still there after the probe")
	}
	if after, _ := rdb.Get(ctx, groupSeqKey).Int64(); after != before+1 {
		t.Errorf("group sequence %d -> %d after the probe: it sent a plain DEL, not the invalidation script", before, after)
	}
	if _, err := c.Get(ctx, "probe:1"); err == nil {
		t.Errorf("the group's member is served after the probe's invalidation")
	}
}
