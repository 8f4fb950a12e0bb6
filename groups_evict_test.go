package packcache_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
)

// Groups whose state Redis loses (issue 34): whatever Redis loses of
// {packcache:g} (the sequence alone, as allkeys-lru evicts it first; or
// every key, as a restart of the groups' node loses them), no value
// stored in a group before an invalidation of it is current afterwards,
// for any cache (another process, its near cache, one started after the
// loss), whether the next write into the group is a Set, a SetMany or a
// load; and a load right after the loss calls its loader once.

const (
	seqKey    = "{packcache:g}seq"
	groupsTag = "{packcache:g}"
)

// groupStateKeys lists the keys under the groups' hash tag, on every
// master of a Cluster (they share one slot, so one node).
func groupStateKeys(ctx context.Context, t *testing.T, rdb redis.UniversalClient) []string {
	t.Helper()
	var keys []string
	scan := func(ctx context.Context, c *redis.Client) error {
		ks, err := c.Keys(ctx, groupsTag+"*").Result()
		keys = append(keys, ks...)
		return err
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		var mu sync.Mutex // ForEachMaster calls it on each master at once
		err = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return scan(ctx, n)
		})
	case *redis.Client:
		err = scan(ctx, c)
	default:
		t.Fatalf("client %T", rdb)
	}
	if err != nil {
		t.Fatalf("KEYS %s*: %v", groupsTag, err)
	}
	return keys
}

// deleteGroupState deletes, through the raw client, the sequence alone
// (all false) or every key under the groups' hash tag.
func deleteGroupState(ctx context.Context, t *testing.T, rdb redis.UniversalClient, all bool) {
	t.Helper()
	keys := []string{seqKey}
	if all {
		keys = groupStateKeys(ctx, t, rdb)
	}
	if len(keys) == 0 {
		t.Fatal("no key under the groups' tag to delete")
	}
	if n, err := rdb.Del(ctx, keys...).Result(); err != nil || n != int64(len(keys)) {
		t.Fatalf("DEL %q: %d, %v", keys, n, err)
	}
}

// nearModes are the reader's near caches in the attacks: none, and each
// tracking mode (trackings).
var nearModes = []string{"off", "prefixes", "keys"}

// A storedMember is a member's bytes in Redis, to put back where the
// loss took it too (eviction): as if it had lived on another node.
type storedMember struct {
	raw []byte
	ttl time.Duration
}

// groupLoss is how an attack loses the groups' state: members are the
// old members' bytes (lose puts back those it took).
type groupLoss func(ctx context.Context, t *testing.T, members map[string]storedMember)

