package redistest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The parallel tests spend their time waiting on servers they started
	// (a cluster's 2 s before it is writable, a failover, a restart), not
	// on the CPU: all of them run at once rather than GOMAXPROCS at a
	// time. -parallel on the command line overrides this.
	flag.Parse()
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet {
		flag.Set("test.parallel", "16")
	}
	code := m.Run()
	Shutdown()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "redistest: goroutine leak: %v\n", err)
			code = 1
		}
		if n := liveProcs.Load(); n != 0 {
			fmt.Fprintf(os.Stderr, "redistest: %d redis-server processes still running\n", n)
			code = 1
		}
	}
	os.Exit(code)
}

func haveRedisServer(t *testing.T) {
	t.Helper()
	if findServer() == "" {
		if requireReal() {
			t.Fatalf("%s", requiredMissing())
		}
		t.Skip(serverMissing())
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestStartPingSetGet(t *testing.T) {
	t.Parallel() // servers of its own; after the serial tests, which count processes
	s := Start(t)
	if findServer() != "" && !s.Real() {
		t.Fatal("redis-server is on PATH but Start returned the fallback")
	}
	ctx := ctxT(t, 5*time.Second)
	c := s.Client(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET = %q, %v; want v", got, err)
	}
	u := s.Universal(t)
	if _, ok := u.(*redis.Client); !ok {
		t.Fatalf("Universal returned %T, want *redis.Client", u)
	}
	if got, err := u.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET via Universal = %q, %v", got, err)
	}
}

func TestStartArgs(t *testing.T) {
	t.Parallel() // servers of its own; after the serial tests, which count processes
	haveRedisServer(t)
	s := Start(t, "--maxmemory", "12mb")
	got, err := s.Client(t).ConfigGet(ctxT(t, 5*time.Second), "maxmemory").Result()
	if err != nil || got["maxmemory"] != "12582912" {
		t.Fatalf("CONFIG GET maxmemory = %v, %v", got, err)
	}
	if _, err := os.Stat(s.Dir() + "/redis.log"); err != nil {
		t.Fatalf("log file: %v", err)
	}
}

func TestStartBadArgsReportsLog(t *testing.T) {
	t.Parallel() // servers of its own; after the serial tests, which count processes
	haveRedisServer(t)
	r := runTB(t, func(tb testing.TB) { Start(tb, "--no-such-option", "x") })
	if r.fatal == "" || !strings.Contains(r.fatal, "no-such-option") {
		t.Fatalf("want a fatal message quoting the server's complaint, got %q", r.fatal)
	}
	t.Logf("error message:\n%s", r.fatal)
}

func TestStopRestart(t *testing.T) {
	t.Parallel() // servers of its own; after the serial tests, which count processes
	s := Start(t)
	addr := s.Addr()
	ctx := ctxT(t, 20*time.Second)
	c := s.Client(t, func(o *redis.Options) { o.DialerRetries = 1; o.MaxRetries = -1 })
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Stop(t)
	s.Stop(t) // idempotent
	if err := c.Get(ctx, "k").Err(); err == nil || errors.Is(err, redis.Nil) {
		t.Fatalf("GET on a stopped server: err = %v, want a connection error", err)
	}
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Fatalf("%s still accepts connections after Stop", addr)
	}
	start := time.Now()
	s.Restart(t)
	t.Logf("Restart took %v", time.Since(start))
	if s.Addr() != addr {
		t.Fatalf("Addr changed across Restart: %s -> %s", addr, s.Addr())
	}
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET after Restart: err = %v, want redis.Nil (no persistence)", err)
	}
	if err := c.Set(ctx, "k", "v2", 0).Err(); err != nil {
		t.Fatalf("SET after Restart: %v", err)
	}
	s.Restart(t) // restart while running
	if err := s.Client(t).Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after second Restart: %v", err)
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel() // servers of its own; after the serial tests, which count processes
	s := Start(t)
	RequireReal(t, s, "SIGSTOP")
	c := s.Client(t, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	ctx := ctxT(t, 10*time.Second)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Pause(t)
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	start := time.Now()
	err := c.Get(short, "k").Err()
	cancel()
	elapsed := time.Since(start)
	var ne net.Error
	if err == nil || !(errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("GET on a paused server: err = %v, want a deadline/timeout error", err)
	}
	if elapsed > time.Second {
		t.Fatalf("GET on a paused server took %v, want about 100ms", elapsed)
	}
	t.Logf("paused GET failed after %v with %v", elapsed, err)
	s.Resume(t)
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET after Resume = %q, %v", got, err)
	}
}

