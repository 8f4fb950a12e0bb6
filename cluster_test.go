package packcache_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
)

// pipelineCounter counts the pipelines each cluster node receives.
type pipelineCounter struct {
	mu    sync.Mutex
	calls map[string]int
}

func (p *pipelineCounter) hook(addr string) redis.Hook {
	return pipeHook{p: p, addr: addr}
}

type pipeHook struct {
	p    *pipelineCounter
	addr string
}

func (h pipeHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h pipeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (h pipeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && (cmds[0].Name() == "hello" || cmds[0].Name() == "client") {
			return next(ctx, cmds) // a new connection's handshake
		}
		h.p.mu.Lock()
		h.p.calls[h.addr]++
		h.p.mu.Unlock()
		return next(ctx, cmds)
	}
}

// TestBatchesOneRoundTripPerNode checks that GetMany, SetMany, Delete and
// GetOrLoadMany over keys in every slot send one pipeline to each master,
// not one command per key.
func TestBatchesOneRoundTripPerNode(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	pc := &pipelineCounter{calls: map[string]int{}}
	rdb := cl.Client(t, func(o *redis.ClusterOptions) {
		o.NewClient = func(opt *redis.Options) *redis.Client {
			c := redis.NewClient(opt)
			c.AddHook(pc.hook(opt.Addr))
			return c
		}
	})
	ctx := ctxT(t)
	// A minute's budget: a loaded machine must not time out a pipeline
	// and send it again, which would count as a second round trip.
	c := mustNew[Channel](t, rdb, packcache.WithRedisTimeout(time.Minute))
	items := map[string]Channel{}
	var keys []string
	for i := range 300 {
		k := fmt.Sprintf("batch:%d", i)
		items[k] = Channel{ID: k}
		keys = append(keys, k)
	}
	check := func(what string, per int, f func() error) {
		t.Helper()
		pc.mu.Lock()
		clear(pc.calls)
		pc.mu.Unlock()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		pc.mu.Lock()
		defer pc.mu.Unlock()
		if len(pc.calls) != 3 {
			t.Fatalf("%s reached %d nodes, want 3: %v", what, len(pc.calls), pc.calls)
		}
		for addr, n := range pc.calls {
			if _, _, err := net.SplitHostPort(addr); err != nil || n != per {
				t.Fatalf("%s sent %d pipelines to %s, want %d (%v)", what, n, addr, per, pc.calls)
			}
		}
	}
	check("SetMany", 1, func() error { return c.SetMany(ctx, items) })
	check("GetMany", 1, func() error {
		got, err := c.GetMany(ctx, keys)
		if err == nil && len(got) != len(keys) {
			err = fmt.Errorf("got %d of %d", len(got), len(keys))
		}
		return err
	})
	check("Delete", 1, func() error { return c.Delete(ctx, keys...) })
	// GetOrLoadMany of missing keys: one pipeline per node to read, one to
	// take the leases, one to release them (fn found nothing). Once first,
	// so that every node knows the lease scripts (a node that does not
	// answers NOSCRIPT, and the cache sends EVAL in one more pipeline).
	var loaded int
	c.GetOrLoadMany(ctx, keys[150:], func(ctx context.Context, missing []string) (map[string]Channel, error) {
		return nil, nil
	})
	check("GetOrLoadMany reads", 3, func() error {
		got, err := c.GetOrLoadMany(ctx, keys[:150], func(ctx context.Context, missing []string) (map[string]Channel, error) {
			loaded = len(missing)
			return map[string]Channel{}, nil
		})
		if err == nil && (len(got) != 0 || loaded != 150) {
			err = fmt.Errorf("got %d, loaded %d", len(got), loaded)
		}
		return err
	})
}

// TestTwoBatchesDeadlockCluster: TestTwoBatchesDeadlock (batch_test.go)
// without any hook, on the cluster: x and y on different nodes. It is the
// first serial test on the shared servers, which TestMain starts in the
// background; here, after the serial tests of batch_test.go and
// close_test.go, it finds them started instead of waiting for the
// cluster's 2 s.
func TestTwoBatchesDeadlockCluster(t *testing.T) {
	var tg redistest.Target
	for _, x := range redistest.Targets(t) {
		if x.Cluster != nil {
			tg = x
		}
	}
	if tg.Cluster == nil {
		t.Skip("no cluster")
	}
	// Two keys on different masters.
	keys := []string{"x"}
	n0 := tg.Cluster.NodeForKey(t, "x")
	for i := 0; ; i++ {
		k := "y" + string(rune('a'+i%26)) + strings.Repeat("z", i/26)
		if tg.Cluster.NodeForKey(t, k) != n0 {
			keys = append(keys, k)
			break
		}
	}
	ctx := ctxT(t)
	fn := func(ctx context.Context, keys []string) (map[string]string, error) {
		m := map[string]string{}
		for _, k := range keys {
			m[k] = "v-" + k
		}
		return m, nil
	}
	c := mustNew[string](t, tg.Client, packcache.WithLoadTimeout(2*time.Second))
	c.GetOrLoadMany(ctx, keys, fn)
	bad := 0
	for round := range 30 {
		if err := c.Delete(ctx, keys...); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var slow atomic.Int64
		start := make(chan struct{})
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				t0 := time.Now()
				_, err := c.GetOrLoadMany(ctx, keys, fn)
				if err != nil || time.Since(t0) > time.Second {
					slow.Add(1)
					t.Logf("round %d: %v after %v", round, err, time.Since(t0))
				}
			}()
		}
		close(start)
		wg.Wait()
		if slow.Load() > 0 {
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%d of 30 rounds of two concurrent GetOrLoadMany hung until the load timeout", bad)
	}
}