// attackGroupLoss stores a member in each of six groups, invalidates
// three (before), loses the groups' state (lose), then invalidates the
// other three (after), and writes a new member into each group: by a
// load first, while the sequence is missing, then by Set and SetMany;
// and by a load last. Then no cache returns an old member, by Get or
// GetMany: the writer, a cache that read them all before (with a near
// cache in mode near, unless "off": from its near cache first), and one
// made after the loss. newClient gives each cache a client of its own
// (another process); keyOf names a member's key. The sequence ends above
// where it was before the loss.
func attackGroupLoss(t *testing.T, raw redis.UniversalClient, newClient func() redis.UniversalClient, keyOf func(string) string, near string, lose groupLoss) {
	ctx := ctxT(t)
	id := strconv.FormatInt(time.Now().UnixNano(), 36)
	clients := []redis.UniversalClient{newClient(), newClient()}
	a := mustNew[string](t, clients[0])
	bOpts := []packcache.Option{packcache.WithShareWindow(packcache.Off)}
	for _, m := range trackings {
		if m.name == near {
			bOpts = nearOpts(m.tk, bOpts...)
		}
	}
	b := mustNew[string](t, clients[1], bOpts...)
	// The sequence moves on first: the members' S are above what a
	// sequence begun again at 0 reaches in an invalidation or two.
	for range 3 {
		if err := a.InvalidateGroups(ctx, "warm:"+id); err != nil {
			t.Fatal(err)
		}
	}
	var before, after []string
	for i := range 3 {
		before = append(before, fmt.Sprintf("lost:%s:before:%d", id, i))
		after = append(after, fmt.Sprintf("lost:%s:after:%d", id, i))
	}
	groups := append(slices.Clone(before), after...)
	oldKey := func(g string) string { return keyOf("old:" + g) }
	newKey := func(g string) string { return keyOf("new:" + g) }
	var olds, all []string
	for _, g := range groups {
		k := oldKey(g)
		if err := a.Set(ctx, k, "old "+k, packcache.InGroups(g)); err != nil {
			t.Fatal(err)
		}
		olds = append(olds, k)
		all = append(all, k, newKey(g))
	}
	if got, err := b.GetMany(ctx, olds); err != nil || len(got) != len(olds) {
		t.Fatalf("b: GetMany of the members before: %d of %d, %v", len(got), len(olds), err)
	}
	if near != "off" {
		for _, k := range olds {
			waitNear(t, b, k)
		}
	}
	members := map[string]storedMember{}
	for _, k := range olds {
		ttl, err := raw.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		members[k] = storedMember{raw: rawGet(t, raw, k), ttl: max(ttl, 0)}
	}

	// missed waits until b misses every old member of gs: at once
	// without a near cache, within its MaxLag with one.
	missed := func(gs []string) {
		t.Helper()
		for _, g := range gs {
			k := oldKey(g)
			waitFor(t, 10*time.Second, "b missing "+k+" after its group's invalidation", func() bool {
				_, err := b.Get(ctx, k)
				return errors.Is(err, packcache.ErrMiss)
			})
		}
	}
	if err := a.InvalidateGroups(ctx, before...); err != nil {
		t.Fatal(err)
	}
	missed(before)
	seqBefore, err := raw.Get(ctx, seqKey).Uint64()
	if err != nil {
		t.Fatalf("GET %s before the loss: %v", seqKey, err)
	}

	lose(ctx, t, members)
	// Each cache's client answers for the groups' slot again (a restart
	// breaks their connections).
	for _, c := range clients {
		waitFor(t, 30*time.Second, "a client reaching the groups' node", func() bool {
			err := c.Get(ctx, seqKey).Err()
			return err == nil || err == redis.Nil
		})
	}

	var loads atomic.Int64
	load := func(g string) {
		t.Helper()
		k := newKey(g)
		v, err := a.GetOrLoad(ctx, k, func(ctx context.Context) (string, error) {
			loads.Add(1)
			return "new " + k, packcache.StoreWith(ctx, k, packcache.InGroups(g))
		})
		if err != nil || v != "new "+k {
			t.Fatalf("GetOrLoad %s: %q, %v", k, v, err)
		}
	}
	set := func(g string) {
		t.Helper()
		if err := a.Set(ctx, newKey(g), "new "+newKey(g), packcache.InGroups(g)); err != nil {
			t.Fatal(err)
		}
	}
	setMany := func(g string) {
		t.Helper()
		if err := a.SetMany(ctx, map[string]string{newKey(g): "new " + newKey(g)}, packcache.InGroups(g)); err != nil {
			t.Fatal(err)
		}
	}
	load(before[0]) // first: the sequence is still missing
	set(before[1])
	setMany(before[2])
	if err := a.InvalidateGroups(ctx, after...); err != nil {
		t.Fatal(err)
	}
	missed(after)
	set(after[0])
	setMany(after[1])
	load(after[2])
	if n := loads.Load(); n != 2 {
		t.Errorf("2 loads after the loss called their loader %d times, want once each", n)
	}

	c := mustNew[string](t, newClient()) // a process started after the loss
	for _, rd := range []struct {
		name string
		c    *packcache.Cache[string]
	}{{"the writer", a}, {"another process", b}, {"a process started after the loss", c}} {
		for round := range 2 { // the second: from b's near cache, had the first let it in
			for _, k := range olds {
				if v, err := rd.c.Get(ctx, k); !errors.Is(err, packcache.ErrMiss) {
					t.Errorf("%s, round %d: Get %s, invalidated before its groups' state was lost: %q, %v; want ErrMiss", rd.name, round, k, v, err)
				}
			}
			got, err := rd.c.GetMany(ctx, all)
			if err != nil {
				t.Fatalf("%s: GetMany: %v", rd.name, err)
			}
			for _, k := range all {
				v, ok := got[k]
				switch isNew := strings.HasPrefix(v, "new "); {
				case strings.Contains(k, ":old:") && ok:
					t.Errorf("%s, round %d: GetMany returned %s, invalidated before the loss: %q", rd.name, round, k, v)
				case strings.Contains(k, ":new:") && (!ok || !isNew):
					t.Errorf("%s, round %d: GetMany: %s %q, %v; want the member stored after the loss", rd.name, round, k, v, ok)
				}
			}
		}
	}
	seqAfter, err := raw.Get(ctx, seqKey).Uint64()
	if err != nil || seqAfter <= seqBefore {
		t.Errorf("the sequence went from %d before the loss to %d (%v) after it: it must only go up", seqBefore, seqAfter, err)
	}
}

// TestGroupsStateDeleted: the groups' sequence, or every key under
// their tag, deleted through a raw client (as eviction or a restart
// would lose them), single node and Cluster, the reader without a near
// cache and with one in each tracking mode (as in the tests below).
func TestGroupsStateDeleted(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (forEachTarget)
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		for _, all := range []bool{false, true} {
			for _, near := range nearModes {
				name := map[bool]string{false: "sequence", true: "every key"}[all]
				t.Run(fmt.Sprintf("%s/near=%s", name, near), func(t *testing.T) {
					attackGroupLoss(t, tg.Client, func() redis.UniversalClient { return tg.Client },
						func(s string) string { return "gd:" + s }, near,
						func(ctx context.Context, t *testing.T, _ map[string]storedMember) {
							deleteGroupState(ctx, t, tg.Client, all)
						})
				})
			}
		}
	})
}