func TestPausedServerCleanup(t *testing.T) {
	t.Parallel() // servers of its own; after the serial tests, which count processes
	haveRedisServer(t)
	// A server left paused must still be stopped by the cleanup
	// (TestMain checks that no process survives).
	t.Run("leave paused", func(t *testing.T) {
		s := Start(t)
		s.Pause(t)
	})
}

func TestCommandCount(t *testing.T) {
	t.Parallel() // servers of its own; after the serial tests, which count processes
	s := Start(t)
	RequireReal(t, s, "INFO commandstats")
	ctx := ctxT(t, 5*time.Second)
	c := s.Client(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	s.ResetStats(t)
	for range 5 {
		_ = c.Get(ctx, "missing").Err()
	}
	if n := s.CommandCount(t, "get"); n != 5 {
		t.Fatalf("CommandCount(get) = %d, want 5", n)
	}
	if n := s.CommandCount(t, "GET"); n != 5 {
		t.Fatalf("CommandCount(GET) = %d, want 5", n)
	}
	if n := s.CommandCount(t, "set"); n != 0 {
		t.Fatalf("CommandCount(set) = %d, want 0", n)
	}
	if err := c.ConfigGet(ctx, "maxmemory").Err(); err != nil {
		t.Fatal(err)
	}
	if n := s.CommandCount(t, "config get"); n != 1 {
		t.Fatalf("CommandCount(config get) = %d, want 1", n)
	}
	s.ResetStats(t)
	if n := s.CommandCount(t, "get"); n != 0 {
		t.Fatalf("CommandCount(get) after ResetStats = %d, want 0", n)
	}
	if err := c.Set(ctx, "a", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.FlushAll(t)
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("DBSIZE after FlushAll = %d, %v", n, err)
	}
}

func TestCluster(t *testing.T) {
	t.Parallel() // after the tests that count processes or stop the shared sets
	start := time.Now()
	c := StartCluster(t, 3)
	t.Logf("StartCluster(3) took %v", time.Since(start))
	if len(c.Nodes()) != 3 || len(c.Addrs()) != 3 {
		t.Fatalf("Nodes/Addrs = %d/%d, want 3", len(c.Nodes()), len(c.Addrs()))
	}
	ctx := ctxT(t, 30*time.Second)
	cc := c.Client(t)
	c.ResetStats(t)
	for i := range 200 {
		if err := cc.Set(ctx, fmt.Sprintf("key:%d", i), i, 0).Err(); err != nil {
			t.Fatalf("SET key:%d: %v", i, err)
		}
	}
	for _, n := range c.Nodes() {
		nc := n.Client(t)
		size, err := nc.DBSize(ctx).Result()
		if err != nil || size == 0 {
			t.Fatalf("DBSIZE on %s = %d, %v; want > 0", n.Addr(), size, err)
		}
		info, err := nc.ClusterInfo(ctx).Result()
		if err != nil || !strings.Contains(info, "cluster_state:ok") {
			t.Fatalf("CLUSTER INFO on %s: %v\n%s", n.Addr(), err, info)
		}
		t.Logf("%s holds %d keys", n.Addr(), size)
	}
	if n := c.CommandCount(t, "set"); n != 200 {
		t.Fatalf("cluster CommandCount(set) = %d, want 200", n)
	}
	u := c.Universal(t)
	if _, ok := u.(*redis.ClusterClient); !ok {
		t.Fatalf("Universal returned %T, want *redis.ClusterClient", u)
	}
	if got, err := u.Get(ctx, "key:7").Result(); err != nil || got != "7" {
		t.Fatalf("GET key:7 via Universal = %q, %v", got, err)
	}

	// NodeForKey agrees with the server; stopping that node takes the key
	// down, restarting it brings the cluster back.
	node := c.NodeForKey(t, "key:7")
	if got, err := node.Client(t).Get(ctx, "key:7").Result(); err != nil || got != "7" {
		t.Fatalf("GET key:7 on NodeForKey's node %s = %q, %v", node.Addr(), got, err)
	}
	node.Stop(t)
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	err := cc.Get(short, "key:7").Err()
	cancel()
	if err == nil {
		t.Fatal("GET of a key on a stopped node succeeded")
	}
	start = time.Now()
	node.Restart(t)
	t.Logf("cluster node Restart (until cluster_state:ok everywhere) took %v", time.Since(start))
	if err := cc.Set(ctx, "key:7", "back", 0).Err(); err != nil {
		t.Fatalf("SET after node Restart: %v", err)
	}
	c.FlushAll(t)
	for _, n := range c.Nodes() {
		if size, err := n.Client(t).DBSize(ctx).Result(); err != nil || size != 0 {
			t.Fatalf("DBSIZE on %s after FlushAll = %d, %v", n.Addr(), size, err)
		}
	}
}

// TestSpareClusters: with KeepSpareClusters, StartCluster hands out
// clusters started ahead, each a cluster of its own, healthy and empty,
// and starts the next; stopSpares (Shutdown) stops the one not taken.
func TestSpareClusters(t *testing.T) {
	if findServer() == "" {
		t.Skip("needs redis-server")
	}
	// It sets the package's spares and counts its processes: beside the
	// other tests, but in a process of its own.
	t.Parallel()
	if !Alone(t) {
		return
	}
	KeepSpareClusters(1)
	defer stopSpares()
	before := liveProcs.Load()
	ctx := ctxT(t, 30*time.Second)
	a := StartCluster(t, 3) // in the foreground; a spare starts
	if err := a.Client(t).Set(ctx, "in-a", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	spares.mu.Lock()
	if len(spares.ready) != 1 {
		spares.mu.Unlock()
		t.Fatalf("%d spares started after the first StartCluster, want 1", len(spares.ready))
	}
	sp := spares.ready[0]
	spares.mu.Unlock()
	<-sp.done
	b := StartCluster(t, 3) // the spare; another starts
	if b != sp.c {
		t.Fatal("the second StartCluster did not take the spare")
	}
	if slices.Equal(a.Addrs(), b.Addrs()) {
		t.Fatalf("two StartClusters returned the same nodes %v", a.Addrs())
	}
	if err := b.health(); err != nil {
		t.Fatalf("the spare cluster: %v", err)
	}
	if n, err := b.Client(t).Exists(ctx, "in-a").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS in-a on the spare = %d, %v; want an empty cluster of its own", n, err)
	}
	if err := stopSpares(); err != nil {
		t.Fatal(err)
	}
	if n := liveProcs.Load() - before; n != 6 {
		t.Fatalf("after stopSpares, %d redis-server processes run beside the test's two clusters' 6", n-6)
	}
	if c, err := takeSpare(findServer(), 3); c != nil || err != nil {
		t.Fatalf("after stopSpares, StartCluster still takes spares: %v, %v", c, err)
	}
}

func TestTargets(t *testing.T) {
	t.Parallel() // after TestSharedSets, which stops the shared sets
	haveRedisServer(t)
	start := time.Now()
	ts := Targets(t)
	t.Logf("first Targets call took %v", time.Since(start))
	if len(ts) != 2 || ts[0].Name != "single" || ts[1].Name != "cluster" {
		t.Fatalf("Targets = %+v, want single and cluster", ts)
	}
	if ts[0].Server == nil || ts[0].Cluster != nil || ts[1].Server != nil || ts[1].Cluster == nil {
		t.Fatalf("Targets topology fields wrong: %+v", ts)
	}
	ctx := ctxT(t, 30*time.Second)
	for _, tg := range ts {
		for i := range 20 {
			if err := tg.Client.Set(ctx, fmt.Sprintf("k%d", i), "v", 0).Err(); err != nil {
				t.Fatalf("%s: SET: %v", tg.Name, err)
			}
		}
		tg.ResetStats(t)
		for range 3 {
			if err := tg.Client.Get(ctx, "k1").Err(); err != nil {
				t.Fatalf("%s: GET: %v", tg.Name, err)
			}
		}
		if n := tg.CommandCount(t, "get"); n != 3 {
			t.Fatalf("%s: CommandCount(get) = %d, want 3", tg.Name, n)
		}
	}
	// A test may stop or pause a shared server; the next call heals it.
	ts[0].Server.Stop(t)
	ts[1].Cluster.Nodes()[1].Pause(t)

	start = time.Now()
	ts2 := Targets(t)
	t.Logf("second Targets call (healing a stopped server and a paused cluster node) took %v", time.Since(start))
	if ts2[0].Server != ts[0].Server || ts2[1].Cluster != ts[1].Cluster || ts2[0].Server.Addr() != ts[0].Server.Addr() {
		t.Fatal("second Targets call returned different servers")
	}
	for _, tg := range ts2 {
		for i := range 20 {
			k := fmt.Sprintf("k%d", i)
			if n, err := tg.Client.Exists(ctx, k).Result(); err != nil || n != 0 {
				t.Fatalf("%s: %s survived Targets' flush: n=%d err=%v", tg.Name, k, n, err)
			}
		}
		if n := tg.CommandCount(t, "get"); n != 0 {
			t.Fatalf("%s: CommandCount(get) = %d after Targets, want 0", tg.Name, n)
		}
		if err := tg.Client.Set(ctx, "x", "y", 0).Err(); err != nil {
			t.Fatalf("%s: SET after heal: %v", tg.Name, err)
		}
		tg.FlushAll(t)
	}
	start = time.Now()
	Targets(t)
	t.Logf("third Targets call took %v", time.Since(start))
}

// TestSharedSets: with SharedSets(2), two tests hold Targets at once, each
// on servers of its own; with the default of one set, the second waits
// until the first has ended.
func TestSharedSets(t *testing.T) {
	haveRedisServer(t)
	// It sets the package's shared sets and stops them: beside the other
	// tests, but in a process of its own.
	t.Parallel()
	if !Alone(t) {
		return
	}
	defer Shutdown() // the sets started here are not the other tests' business
	defer SharedSets(1)
	ctx := ctxT(t, 30*time.Second)
	Shutdown()
	for _, n := range []int{1, 2} { // the second round takes the first's set, and starts one
		SharedSets(n)
		var mu sync.Mutex
		var addrs []string
		holding := make(chan struct{}, 2)
		both := make(chan struct{})
		var holders atomic.Int64
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			for i := range 2 {
				t.Run(fmt.Sprint(i), func(t *testing.T) {
					t.Parallel()
					ts := Targets(t)
					if err := ts[0].Client.Set(ctx, "mine", i, 0).Err(); err != nil {
						t.Fatal(err)
					}
					mu.Lock()
					addrs = append(addrs, ts[0].Server.Addr())
					mu.Unlock()
					holding <- struct{}{}
					if n == 2 {
						<-both // a deadlock here is the failure: one set for two
					} else {
						// One set: the other test cannot hold servers
						// until this one ends, which it does after a while.
						if now := holders.Add(1); now > 1 {
							t.Errorf("with one set, %d tests held servers at once", now)
						}
						time.Sleep(100 * time.Millisecond) // holding them, for the other to try
						holders.Add(-1)
					}
					if v, err := ts[0].Client.Get(ctx, "mine").Int(); err != nil || v != i {
						t.Errorf("GET mine = %d, %v; want %d: another test wrote to the servers this one holds", v, err, i)
					}
				})
			}
			go func() { // closes both once the two tests hold servers at once
				<-holding
				<-holding
				close(both)
			}()
		})
		switch {
		case len(addrs) != 2:
			t.Fatalf("%d sets: %d tests got servers, want 2", n, len(addrs))
		case n == 2 && addrs[0] == addrs[1]:
			t.Fatalf("with 2 sets, two tests at once shared the server %s", addrs[0])
		case n == 1 && addrs[0] != addrs[1]:
			t.Fatalf("with 1 set, the tests got different servers %v", addrs)
		}
	}
}

