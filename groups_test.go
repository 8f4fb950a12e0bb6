package packcache_test

import (
	"context"
	"errors"
	"fmt"
	"os"
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

// Groups (issue 25): InvalidateGroups invalidates every value stored in a
// group before it began, in any process, single node and Cluster, with
// the near cache on and off, at a cost that does not grow with the group;
// a load that began before it stores nothing a later Get serves, even when
// its loader names the group only afterwards (StoreWith).

// clientCommands are the commands a client may send for a group's
// invalidation, counted with INFO commandstats; scriptCommands those a
// script runs inside the one command that sent it (Redis counts them
// too); memberCommands those that would read or list a group's members.
var (
	clientCommands = []string{"evalsha", "eval", "get", "mget", "set", "unlink", "multi", "exec"}
	scriptCommands = []string{"incr", "del"}
	memberCommands = []string{"scan", "keys", "smembers", "sscan", "hgetall", "zrange"}
)

func countCommands(t *testing.T, tg redistest.Target) map[string]int64 {
	m := map[string]int64{}
	for _, c := range append(append(slices.Clone(clientCommands), scriptCommands...), memberCommands...) {
		if n := tg.CommandCount(t, c); n != 0 {
			m[c] = n
		}
	}
	return m
}

// sent is how many commands the client sent, of those counted.
func sent(m map[string]int64) (n int64) {
	for _, c := range append(slices.Clone(clientCommands), memberCommands...) {
		n += m[c]
	}
	return n
}

// checkInvalidationCost fails unless cmds, counted around one
// InvalidateGroups of groups groups, are at most 3 commands sent, none
// reading members, and one DEL per group inside the script.
func checkInvalidationCost(t *testing.T, cmds map[string]int64, groups int) {
	t.Helper()
	if sent(cmds) > 3 || cmds["del"] > int64(groups) {
		t.Errorf("InvalidateGroups sent %v: more than 3 commands, or more than a DEL per group", cmds)
	}
	for _, c := range memberCommands {
		if cmds[c] != 0 {
			t.Errorf("InvalidateGroups read members: %v", cmds)
		}
	}
}

func withNear(near bool, opts ...packcache.Option) []packcache.Option {
	if near {
		return nearOpts(packcache.TrackPrefixes, opts...)
	}
	return opts
}

// TestGroupsInvalidate: members of a group, and of two, are served until
// the group is invalidated, then never again, by this cache or another
// (a second cache over a client of its own, with a near cache of its own,
// stands for another process); values outside the group stay; a value
// stored in the group afterwards is served. The invalidation is one
// command.
func TestGroupsInvalidate(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (forEachTarget); groups of its own
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		for _, near := range []bool{false, true} {
			t.Run(fmt.Sprintf("near=%v", near), func(t *testing.T) {
				ctx := ctxT(t)
				g := fmt.Sprintf("user:%s:%v:%d", tg.Name, near, time.Now().UnixNano())
				other := g + ":other"
				// Without a share window: another process's Get may share a
				// read begun up to one window before it (WithShareWindow),
				// which is not what this test is about.
				a := mustNew[string](t, tg.Client, withNear(near, packcache.WithShareWindow(packcache.Off))...)
				b := mustNew[string](t, tg.Client, withNear(near, packcache.WithShareWindow(packcache.Off))...)
				keys := []string{"gi:" + g + ":1", "gi:" + g + ":2", "gi:" + g + ":3"}
				for i, k := range keys[:2] {
					if err := a.Set(ctx, k, "v"+strconv.Itoa(i), packcache.InGroups(g)); err != nil {
						t.Fatal(err)
					}
				}
				if err := a.Set(ctx, keys[2], "both", packcache.InGroups(other, g)); err != nil {
					t.Fatal(err)
				}
				outside := "gi:" + g + ":outside"
				if err := a.Set(ctx, outside, "stays", packcache.InGroups(other)); err != nil {
					t.Fatal(err)
				}
				for _, c := range []*packcache.Cache[string]{a, b} {
					for _, k := range append(keys, outside) {
						if _, err := c.Get(ctx, k); err != nil {
							t.Fatalf("Get %s before: %v", k, err)
						}
					}
				}
				if near {
					waitNear(t, a, keys[0])
					waitNear(t, b, keys[0])
				}
				tg.ResetStats(t)
				if err := a.InvalidateGroups(ctx, g); err != nil {
					t.Fatal(err)
				}
				checkInvalidationCost(t, countCommands(t, tg), 1)
				// This process: at once, near cache or not.
				for _, k := range keys {
					if v, err := a.Get(ctx, k); !errors.Is(err, packcache.ErrMiss) {
						t.Errorf("a: Get %s after InvalidateGroups: %q, %v; want ErrMiss", k, v, err)
					}
				}
				// The other: at once without a near cache, within MaxLag
				// with one.
				for _, k := range keys {
					if !near {
						if v, err := b.Get(ctx, k); !errors.Is(err, packcache.ErrMiss) {
							t.Errorf("b: Get %s after InvalidateGroups: %q, %v; want ErrMiss", k, v, err)
						}
						continue
					}
					waitFor(t, 5*time.Second, "b dropping "+k, func() bool {
						_, err := b.Get(ctx, k)
						return errors.Is(err, packcache.ErrMiss)
					})
				}
				if got, err := b.GetMany(ctx, append(keys, outside)); err != nil || len(got) != 1 || got[outside] != "stays" {
					t.Errorf("b: GetMany: %v, %v; want only %s", got, err, outside)
				}
				// Stored afterwards: served as usual.
				if err := b.Set(ctx, keys[0], "new", packcache.InGroups(g)); err != nil {
					t.Fatal(err)
				}
				for _, c := range []*packcache.Cache[string]{a, b} {
					if v, err := c.Get(ctx, keys[0]); err != nil || v != "new" {
						t.Errorf("Get after a new Set: %q, %v", v, err)
					}
				}
			})
		}
	})
}

