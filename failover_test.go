package packcache_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
)

// A read of the failover test's key: when it began, and whether it
// returned the old value, or any answer at all.
type failoverRead struct {
	at       time.Time
	old      bool
	answered bool // a value or a miss, not an error
}

// failoverReads records the reads of one poller.
type failoverReads struct {
	mu    sync.Mutex
	reads []failoverRead
}

func (r *failoverReads) add(at time.Time, old, answered bool) {
	r.mu.Lock()
	r.reads = append(r.reads, failoverRead{at, old, answered})
	r.mu.Unlock()
}

// since counts the reads begun at or after t: all of them, those answered
// (a value or a miss, not an error), and those that returned the old
// value, with the last such.
func (r *failoverReads) since(t time.Time) (n, answered, old int, lastOld time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, x := range r.reads {
		if x.at.Before(t) {
			continue
		}
		n++
		if x.answered {
			answered++
		}
		if x.old {
			old++
			lastOld = x.at
		}
	}
	return
}

// TestPendingFollowsFailover: on a Cluster of 3 masters with a replica
// each, a master is paused (SIGSTOP) and stays paused until the test
// ends. A Delete of a key on it returns ErrPending; once the master's
// replica is promoted, the pending invalidation lands on it (the old master
// still paused), within 2 s of the promotion as the test observes it.
// From then on another process (a second ClusterClient and Cache, with a
// near cache) and a client of the new master read no old value, and the
// near caches of both processes serve again, the old master still paused.
//
// It runs twice: with no near cache in the deleting process, whose client
// then learns of the failover from nothing else (a near cache's
// invalidation connections reload the client's map each second), deleting
// one key; and with one, deleting two keys of the master in one Delete (a
// pipeline where the first case sends a single command).
func TestPendingFollowsFailover(t *testing.T) {
	// Not parallel with other tests: it holds the landing to a bound from
	// the promotion. Its runs, each on a cluster of its own (two started
	// ahead by TestMain), run at once: each spends its seconds waiting for
	// its cluster to fail over, not on the CPU.
	t.Run("near=false", func(t *testing.T) {
		t.Parallel()
		testPendingFollowsFailover(t, false, packcache.TrackPrefixes)
	})
	for _, m := range trackings {
		t.Run("near="+m.name, func(t *testing.T) {
			t.Parallel()
			testPendingFollowsFailover(t, true, m.tk)
		})
	}
}