func TestFallback(t *testing.T) {
	old := serverBinary
	serverBinary = "redis-server-missing-for-redistest"
	t.Cleanup(func() { serverBinary = old })
	t.Setenv(RequireEnv, "")
	t.Setenv(ServerEnv, "")

	s := Start(t, "--maxmemory", "1mb")
	if s.Real() {
		t.Fatal("Start returned a real server without redis-server on PATH")
	}
	ctx := ctxT(t, 5*time.Second)
	c := s.Client(t, func(o *redis.Options) { o.DialerRetries = 1; o.MaxRetries = -1 })
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET on miniredis: %v", err)
	}
	s.ResetStats(t)
	s.Stop(t)
	if err := c.Get(ctx, "k").Err(); err == nil || errors.Is(err, redis.Nil) {
		t.Fatalf("GET on a stopped miniredis: %v", err)
	}
	addr := s.Addr()
	s.Restart(t)
	if s.Addr() != addr {
		t.Fatalf("Addr changed across Restart: %s -> %s", addr, s.Addr())
	}
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET after miniredis Restart: %v, want redis.Nil", err)
	}
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.FlushAll(t)
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET after FlushAll: %v, want redis.Nil", err)
	}

	skips := map[string]func(t *testing.T){
		"RequireReal":  func(t *testing.T) { RequireReal(t, s, "this check") },
		"CommandCount": func(t *testing.T) { s.CommandCount(t, "get") },
		"Pause":        func(t *testing.T) { s.Pause(t) },
		"StartCluster": func(t *testing.T) { StartCluster(t, 3) },
	}
	for name, f := range skips {
		var sub *testing.T
		t.Run(name, func(t *testing.T) {
			sub = t
			f(t)
			t.Error("not skipped")
		})
		if !sub.Skipped() {
			t.Errorf("%s did not skip on the fallback", name)
		}
	}

	t.Run("Targets", func(t *testing.T) {
		Shutdown() // forget the real shared servers, if any
		t.Cleanup(Shutdown)
		ts := Targets(t)
		if len(ts) != 1 || ts[0].Name != "single" || ts[0].Server.Real() {
			t.Fatalf("Targets on the fallback = %+v, want one miniredis single target", ts)
		}
		if err := ts[0].Client.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("required", func(t *testing.T) {
		t.Setenv(RequireEnv, "1")
		for name, f := range map[string]func(tb testing.TB){
			"Start":        func(tb testing.TB) { Start(tb) },
			"StartCluster": func(tb testing.TB) { StartCluster(tb, 3) },
			"RequireReal":  func(tb testing.TB) { RequireReal(tb, s, "this check") },
			"Targets":      func(tb testing.TB) { Shutdown(); Targets(tb) },
		} {
			r := runTB(t, f)
			if r.fatal == "" || r.skipped != "" || !strings.Contains(r.fatal, RequireEnv) {
				t.Errorf("%s with %s=1: fatal=%q skipped=%q, want a failure naming %s", name, RequireEnv, r.fatal, r.skipped, RequireEnv)
			}
		}
		Shutdown()
	})
}

// recTB records Fatal and Skip calls instead of ending the test; f runs in
// its own goroutine, which they end with runtime.Goexit.
type recTB struct {
	testing.TB
	mu             sync.Mutex
	fatal, skipped string
}

func (r *recTB) Fatal(a ...any)            { r.end(&r.fatal, fmt.Sprint(a...)) }
func (r *recTB) Fatalf(f string, a ...any) { r.end(&r.fatal, fmt.Sprintf(f, a...)) }
func (r *recTB) FailNow()                  { r.end(&r.fatal, "FailNow") }
func (r *recTB) Skip(a ...any)             { r.end(&r.skipped, fmt.Sprint(a...)) }
func (r *recTB) Skipf(f string, a ...any)  { r.end(&r.skipped, fmt.Sprintf(f, a...)) }
func (r *recTB) SkipNow()                  { r.end(&r.skipped, "SkipNow") }

func (r *recTB) end(dst *string, msg string) {
	r.mu.Lock()
	*dst = msg
	r.mu.Unlock()
	runtime.Goexit()
}

func runTB(t *testing.T, f func(tb testing.TB)) *recTB {
	r := &recTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r
}

// TestClusterWithReplicas: every master has its replica in sync; a paused
// master's replica is promoted while it stays paused, and holds the keys
// written before the pause; the cleanup resumes and stops every node.
func TestClusterWithReplicas(t *testing.T) {
	t.Parallel() // after the tests that count processes or stop the shared sets
	start := time.Now()
	var c *Cluster
	func() {
		startingAhead.Lock()
		defer startingAhead.Unlock()
		c = StartClusterWithReplicas(t, 3, 1)
	}()
	t.Logf("StartClusterWithReplicas(3, 1) took %v", time.Since(start))
	if len(c.Nodes()) != 3 || len(c.Addrs()) != 6 {
		t.Fatalf("Nodes/Addrs = %d/%d, want 3/6", len(c.Nodes()), len(c.Addrs()))
	}
	ctx := ctxT(t, 60*time.Second)
	cc := c.Client(t)
	if err := cc.Set(ctx, "key:7", "7", 0).Err(); err != nil {
		t.Fatal(err)
	}
	m := c.NodeForKey(t, "key:7")
	rs := c.Replicas(m)
	if len(rs) != 1 {
		t.Fatalf("Replicas = %d, want 1", len(rs))
	}
	r := rs[0]
	rc := r.Client(t)
	// WaitReplicated waits for every write, on whichever connection it
	// was made: not while the replica is paused.
	r.Pause(t)
	if err := cc.Set(ctx, "key:7", "8", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if res := runTB(t, func(tb testing.TB) { c.WaitReplicated(tb, m, 200*time.Millisecond) }); res.fatal == "" {
		t.Error("WaitReplicated returned while the replica was paused")
	}
	r.Resume(t)
	c.WaitReplicated(t, m, 10*time.Second)
	if role, err := rc.Do(ctx, "ROLE").Slice(); err != nil || role[0] != "slave" {
		t.Fatalf("ROLE on the replica = %v, %v", role, err)
	}
	m.Pause(t)
	paused := time.Now()
	promoted := c.WaitPromoted(t, r, 30*time.Second)
	t.Logf("replica promoted %v after its master was paused", promoted.Sub(paused))
	if !m.isPaused() {
		t.Fatal("the master is no longer paused")
	}
	if role, err := rc.Do(ctx, "ROLE").Slice(); err != nil || role[0] != "master" {
		t.Fatalf("ROLE on the promoted replica = %v, %v", role, err)
	}
	if v, err := rc.Get(ctx, "key:7").Result(); err != nil || v != "8" {
		repl, _ := r.admin.doString(adminTimeout, "INFO", "replication")
		nodes, _ := r.admin.doString(adminTimeout, "CLUSTER", "NODES")
		t.Fatalf("GET key:7 on the promoted replica = %q, %v (want the 8 written last)\n--- its INFO replication ---\n%s\n--- its CLUSTER NODES ---\n%s\n--- its log ---\n%s",
			v, err, repl, nodes, tail(r.logPath(), 0))
	}
}

// startingAhead is held by TestClusterWithReplicasStartedAhead from
// starting its cluster ahead until it has taken it, and by
// TestClusterWithReplicas while it starts its own of the same shape, which
// would otherwise take the one started ahead (CI's run failed so).
var startingAhead sync.Mutex

// TestClusterWithReplicasStartedAhead: StartClusterWithReplicas takes the
// cluster PrestartClustersWithReplicas started, with every node's timeout
// the 1 s of one it starts itself (also for a restart), healthy, every
// replica of its master; and the next call, none being left, starts one.
func TestClusterWithReplicasStartedAhead(t *testing.T) {
	t.Parallel() // after the tests that count processes or stop the shared sets
	haveRedisServer(t)
	var sp *spare
	var c *Cluster
	func() {
		startingAhead.Lock()
		defer startingAhead.Unlock()
		PrestartClustersWithReplicas(3, 1, 1)
		ahead.mu.Lock()
		sp = ahead.ready[[2]int{3, 1}][0]
		ahead.mu.Unlock()
		c = StartClusterWithReplicas(t, 3, 1)
	}()
	if c != sp.c {
		t.Fatal("StartClusterWithReplicas did not take the cluster started ahead")
	}
	for _, s := range c.all() {
		kv, err := s.admin.do(adminTimeout, "CONFIG", "GET", "cluster-node-timeout")
		if err != nil {
			t.Fatal(err)
		}
		if v := fmt.Sprint(kv); v != "[cluster-node-timeout 1000]" || s.nodeTimeout != failoverNodeTimeout {
			t.Fatalf("%s: CONFIG GET = %s, restart timeout %v; want 1000 ms", s.addr, v, s.nodeTimeout)
		}
	}
	if err := c.health(); err != nil {
		t.Fatal(err)
	}
	ahead.mu.Lock()
	left := len(ahead.ready[[2]int{3, 1}])
	ahead.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d clusters started ahead left, want 0", left)
	}
	if c2, err := takeAhead(3, 1); c2 != nil || err != nil {
		t.Fatalf("takeAhead with none left = %v, %v; want nil, nil (StartClusterWithReplicas starts one)", c2, err)
	}
}