// TestGroupsReadThrough: a read-through Get of an invalidated member
// loads it again and stores over it, and a loader's StoreWith puts the
// value in its groups.
func TestGroupsReadThrough(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		ctx := ctxT(t)
		g := fmt.Sprintf("rt:%s:%d", tg.Name, time.Now().UnixNano())
		var loads atomic.Int64
		c := mustNew[string](t, tg.Client, packcache.WithLoader(packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
			n := loads.Add(1)
			if err := packcache.StoreWith(ctx, key, packcache.InGroups(g)); err != nil {
				return "", err
			}
			return fmt.Sprintf("%s#%d", key, n), nil
		})))
		// The first load of a process that has not met groups calls its
		// loader twice (see StoreWith; TestGroupsFirstLoadStored): the
		// counts below expect one call per load. Meet them first.
		if err := c.InvalidateGroups(ctx, g+":none"); err != nil {
			t.Fatal(err)
		}
		key := "rt:" + g
		v1, err := c.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if v, err := c.Get(ctx, key); err != nil || v != v1 || loads.Load() != 1 {
			t.Fatalf("second Get: %q, %v, %d loads; want %q from Redis", v, err, loads.Load(), v1)
		}
		if err := c.InvalidateGroups(ctx, g); err != nil {
			t.Fatal(err)
		}
		v2, err := c.Get(ctx, key)
		if err != nil || v2 == v1 || loads.Load() != 2 {
			t.Fatalf("Get after InvalidateGroups: %q, %v, %d loads; want a second load", v2, err, loads.Load())
		}
		if v, err := c.Get(ctx, key); err != nil || v != v2 || loads.Load() != 2 {
			t.Fatalf("Get after the reload: %q, %v, %d loads; want %q stored", v, err, loads.Load(), v2)
		}
	})
}

// TestGroupsSlowLoadNamesGroupLate: a load that began before
// InvalidateGroups, whose loader names its group only after it, stores
// nothing that a later Get serves, and no Get that starts after the
// invalidation joins it.
func TestGroupsSlowLoadNamesGroupLate(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		for _, near := range []bool{false, true} {
			t.Run(fmt.Sprintf("near=%v", near), func(t *testing.T) {
				ctx := ctxT(t)
				g := fmt.Sprintf("slow:%s:%v:%d", tg.Name, near, time.Now().UnixNano())
				key := "slow:" + g
				started, release := make(chan struct{}), make(chan struct{})
				var loads atomic.Int64
				c := mustNew[string](t, tg.Client, withNear(near, packcache.WithLoader(packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
					n := loads.Add(1)
					if n == 1 {
						close(started)
						<-release
					}
					if err := packcache.StoreWith(ctx, key, packcache.InGroups(g)); err != nil {
						return "", err
					}
					return "load" + strconv.FormatInt(n, 10), nil
				})))...)
				plain := mustNew[string](t, tg.Client, withNear(near)...)
				if err := c.InvalidateGroups(ctx, g+":meet"); err != nil { // meet groups: see StoreWith
					t.Fatal(err)
				}
				first := make(chan string)
				go func() {
					v, _ := c.Get(ctx, key)
					first <- v
				}()
				<-started
				if err := c.InvalidateGroups(ctx, g); err != nil {
					t.Fatal(err)
				}
				// Started after: not joined to the slow load.
				second := make(chan string)
				go func() {
					v, err := c.Get(ctx, key)
					if err != nil {
						v = err.Error()
					}
					second <- v
				}()
				if v := <-second; v != "load2" {
					t.Errorf("Get after InvalidateGroups: %q, want a load of its own (load2)", v)
				}
				// The slow load raced the invalidation: it calls its loader
				// again, and its callers get the newer value (load3).
				close(release)
				if v := <-first; v != "load3" {
					t.Errorf("the first Get: %q, want load3", v)
				}
				// What the slow load stored, if anything, is never served.
				for range 3 {
					v, err := plain.Get(ctx, key)
					if err == nil && v == "load1" {
						t.Fatalf("a Get after InvalidateGroups served the slow load's value")
					}
					if v, err := c.Get(ctx, key); err != nil || v == "load1" {
						t.Fatalf("read-through Get: %q, %v", v, err)
					}
				}
			})
		}
	})
}