// evictGroupState makes Redis itself evict the sequence (all: every key
// under the groups' tag too) under maxmemory and allkeys-lru: it lowers
// maxmemory to a megabyte above what the server uses and writes values
// until the keys are gone, then lifts the limit and puts back the
// members that went with them. It looks with TYPE and SCAN, which do not
// touch a key's LRU clock.
func evictGroupState(ctx context.Context, t *testing.T, rdb *redis.Client, all bool, members map[string]storedMember) {
	t.Helper()
	evicted := infoField(t, rdb, "stats", "evicted_keys")
	used := infoField(t, rdb, "memory", "used_memory")
	if err := rdb.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used+1<<20, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	gone := func() bool {
		if typ, err := rdb.Type(ctx, seqKey).Result(); err != nil || typ != "none" {
			return false
		}
		if !all {
			return true
		}
		keys, _, err := rdb.Scan(ctx, 0, groupsTag+"*", 1<<20).Result()
		return err == nil && len(keys) == 0
	}
	value := strings.Repeat("x", 16<<10)
	const batch, rounds = 32, 2000 // up to 1 GB written through a 1 MB room
	n := 0
	for round := 0; !gone(); round++ {
		if round == rounds {
			t.Fatalf("the groups' state not evicted after %d values of %d bytes: %q left", n, len(value), groupStateKeys(ctx, t, rdb))
		}
		pipe := rdb.Pipeline()
		for range batch {
			pipe.Set(ctx, fmt.Sprintf("fill:%d", n), value, 0)
			n++
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatalf("filling: %v", err)
		}
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if got := infoField(t, rdb, "stats", "evicted_keys"); got <= evicted {
		t.Fatalf("evicted_keys %d -> %d: Redis evicted nothing", evicted, got)
	}
	put := 0
	for k, m := range members {
		if typ, err := rdb.Type(ctx, k).Result(); err != nil || typ != "none" {
			continue
		}
		if err := rdb.Set(ctx, k, m.raw, m.ttl).Err(); err != nil {
			t.Fatal(err)
		}
		put++
	}
	t.Logf("evicted after %d values of %d bytes (evicted_keys +%d); %d of %d members put back",
		n, len(value), infoField(t, rdb, "stats", "evicted_keys")-evicted, put, len(members))
}

// TestGroupsStateEvicted: Redis itself evicts the groups' sequence, or
// every key under their tag, under maxmemory with allkeys-lru.
func TestGroupsStateEvicted(t *testing.T) {
	t.Parallel() // a server of its own: it evicts
	s := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
	redistest.RequireReal(t, s, "eviction under maxmemory")
	raw := s.Client(t)
	for _, all := range []bool{false, true} {
		for _, near := range nearModes {
			name := map[bool]string{false: "sequence", true: "every key"}[all]
			t.Run(fmt.Sprintf("%s/near=%s", name, near), func(t *testing.T) {
				attackGroupLoss(t, raw, func() redis.UniversalClient { return s.Universal(t) },
					func(k string) string { return "ge:" + k }, near,
					func(ctx context.Context, t *testing.T, members map[string]storedMember) {
						evictGroupState(ctx, t, raw, all, members)
					})
			})
		}
	}
}

// TestGroupsNodeRestarted: the Cluster node that holds the groups' state
// restarts without persistence, losing the sequence and every record,
// while the members, on the other nodes, stay.
func TestGroupsNodeRestarted(t *testing.T) {
	t.Parallel() // a Cluster of its own: a node restarts
	cl := redistest.StartCluster(t, 3)
	raw := cl.Universal(t)
	victim := cl.NodeForKey(t, seqKey)
	// The members' keys: a hash tag of a slot of another node.
	tag := 0
	for cl.NodeForKey(t, "{"+strconv.Itoa(tag)+"}") == victim {
		tag++
	}
	keyOf := func(k string) string { return "gr:{" + strconv.Itoa(tag) + "}:" + k }
	for _, near := range nearModes {
		t.Run(fmt.Sprintf("near=%s", near), func(t *testing.T) {
			attackGroupLoss(t, raw, func() redis.UniversalClient { return cl.Universal(t) }, keyOf, near,
				func(ctx context.Context, t *testing.T, members map[string]storedMember) {
					victim.Restart(t)
					if keys := groupStateKeys(ctx, t, raw); len(keys) != 0 {
						t.Fatalf("after the restart: %q still there", keys)
					}
					for k := range members {
						if n, err := raw.Exists(ctx, k).Result(); err != nil || n != 1 {
							t.Fatalf("member %s lost in the restart: %d, %v", k, n, err)
						}
					}
				})
		})
	}
}