func testPendingFollowsFailover(t *testing.T, near bool, tk packcache.Tracking) {
	cl := redistest.StartClusterWithReplicas(t, 3, 1)
	ctx := ctxT(t)
	noRetry := func(o *redis.ClusterOptions) { o.MaxRetries = -1 }
	db := &source{}
	rec := &recorder{}
	opts := []packcache.Option{packcache.WithLoader[string](db), packcache.WithShareWindow(packcache.Off),
		packcache.WithRedisTimeout(300 * time.Millisecond), packcache.WithCircuitBreaker(1, time.Minute), packcache.WithObserver(rec)}
	if near {
		opts = advNear(tk, 200*time.Millisecond, opts...)
	}
	w := mustNew[string](t, cl.Client(t, noRetry), opts...)
	// Another process: a client and a cache of their own, no loader.
	o := mustNew[string](t, cl.Client(t, noRetry), advNear(tk, 200*time.Millisecond, packcache.WithRedisTimeout(300*time.Millisecond))...)

	const key = "fo:k"
	m := cl.NodeForKey(t, key)
	r := cl.Replicas(m)[0]
	var other string // a key on another master, for the near cache's serving
	for i := 0; other == ""; i++ {
		if k := fmt.Sprintf("fo:other:%d", i); cl.NodeForKey(t, k) != m {
			other = k
		}
	}
	deleted := []string{key}
	for i := 0; near && len(deleted) < 2; i++ {
		if k := fmt.Sprintf("fo:same:%d", i); cl.NodeForKey(t, k) == m {
			deleted = append(deleted, k)
		}
	}
	// Stored with a minute's budget (a busy machine must not make the
	// setup fail), then read by both caches until they answer: their
	// clients have loaded the slot map and connected.
	setup := mustNew[string](t, cl.Client(t))
	for _, k := range append([]string{other}, deleted...) {
		db.put(k, "old")
		if err := setup.Set(ctx, k, "old"); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []*packcache.Cache[string]{w, o} {
		waitFor(t, 10*time.Second, "a Get answered", func() bool {
			v, err := c.Get(ctx, other)
			return err == nil && v == "old"
		})
	}
	// WAIT on this connection would prove nothing on Redis 7.4 and Valkey
	// 8.0, where it counts only the connection's own writes (docs/servers.md).
	cl.WaitReplicated(t, m, 10*time.Second)
	waitNear(t, o, key)
	waitNear(t, o, other)
	if near {
		waitNear(t, w, key)
		waitNear(t, w, other)
	}

	// The pollers: the other process's cache, and a client of the replica
	// that is to be promoted (reading its own data: a replica answers a
	// GET of its master's slot with MOVED until it is promoted).
	rc := r.Client(t)
	var oReads, rReads failoverReads
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			at := time.Now()
			v, err := o.Get(ctx, key)
			oReads.add(at, err == nil && v == "old", err == nil || errors.Is(err, packcache.ErrMiss))
		}
	})
	wg.Go(func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			at := time.Now()
			v, err := rc.Get(ctx, key).Result()
			rReads.add(at, err == nil && v == `"old"`, err == nil || err == redis.Nil)
		}
	})
	defer func() {
		close(stop)
		wg.Wait()
	}()

	m.Pause(t) // resumed by the cluster's cleanup, after the test
	paused := time.Now()
	for _, k := range deleted {
		db.put(k, "new")
	}
	if err := w.Delete(ctx, deleted...); !errors.Is(err, packcache.ErrPending) {
		t.Fatalf("Delete with the master paused: %v, want ErrPending", err)
	}
	promoted := cl.WaitPromoted(t, r, 30*time.Second)
	t.Logf("replica promoted %v after the pause (as WaitPromoted first saw it)", promoted.Sub(paused))

	waitFor(t, 15*time.Second, "the pending invalidation landing", func() bool {
		st := w.Stats()
		return st.Pending == 0 && st.PendingApplied == uint64(len(deleted))
	})
	landed := time.Now()
	// The bound is the promise itself: measured from the promotion as
	// WaitPromoted first saw it (up to its 20 ms poll after the fact) to
	// the landing as this poll first saw it (after the fact too).
	t.Logf("invalidation landed %v after the promotion", landed.Sub(promoted))
	if d := landed.Sub(promoted); d > 2*time.Second {
		t.Errorf("the invalidation landed %v after the promotion, want within 2 s", d)
		// What the deleting process's calls met, for the diagnosis.
		rec.mu.Lock()
		for _, e := range rec.redis {
			if e.Err != nil {
				t.Logf("Redis failure at %s: %v", e.Node, e.Err)
			}
		}
		rec.mu.Unlock()
	}
	for _, k := range deleted {
		if n, err := rc.Exists(ctx, k).Result(); err != nil || n != 0 {
			t.Fatalf("EXISTS %s on the promoted replica after the landing = %d, %v", k, n, err)
		}
	}
	// The old master is still paused: it does not answer.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := m.Client(t).Ping(short).Err()
	cancel()
	if err == nil {
		t.Fatal("the old master answered PING at the landing: it was resumed")
	}

	// The other process reaches the new master, and reads no old value.
	waitFor(t, 15*time.Second, "20 answered reads by the other process after the landing", func() bool {
		_, answered, _, _ := oReads.since(landed)
		return answered >= 20
	})
	waitFor(t, 15*time.Second, "the near caches serving again, the old master still paused", func() bool {
		return o.Stats().NearServing && (!near || w.Stats().NearServing)
	})
	if v, err := w.Get(ctx, key); err != nil || v != "new" {
		t.Errorf("Get in the deleting process = %q, %v; want the loader's new value", v, err)
	}
	waitNear(t, o, other)
	if near {
		waitNear(t, w, other)
	}
	close(stop)
	wg.Wait()
	stop = make(chan struct{}) // for the deferred close

	for _, p := range []struct {
		name  string
		reads *failoverReads
	}{{"the other process's Get", &oReads}, {"a GET on the new master", &rReads}} {
		n, answered, old, lastOld := p.reads.since(promoted)
		last := "none"
		if old > 0 {
			last = fmt.Sprintf("the last begun %v after the promotion", lastOld.Sub(promoted))
		}
		t.Logf("%s from the promotion on: %d reads, %d answered, %d old (%s)", p.name, n, answered, old, last)
		n, answered, old, _ = p.reads.since(landed)
		t.Logf("%s from the landing on: %d reads, %d answered, %d old", p.name, n, answered, old)
		if old > 0 {
			t.Errorf("%s: %d reads begun after the landing returned the old value", p.name, old)
		}
	}
	rec.mu.Lock()
	var pending []int
	for _, e := range rec.redis {
		if e.Err == nil && e.Breaker == "" {
			pending = append(pending, e.Pending)
		}
	}
	rec.mu.Unlock()
	// Kept one by one, then landed, together or not: 1, 2, ..., 0.
	n := len(deleted)
	ok := len(pending) > n && pending[len(pending)-1] == 0
	for i, p := range pending {
		ok = ok && (i >= n && p < pending[i-1] || i < n && p == i+1)
	}
	if !ok {
		t.Errorf("observer saw Pending %v; want 1 to %d as they were kept, then falling to 0 as they landed", pending, n)
	}
	if st := w.Stats(); st.PendingKept != uint64(len(deleted)) || st.PendingApplied != uint64(len(deleted)) || st.PendingExpired != 0 {
		t.Errorf("Stats: kept %d, applied %d, expired %d; want %d, %d, 0", st.PendingKept, st.PendingApplied, st.PendingExpired, len(deleted), len(deleted))
	}
}