// TestGroupsManyKeysCluster: 100,000 keys of one group across three
// masters are invalidated by at most 3 commands, as are 10; every key is
// a miss afterwards.
func TestGroupsManyKeysCluster(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("100,000 keys")
	}
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		if tg.Cluster == nil {
			t.Skip("the Cluster's case")
		}
		ctx := ctxT(t)
		c := mustNew[string](t, tg.Client)
		for _, n := range []int{10, 100_000} {
			g := fmt.Sprintf("big:%d:%d", n, time.Now().UnixNano())
			items := make(map[string]string, 1000)
			var keys []string
			for i := range n {
				k := fmt.Sprintf("big:%s:%d", g, i)
				keys = append(keys, k)
				items[k] = "v"
				if len(items) == 1000 || i == n-1 {
					if err := c.SetMany(ctx, items, packcache.InGroups(g)); err != nil {
						t.Fatal(err)
					}
					clear(items)
				}
			}
			masters := map[string]bool{}
			for _, k := range keys[:min(n, 200)] {
				masters[tg.Cluster.NodeForKey(t, k).Addr()] = true
			}
			tg.ResetStats(t)
			start := time.Now()
			if err := c.InvalidateGroups(ctx, g); err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			cmds := countCommands(t, tg)
			t.Logf("%d keys over %d masters: InvalidateGroups took %v, sent %v", n, len(masters), took, cmds)
			checkInvalidationCost(t, cmds, 1)
			for i := 0; i < n; i += 1000 {
				got, err := c.GetMany(ctx, keys[i:min(i+1000, n)])
				if err != nil || len(got) != 0 {
					t.Fatalf("GetMany after InvalidateGroups: %d values, %v", len(got), err)
				}
			}
		}
	})
}

// TestGroupsMillionInvalidations: a million InvalidateGroups of one group
// leave Redis's memory within 1 MiB of where it was.
func TestGroupsMillionInvalidations(t *testing.T) {
	if testing.Short() || os.Getenv("PACKCACHE_LONG") != "1" {
		// Half a minute of round trips on a quiet machine, minutes under
		// -race: CI runs it in a step of its own (.ci/run).
		t.Skip("a million calls: PACKCACHE_LONG=1 runs it")
	}
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "INFO memory")
	rdb := s.Universal(t)
	c := mustNew[string](t, rdb)
	// A million round trips take a minute or more on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if err := c.Set(ctx, "m:1", "v", packcache.InGroups("hot")); err != nil {
		t.Fatal(err)
	}
	used := func() int64 {
		info, err := rdb.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		t.Fatal("no used_memory")
		return 0
	}
	before := used()
	start := time.Now()
	const n, workers = 1_000_000, 16
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				if err := c.InvalidateGroups(ctx, "hot"); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	after := used()
	t.Logf("used_memory %d -> %d (%+d bytes) after %d invalidations in %v", before, after, after-before, n, time.Since(start))
	if failed.Load() != 0 {
		t.Fatalf("%d InvalidateGroups failed", failed.Load())
	}
	if after-before >= 1<<20 {
		t.Errorf("Redis memory grew by %d bytes: over 1 MiB", after-before)
	}
	if seq, _ := rdb.Get(ctx, "{packcache:g}seq").Int64(); seq < n {
		t.Errorf("sequence %d, want at least %d", seq, n)
	}
}

// TestGroupsRacingSets: InvalidateGroups races Sets of the group's keys
// (by another cache: another process); after each returns, no Get of the
// invalidating cache, near cache or not, serves a value whose Set had
// returned before the invalidation began.
func TestGroupsRacingSets(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		for _, near := range []bool{false, true} {
			t.Run(fmt.Sprintf("near=%v", near), func(t *testing.T) {
				ctx := ctxT(t)
				g := fmt.Sprintf("race:%s:%v:%d", tg.Name, near, time.Now().UnixNano())
				w := mustNew[string](t, tg.Client)
				r := mustNew[string](t, tg.Client, withNear(near)...)
				keys := []string{"race:" + g + ":a", "race:" + g + ":b", "race:" + g + ":c"}
				var clock atomic.Int64 // ticks at each invalidation's start
				var done sync.Map      // value -> clock when its Set returned
				stop := make(chan struct{})
				var wg sync.WaitGroup
				for i, k := range keys {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for n := 0; ; n++ {
							select {
							case <-stop:
								return
							default:
							}
							v := fmt.Sprintf("%d-%d", i, n)
							if err := w.Set(ctx, k, v, packcache.InGroups(g)); err != nil {
								t.Error(err)
								return
							}
							done.Store(v, clock.Load())
						}
					}()
				}
				for range 50 {
					began := clock.Add(1)
					if err := r.InvalidateGroups(ctx, g); err != nil {
						t.Fatal(err)
					}
					got, _ := r.GetMany(ctx, keys)
					for k, v := range got {
						if at, ok := done.Load(v); ok && at.(int64) < began {
							t.Fatalf("%s: %q, whose Set returned before invalidation %d began, served after it", k, v, began)
						}
					}
				}
				close(stop)
				wg.Wait()
			})
		}
	})
}

// TestStoreWithTTL: a loader's StoreWith(SetTTL(2s)) stores its value
// with a PTTL of at most 2 s, and neither Redis nor the near cache serves
// it past that; an ErrNotFound carries its own TTL too.
func TestStoreWithTTL(t *testing.T) {
	// Not parallel: the PTTL read after the Get must come within the
	// value's 2 s, and the loop waits those 2 s out, not the CPU.
	s, rdb := single(t)
	_ = s
	ctx := ctxT(t)
	var loads atomic.Int64
	c := mustNew[string](t, rdb, nearOpts(packcache.TrackPrefixes, packcache.WithTTL(time.Hour), packcache.WithLoader(packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
		n := loads.Add(1)
		if strings.HasPrefix(key, "none:") {
			if err := packcache.StoreWith(ctx, key, packcache.SetTTL(3*time.Second)); err != nil {
				return "", err
			}
			return "", packcache.ErrNotFound
		}
		if err := packcache.StoreWith(ctx, key, packcache.SetTTL(2*time.Second)); err != nil {
			return "", err
		}
		return "v" + strconv.FormatInt(n, 10), nil
	})))...)
	if v, err := c.Get(ctx, "ttl:1"); err != nil || v != "v1" {
		t.Fatalf("Get: %q, %v", v, err)
	}
	stored := time.Now() // the load stored before Get returned
	if d := rdb.PTTL(ctx, "ttl:1").Val(); d <= 0 || d > 2*time.Second {
		t.Fatalf("PTTL %v, want at most 2s", d)
	}
	waitNear(t, c, "ttl:1")
	// Served from the near cache or Redis until it expires; never after.
	for {
		start := time.Now()
		v, err := c.Get(ctx, "ttl:1")
		if err != nil {
			t.Fatal(err)
		}
		if v != "v1" {
			break
		}
		// Redis keeps time in whole milliseconds: a key SET with PX 2000
		// at t expires at floor(t)+2000 ms and is served until that
		// millisecond has passed, so up to 1 ms past t+2s (a Get begun
		// 2.000135 s after it failed here once). A near entry's end,
		// counted from PTTL, is never later than that.
		if since := start.Sub(stored); since > 2*time.Second+time.Millisecond {
			t.Fatalf("v1 served to a Get begun %v after it was stored: past its 2s TTL (and Redis's 1 ms resolution)", since)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := c.Get(ctx, "none:1"); !errors.Is(err, packcache.ErrNotFound) {
		t.Fatalf("Get none:1: %v", err)
	}
	if d := rdb.PTTL(ctx, "none:1").Val(); d <= 0 || d > 3*time.Second {
		t.Fatalf("the tombstone's PTTL %v, want at most 3s (no NegativeTTL in the policy)", d)
	}
}

// TestStoreWithOutsideALoad: StoreWith outside a loader, for a key the
// load does not load, or after the loader returned, fails with
// ErrNotLoading and changes nothing.
func TestStoreWithOutsideALoad(t *testing.T) {
	t.Parallel() // a server of its own
	_, rdb := single(t)
	ctx := ctxT(t)
	if err := packcache.StoreWith(ctx, "k", packcache.SetTTL(time.Second)); !errors.Is(err, packcache.ErrNotLoading) {
		t.Errorf("outside a loader: %v", err)
	}
	var kept context.Context
	c := mustNew[string](t, rdb, packcache.WithTTL(time.Hour), packcache.WithLoader(packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
		kept = ctx
		if err := packcache.StoreWith(ctx, "other", packcache.SetTTL(time.Second)); !errors.Is(err, packcache.ErrNotLoading) {
			t.Errorf("for another key: %v", err)
		}
		if err := packcache.StoreWith(ctx, key, packcache.SetTTL(-5)); err == nil {
			t.Errorf("a negative TTL: no error")
		}
		return "v", nil
	})))
	if _, err := c.Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if err := packcache.StoreWith(kept, "k", packcache.SetTTL(time.Second)); !errors.Is(err, packcache.ErrNotLoading) {
		t.Errorf("after the loader returned: %v", err)
	}
	if d := rdb.PTTL(ctx, "k").Val(); d < 30*time.Minute {
		t.Errorf("PTTL %v: the policy's hour was changed", d)
	}
}

// TestGroupsPending: InvalidateGroups with Redis stopped fails with
// ErrPending, this process never serves the group's values meanwhile, and
// the invalidation lands once Redis answers.
func TestGroupsPending(t *testing.T) {
	// Not parallel: the Set before the pause has pausable's 200 ms budget.
	s, c, raw := pausable(t)
	ctx := ctxT(t)
	if err := c.Set(ctx, "p:1", "old", packcache.InGroups("pg")); err != nil {
		t.Fatal(err)
	}
	s.Pause(t)
	err := c.InvalidateGroups(ctx, "pg")
	if !errors.Is(err, packcache.ErrPending) || !errors.Is(err, packcache.ErrRedis) {
		s.Resume(t)
		t.Fatalf("InvalidateGroups with Redis stopped: %v, want ErrPending", err)
	}
	s.Resume(t)
	// The record gone from Redis is not enough: the retry that deleted it
	// may have run out of its budget before the reply came, and then the
	// process still owes it. Once the ledger is empty a reply came, and
	// that reply closed the breaker.
	waitFor(t, 15*time.Second, "the invalidation landing", func() bool {
		return c.Stats().Pending == 0
	})
	if n := raw.Exists(context.Background(), "{packcache:g}:pg").Val(); n != 0 {
		t.Fatal("the ledger is empty with the group's record still in Redis")
	}
	if v, err := c.Get(ctx, "p:1"); !errors.Is(err, packcache.ErrMiss) {
		t.Fatalf("Get after the invalidation landed: %q, %v", v, err)
	}
	_ = redis.Nil
}

// TestGroupsNearServes: a grouped value enters the near cache and is
// served from it, with no Redis read, until its group is invalidated.
func TestGroupsNearServes(t *testing.T) {
	// Not parallel: a near cache that a loaded machine stopped (its
	// heartbeat later than MaxLag) would read Redis, and this counts reads.
	s, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[string](t, rdb, nearOpts(packcache.TrackPrefixes)...)
	if err := c.Set(ctx, "ns:1", "v", packcache.InGroups("ns")); err != nil {
		t.Fatal(err)
	}
	waitNear(t, c, "ns:1")
	s.ResetStats(t)
	for range 100 {
		if v, err := c.Get(ctx, "ns:1"); err != nil || v != "v" {
			t.Fatal(v, err)
		}
	}
	if n := s.CommandCount(t, "get") + s.CommandCount(t, "mget"); n != 0 {
		t.Errorf("100 near hits of a grouped key: %d reads of Redis", n)
	}
	if err := c.InvalidateGroups(ctx, "ns"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "ns:1"); !errors.Is(err, packcache.ErrMiss) {
		t.Errorf("Get after InvalidateGroups: %v", err)
	}
}

// TestGroupsFirstLoadStored: the first load of a process that has met no
// group yet, whose loader puts its value in a group, stores it (the load
// reads the group sequence and calls its loader again, once: it read no
// sequence before the first call), and InvalidateGroups then invalidates
// it. Later loads call their loader once.
func TestGroupsFirstLoadStored(t *testing.T) {
	t.Parallel() // "a process that has met no group" is a Cache of its own
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		ctx := ctxT(t)
		g := fmt.Sprintf("first:%s:%d", tg.Name, time.Now().UnixNano())
		var loads atomic.Int64
		c := mustNew[string](t, tg.Client, packcache.WithLoader(packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
			n := loads.Add(1)
			if err := packcache.StoreWith(ctx, key, packcache.InGroups(g)); err != nil {
				return "", err
			}
			return fmt.Sprintf("%s#%d", key, n), nil
		})), packcache.WithShareWindow(packcache.Off)) // each Get reads Redis
		key := "first:" + g
		v1, err := c.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		calls := loads.Load()
		if v, err := c.Get(ctx, key); err != nil || v != v1 || loads.Load() != calls {
			t.Fatalf("second Get: %q, %v, loader called %d times in all; want %q from Redis (the first load stored nothing)", v, err, loads.Load(), v1)
		}
		if calls > 2 {
			t.Errorf("the first load called its loader %d times, want at most 2", calls)
		}
		if err := c.InvalidateGroups(ctx, g); err != nil {
			t.Fatal(err)
		}
		v2, err := c.Get(ctx, key)
		if err != nil || v2 == v1 || loads.Load() != calls+1 {
			t.Fatalf("Get after InvalidateGroups: %q, %v, loader called %d times; want one more load", v2, err, loads.Load())
		}
		if v, err := c.Get(ctx, key); err != nil || v != v2 || loads.Load() != calls+1 {
			t.Fatalf("Get after the reload: %q, %v; want %q stored", v, err, v2)
		}
	})
}

// TestGroupsJoinedAcrossProcesses: process A's load of a member began
// before another process (C) invalidated the group; process B's Gets wait
// for A's lease (WithLock): one that began before the invalidation, and
// one that starts after it, joining the first's wait. Neither gets A's
// value, which its loader read before the invalidation; nothing serves it
// afterwards. Each cache has a client of its own: another process.
func TestGroupsJoinedAcrossProcesses(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		for _, near := range []bool{false, true} {
			t.Run(fmt.Sprintf("near=%v", near), func(t *testing.T) {
				ctx := ctxT(t)
				g := fmt.Sprintf("join:%s:%v:%d", tg.Name, near, time.Now().UnixNano())
				key := "join:" + g
				started, release := make(chan struct{}), make(chan struct{})
				loader := func(name string, block bool) packcache.Option {
					var n atomic.Int64
					return packcache.WithLoader(packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
						if err := packcache.StoreWith(ctx, key, packcache.InGroups(g)); err != nil {
							return "", err
						}
						first := n.Add(1) == 1
						if block && first {
							close(started)
							<-release
						}
						if block && !first {
							return "A-new", nil // a load again, once the first raced the invalidation
						}
						return name, nil
					}))
				}
				a := mustNew[string](t, tg.Client, withNear(near, loader("A-old", true))...)
				b := mustNew[string](t, tg.Client, withNear(near, loader("B-new", false), packcache.WithLock(time.Minute))...)
				cc := mustNew[string](t, tg.Client, withNear(near)...)
				for _, c := range []*packcache.Cache[string]{a, b} {
					if err := c.InvalidateGroups(ctx, g+":meet"); err != nil { // meet groups: one loader call per load
						t.Fatal(err)
					}
				}
				fromA := make(chan string, 1)
				go func() {
					v, err := a.Get(ctx, key)
					if err != nil {
						v = err.Error()
					}
					fromA <- v
				}()
				<-started // A holds the lease, its loader has read the source
				get := func(out chan<- string) {
					v, err := b.Get(ctx, key)
					if err != nil {
						v = err.Error()
					}
					out <- v
				}
				before, after := make(chan string, 1), make(chan string, 1)
				go get(before)
				waitFor(t, 10*time.Second, "B waiting for A's lease", func() bool {
					return b.Stats().LockWaits >= 1
				})
				if err := cc.InvalidateGroups(ctx, g); err != nil {
					t.Fatal(err)
				}
				go get(after)
				waitFor(t, 10*time.Second, "the second Get of B joining the first", func() bool {
					return b.Stats().CoalescedWaits >= 1
				})
				close(release)
				<-fromA
				if v := <-after; v == "A-old" {
					t.Errorf("B's Get begun after InvalidateGroups, joined to a wait for A's lease, got A's value, loaded before the invalidation")
				}
				<-before
				for _, c := range []*packcache.Cache[string]{a, b, cc} {
					if v, err := c.Get(ctx, key); err == nil && v == "A-old" {
						t.Errorf("a Get after InvalidateGroups served A's value")
					}
				}
			})
		}
	})
}

// TestGroupsJoinedLocalLoad: process B's load of a member began before
// process C's InvalidateGroups (B's loader read the source before it); a
// Get of B that starts after the invalidation returned finds B's own
// lease and joins B's load (B has nothing to tell it of C's
// invalidation, which, unlike a Delete, leaves the lease in place). It
// does not get the value read before the invalidation: the load, finding
// its group invalidated since it read the group sequence, calls its
// loader again, and every caller gets the second value.
func TestGroupsJoinedLocalLoad(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		ctx := ctxT(t)
		g := fmt.Sprintf("gap:%s:%d", tg.Name, time.Now().UnixNano())
		key := "gap:" + g
		started, release := make(chan struct{}), make(chan struct{})
		var n atomic.Int64
		b := mustNew[string](t, tg.Client, packcache.WithShareWindow(packcache.Off), packcache.WithLoader(packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
			if err := packcache.StoreWith(ctx, key, packcache.InGroups(g)); err != nil {
				return "", err
			}
			if n.Add(1) == 1 {
				close(started)
				<-release
				return "B-old", nil
			}
			return "B-new", nil
		})))
		cc := mustNew[string](t, tg.Client)
		if err := b.InvalidateGroups(ctx, g+":meet"); err != nil {
			t.Fatal(err)
		}
		first := make(chan string, 1)
		go func() { v, _ := b.Get(ctx, key); first <- v }()
		<-started
		if err := cc.InvalidateGroups(ctx, g); err != nil {
			t.Fatal(err)
		}
		second := make(chan string, 1)
		go func() { v, _ := b.Get(ctx, key); second <- v }()
		waitFor(t, 10*time.Second, "the second Get joining", func() bool { return b.Stats().CoalescedWaits >= 1 })
		close(release)
		<-first
		if v := <-second; v != "B-new" {
			t.Errorf("a Get begun after another process's InvalidateGroups, joined to this process's load begun before it: %q, want B-new", v)
		}
		if v, err := b.Get(ctx, key); err != nil || v != "B-new" || n.Load() != 2 {
			t.Errorf("Get after: %q, %v, %d loader calls; want B-new stored by the second call", v, err, n.Load())
		}
	})
}

// TestGroupsJoinedAfterCheck: a call that joins a grouped load after the
// load's last check of its groups, and after another process's
// InvalidateGroups in between (the load's store held by a hook), does not
// get the load's value: it reads again, finds the stored value
// invalidated, and loads anew. Get and GetOrLoadMany, single node and
// Cluster. Without the check at delivery (result.lateFor) the second
// call got B-old.
func TestGroupsJoinedAfterCheck(t *testing.T) {
	t.Parallel() // the hooks are on its own Targets client
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		for _, call := range []string{"Get", "GetOrLoadMany"} {
			t.Run(call, func(t *testing.T) {
				ctx := ctxT(t)
				g := fmt.Sprintf("late:%s:%s:%d", tg.Name, call, time.Now().UnixNano())
				key := "late:" + g
				var n atomic.Int64
				load := func(ctx context.Context, key string) (string, error) {
					if err := packcache.StoreWith(ctx, key, packcache.InGroups(g)); err != nil {
						return "", err
					}
					if n.Add(1) == 1 {
						return "B-old", nil
					}
					return "B-new", nil
				}
				h := &holdArgHook{arg: "B-old", held: make(chan struct{}), release: make(chan struct{})}
				tg.Client.AddHook(h)
				b := mustNew[string](t, tg.Client, packcache.WithShareWindow(packcache.Off), packcache.WithLoader(packcache.LoaderFunc[string](load)))
				cc := mustNew[string](t, tg.Client)
				if err := b.InvalidateGroups(ctx, g+":meet"); err != nil {
					t.Fatal(err)
				}
				first := make(chan string, 1)
				go func() { v, _ := b.Get(ctx, key); first <- v }()
				<-h.held // checked its groups, and storing
				if err := cc.InvalidateGroups(ctx, g); err != nil {
					t.Fatal(err)
				}
				second := make(chan string, 1)
				go func() {
					if call == "Get" {
						v, _ := b.Get(ctx, key)
						second <- v
						return
					}
					m, _ := b.GetOrLoadMany(ctx, []string{key}, func(ctx context.Context, keys []string) (map[string]string, error) {
						v, err := load(ctx, keys[0])
						return map[string]string{keys[0]: v}, err
					})
					second <- m[key]
				}()
				waitFor(t, 10*time.Second, "the second call joining", func() bool { return b.Stats().CoalescedWaits >= 1 })
				close(h.release)
				if v := <-first; v != "B-old" {
					t.Errorf("the Get begun before the invalidation: %q, want B-old", v)
				}
				if v := <-second; v != "B-new" {
					t.Errorf("a %s begun after another process's InvalidateGroups, joined to a load whose check came before it: %q, want B-new", call, v)
				}
				if v, err := b.Get(ctx, key); err != nil || v != "B-new" || n.Load() != 2 {
					t.Errorf("Get after: %q, %v, %d loader calls; want B-new stored by the second call", v, err, n.Load())
				}
			})
		}
	})
}

// TestGroupsSharedReadAfterCheck: a Get that begins after another
// process's InvalidateGroups does not take a read of a grouped value
// whose check of its groups came before it: not one held for the share
// window (an hour here), nor one still in flight that it joins (its
// check held by a hook). Without the rule (result.lateFor, and grouped
// values unshared) both got the old value, single node and Cluster.
func TestGroupsSharedReadAfterCheck(t *testing.T) {
	t.Parallel() // the hooks are on its own Targets client
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		for _, how := range []string{"held", "in flight"} {
			t.Run(strings.ReplaceAll(how, " ", "-"), func(t *testing.T) {
				ctx := ctxT(t)
				g := fmt.Sprintf("shared:%s:%s:%d", tg.Name, how, time.Now().UnixNano())
				key := fmt.Sprintf("sk:%d", time.Now().UnixNano())
				b := mustNew[string](t, tg.Client, packcache.WithShareWindow(time.Hour))
				cc := mustNew[string](t, tg.Client)
				if err := b.Set(ctx, key, "old", packcache.InGroups(g)); err != nil {
					t.Fatal(err)
				}
				var release func()
				if how == "held" {
					if v, err := b.Get(ctx, key); err != nil || v != "old" {
						t.Fatalf("Get before: %q, %v", v, err)
					}
				} else {
					h := &holdArgHook{arg: g, after: true, held: make(chan struct{}), release: make(chan struct{})}
					tg.Client.AddHook(h)
					release = sync.OnceFunc(func() { close(h.release) })
					t.Cleanup(release)
					go func() { _, _ = b.Get(ctx, key) }()
					<-h.held // its groups' check has its reply
				}
				if err := cc.InvalidateGroups(ctx, g); err != nil {
					t.Fatal(err)
				}
				joined := b.Stats().CoalescedWaits
				second := make(chan error, 1)
				go func() {
					v, err := b.Get(ctx, key)
					if err == nil {
						err = fmt.Errorf("got %q", v)
					}
					second <- err
				}()
				if release != nil {
					waitFor(t, 10*time.Second, "the second Get joining", func() bool { return b.Stats().CoalescedWaits > joined })
					release()
				}
				if err := <-second; !errors.Is(err, packcache.ErrMiss) {
					t.Errorf("a Get begun after another process's InvalidateGroups, sharing a read checked before it (%s): %v, want ErrMiss", how, err)
				}
			})
		}
	})
}

// holdArgHook holds the first command or pipeline with an argument
// containing arg until release is closed, telling held when it does:
// before it is sent, or, with after, once its reply is in.
type holdArgHook struct {
	arg           string
	after         bool
	taken         atomic.Bool
	held, release chan struct{}
}

func (h *holdArgHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *holdArgHook) hold(cmds ...redis.Cmder) {
	for _, cmd := range cmds {
		for _, a := range cmd.Args() {
			var s string
			switch a := a.(type) {
			case string:
				s = a
			case []byte:
				s = string(a)
			}
			if strings.Contains(s, h.arg) {
				if h.taken.CompareAndSwap(false, true) {
					close(h.held)
					<-h.release
				}
				return
			}
		}
	}
}

func (h *holdArgHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !h.after {
			h.hold(cmd)
		}
		err := next(ctx, cmd)
		if h.after {
			h.hold(cmd)
		}
		return err
	}
}

func (h *holdArgHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !h.after {
			h.hold(cmds...)
		}
		err := next(ctx, cmds)
		if h.after {
			h.hold(cmds...)
		}
		return err
	}
}
