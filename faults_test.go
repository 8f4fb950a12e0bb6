package packcache_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// Fault-injection tests: each drives redis-server processes of its own
// (stopped, paused, restarted) and checks that the cache's protections hold.
// They need a real redis-server and skip on the miniredis fallback.

// waitGoroutines waits up to d for the goroutine count to fall to at most
// want, and returns the last count seen.
func waitGoroutines(want int, d time.Duration) int {
	var n int
	eventually(d, func() bool { n = runtime.NumGoroutine(); return n <= want })
	return n
}

// isKeyErr reports whether err is a *packcache.Error naming key.
func isKeyErr(err error, key string) bool {
	var e *packcache.Error
	return errors.As(err, &e) && e.Key == key && strings.Contains(err.Error(), strconv.Quote(key))
}

// TestFaultRedisKilledMidSurge stops Redis while 400 goroutines are Getting
// through a loader-less cache and a read-through cache. No Get may hang
// until its context ends: each is bounded by the Redis budget. After the
// stop, a loader-less Get fails with ErrRedis naming the key and a
// read-through Get gets the loaded value; once Redis is back the same
// caches work again; after Close nothing of theirs is left running.
//
// The checks after the stop are made by one goroutine, in order, not
// sampled from the surge, so that a loaded machine cannot make them miss.
func TestFaultRedisKilledMidSurge(t *testing.T) {
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "stops the server mid-surge")
	rdb := s.Client(t, func(o *redis.Options) { o.DialTimeout = 250 * time.Millisecond })
	ctx := ctxT(t)
	const keys = 64
	budget := 300 * time.Millisecond
	plain := mustNew[Channel](t, rdb, packcache.WithRedisTimeout(budget), packcache.WithCircuitBreaker(5, 200*time.Millisecond))
	var loads atomic.Int64
	rt := mustNew[Channel](t, rdb, packcache.WithRedisTimeout(budget), packcache.WithCircuitBreaker(5, 200*time.Millisecond),
		packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
			loads.Add(1)
			return Channel{ID: key, Title: "loaded"}, nil
		})))
	for i := range keys {
		for _, k := range []string{fmt.Sprintf("surge:%d", i), fmt.Sprintf("quiet:%d", i)} {
			if err := plain.Set(ctx, k, Channel{ID: k, Title: "stored"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	baseline := runtime.NumGoroutine()

	const (
		workers = 400
		perCall = 10 * time.Second
	)
	var (
		done   = make(chan struct{})
		mu     sync.Mutex
		bad    []string
		maxLat atomic.Int64
		calls  atomic.Int64
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		if len(bad) < 20 {
			bad = append(bad, fmt.Sprintf(format, args...))
		}
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			readThrough := w%2 == 1
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				k := fmt.Sprintf("surge:%d", (w+i)%keys)
				cctx, cancel := context.WithTimeout(ctx, perCall)
				start := time.Now()
				var v Channel
				var err error
				if readThrough {
					v, err = rt.Get(cctx, k)
				} else {
					v, err = plain.Get(cctx, k)
				}
				lat := time.Since(start)
				cancel()
				calls.Add(1)
				for {
					m := maxLat.Load()
					if int64(lat) <= m || maxLat.CompareAndSwap(m, int64(lat)) {
						break
					}
				}
				switch {
				case errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, packcache.ErrRedis):
					fail("%s: Get hung until its context ended (%v): %v", k, lat, err)
				case readThrough && (err != nil || v.ID != k):
					fail("read-through Get %s = %+v, %v", k, v, err)
				case !readThrough && err == nil && v.ID != k:
					fail("Get %s returned %+v", k, v)
				case !readThrough && err != nil && (!errors.Is(err, packcache.ErrRedis) || !isKeyErr(err, k)):
					fail("loader-less Get %s: %v, want ErrRedis naming the key", k, err)
				}
			}
		})
	}
	waitFor(t, 10*time.Second, "the surge under way", func() bool { return calls.Load() >= 200 })
	s.Stop(t)
	atStop := calls.Load()
	waitFor(t, 10*time.Second, "Gets against the dead server", func() bool { return calls.Load() >= atStop+500 })
	close(done)
	wg.Wait()
	t.Logf("%d Gets; slowest %v; loads %d", calls.Load(), time.Duration(maxLat.Load()), loads.Load())
	for _, b := range bad {
		t.Error(b)
	}

	// With Redis down, in order: a loader-less Get fails with ErrRedis
	// naming its key, and a read-through Get answers from the loader. Of
	// keys the surge did not read: a read of the surge's, begun less than
	// the share window before, would answer them with its value (CI's
	// run on Valkey did so, the last Gets coming within 10 ms).
	if v, err := plain.Get(ctx, "quiet:3"); !errors.Is(err, packcache.ErrRedis) || !isKeyErr(err, "quiet:3") {
		t.Errorf("loader-less Get with Redis down: %+v, %v, want ErrRedis naming the key", v, err)
	}
	if v, err := rt.Get(ctx, "quiet:4"); err != nil || v.Title != "loaded" {
		t.Errorf("read-through Get with Redis down: %+v, %v", v, err)
	}

	// The same caches work again once Redis is back.
	s.Restart(t)
	restartAt := time.Now()
	// go-redis, after a run of failed dials, answers new dials with the
	// last dial error until its background redial (once a second)
	// succeeds, so allow it a little more than that.
	waitFor(t, 5*time.Second, "a Set succeeding after restart", func() bool {
		return plain.Set(ctx, "after", Channel{ID: "after"}) == nil
	})
	// The Sets that failed made "after" pending: until its invalidation
	// lands (sparing the Set that succeeded), Gets are misses.
	waitFor(t, 2*time.Second, "Get after restart returning the Set's value", func() bool {
		v, err := plain.Get(ctx, "after")
		return err == nil && v.ID == "after"
	})
	if v, err := rt.Get(ctx, "surge:1"); err != nil || v.ID != "surge:1" {
		t.Fatalf("read-through Get after restart: %+v, %v", v, err)
	}
	t.Logf("working again %v after restart", time.Since(restartAt))

	// Close waits for the caches' detached work; then nothing of theirs may
	// be left running, and calls fail with ErrClosed.
	if err := plain.Close(); err != nil {
		t.Fatal(err)
	}
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	if n := waitGoroutines(baseline+5, 3*time.Second); n > baseline+5 {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines after the surge, %d before:\n%s", n, baseline, buf[:runtime.Stack(buf, true)])
	}
	if _, err := rt.Get(ctx, "surge:1"); !errors.Is(err, packcache.ErrClosed) {
		t.Fatalf("Get after Close: %v, want ErrClosed", err)
	}
}

// TestFaultPausedRedisDeadlines suspends Redis (SIGSTOP) under 50 coalesced
// callers of one key whose deadlines run from 10 ms to 500 ms: each must
// leave with context.DeadlineExceeded at its own deadline (not when the
// first leaves, nor when the shared read gives up), and a Get works after
// Resume.
func TestFaultPausedRedisDeadlines(t *testing.T) {
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "pauses the server")
	rdb := s.Client(t)
	ctx := ctxT(t)
	c := mustNew[Channel](t, rdb)
	want := makeChannel(7, 4<<10)
	if err := c.Set(ctx, "slow", want); err != nil {
		t.Fatal(err)
	}
	s.Pause(t)
	paused := true
	defer func() {
		if paused {
			s.Resume(t)
		}
	}()

	const n = 50
	type outcome struct {
		deadline, took time.Duration
		err            error
	}
	out := make([]outcome, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		d := 10*time.Millisecond + time.Duration(i)*490*time.Millisecond/(n-1)
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			_, err := c.Get(cctx, "slow")
			out[i] = outcome{d, time.Since(start), err}
		})
	}
	wg.Wait()
	// The shared read is still waiting for the paused server: its budget
	// (mustNew's) is a minute, and it counts a Redis error only when that
	// ends. So no caller was held until the read gave up, and none left
	// before its own deadline. (How late past its deadline each returned
	// is the scheduler's business on a busy machine: logged, not judged.)
	if n := c.Stats().RedisErrors; n != 0 {
		t.Errorf("RedisErrors = %d when the last caller returned: callers waited for the shared read to give up", n)
	}
	worst := time.Duration(0)
	for i, o := range out {
		late := o.took - o.deadline
		worst = max(worst, late)
		if !errors.Is(o.err, context.DeadlineExceeded) {
			t.Errorf("caller %d (deadline %v): err = %v, want context.DeadlineExceeded", i, o.deadline, o.err)
		}
		if o.took < o.deadline-5*time.Millisecond {
			t.Errorf("caller %d with deadline %v returned after %v, before its deadline", i, o.deadline, o.took)
		}
	}
	t.Logf("50 callers, deadlines 10ms..500ms: latest return %v after its deadline", worst)
	if cw := c.Stats().CoalescedWaits; cw == 0 {
		t.Errorf("CoalescedWaits = 0: the callers did not share reads")
	}

	s.Resume(t)
	paused = false
	waitFor(t, 6*time.Second, "Get answering after Resume", func() bool {
		v, err := c.Get(ctx, "slow")
		return err == nil && v.ID == want.ID && len(v.Messages) == len(want.Messages)
	})
}

// TestClusterMasterStopped stops one master of a 3-master cluster: keys on
// the other masters must still be served, and keys in the lost slots must
// fail promptly with ErrRedis naming the key.
func TestClusterMasterStopped(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	// By default a cluster that loses slots refuses every command
	// (CLUSTERDOWN) once the other masters agree the node failed; a
	// deployment that wants partial availability turns that off, and that
	// is the case where the cache must keep serving the healthy slots.
	cl.AllowPartialCoverage(t)
	rdb := cl.Client(t, func(o *redis.ClusterOptions) {
		o.DialTimeout = 200 * time.Millisecond
		o.ReadTimeout = 300 * time.Millisecond
		o.WriteTimeout = 300 * time.Millisecond
		o.MaxRedirects = 2
		// go-redis retries a refused dial 5 times with backoff by
		// default, and the command as well: that alone can take seconds.
		o.MaxRetries = -1
		o.DialerRetries = 1
		o.DialerRetryTimeout = 10 * time.Millisecond
	})
	ctx := ctxT(t)
	c := mustNew[Channel](t, rdb, packcache.WithCircuitBreaker(packcache.Off, 0))
	const nkeys = 300
	victim := cl.Nodes()[1]
	var lost, kept []string
	for i := range nkeys {
		k := fmt.Sprintf("user:{%d}:doc", i)
		if err := c.Set(ctx, k, makeChannel(uint64(i), 2<<10)); err != nil {
			t.Fatal(err)
		}
		if cl.NodeForKey(t, k) == victim {
			lost = append(lost, k)
		} else {
			kept = append(kept, k)
		}
	}
	if len(lost) == 0 || len(kept) == 0 {
		t.Fatalf("keys split %d lost / %d kept", len(lost), len(kept))
	}
	victim.Stop(t)
	if len(lost) > 30 {
		lost = lost[:30] // each costs a refused dial and a slot-map reload
	}

	check := func(phase string) {
		t.Helper()
		start := time.Now()
		var slowest time.Duration
		for _, k := range kept {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			t0 := time.Now()
			v, err := c.Get(cctx, k)
			slowest = max(slowest, time.Since(t0))
			cancel()
			if err != nil || v.ID == "" {
				t.Fatalf("%s: Get of %s on a healthy master: %v", phase, k, err)
			}
		}
		for _, k := range lost {
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			t0 := time.Now()
			_, err := c.Get(cctx, k)
			took := time.Since(t0)
			slowest = max(slowest, took)
			cancel()
			if !errors.Is(err, packcache.ErrRedis) || !isKeyErr(err, k) {
				t.Fatalf("%s: Get of %s in a lost slot: %v, want ErrRedis naming the key", phase, k, err)
			}
			if errors.Is(err, context.DeadlineExceeded) || took > 1500*time.Millisecond {
				t.Fatalf("%s: Get of %s took %v: %v", phase, k, took, err)
			}
		}
		t.Logf("%s: %d Gets on healthy masters ok, %d in lost slots failed with ErrRedis, in %v (slowest %v)",
			phase, len(kept), len(lost), time.Since(start), slowest)
	}
	check("just stopped")
	// Once the others mark the node as failed (node timeout 1 s), they
	// answer its slots with CLUSTERDOWN instead of the client failing to
	// dial; both must be ErrRedis, and the healthy slots stay served.
	var others []*redis.Client
	for _, n := range cl.Nodes() {
		if n != victim {
			others = append(others, n.Client(t))
		}
	}
	waitFor(t, 10*time.Second, "the other masters marking the stopped one failed", func() bool {
		for _, o := range others {
			if !markedFailed(t, o, victim) {
				return false
			}
		}
		return true
	})
	check("marked failed")
}

// markedFailed reports whether n's view of the cluster flags the node at
// victim's address as failed (FAIL, agreed by the masters, not only PFAIL).
func markedFailed(t *testing.T, n *redis.Client, victim *redistest.Server) bool {
	nodes, err := n.ClusterNodes(context.Background()).Result()
	if err != nil {
		t.Fatalf("CLUSTER NODES on %s: %v", n.Options().Addr, err)
	}
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && strings.HasPrefix(f[1], victim.Addr()+"@") {
			return slices.Contains(strings.Split(f[2], ","), "fail")
		}
	}
	return false
}

// TestPoolExhaustion gives the cache a 2-connection pool whose own wait
// for a connection is 50 ms: 5,000 goroutines Get distinct keys (no
// coalescing) while the server is paused for 300 ms. The cache asks the
// pool for no more connections than it holds (the rest wait their turn in
// the cache, under their own contexts), so no Get fails with the pool's
// timeout, none fails at all, nothing deadlocks, and every Get answers
// once the server resumes.
func TestPoolExhaustion(t *testing.T) {
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "pauses the server")
	rdb := s.Client(t, func(o *redis.Options) {
		o.PoolSize = 2
		o.PoolTimeout = 50 * time.Millisecond
		o.MaxRetries = -1 // each pool timeout is the caller's error
	})
	ctx := ctxT(t)
	c := mustNew[Channel](t, rdb, packcache.WithCoalescing(false), packcache.WithCircuitBreaker(packcache.Off, 0))
	for i := range 100 {
		if err := c.Set(ctx, fmt.Sprintf("pool:%d", i), Channel{ID: fmt.Sprintf("pool:%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	baseline := runtime.NumGoroutine()
	const n = 5000
	var okN, missN, poolN, otherRedisN, started atomic.Int64
	var mu sync.Mutex
	var bad []string
	s.Pause(t)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			k := fmt.Sprintf("pool:%d", i)
			cctx, cancel := context.WithTimeout(ctx, time.Minute) // two connections serve them all, one after another
			defer cancel()
			started.Add(1)
			v, err := c.Get(cctx, k)
			switch {
			case err == nil && v.ID == k:
				okN.Add(1)
			case errors.Is(err, packcache.ErrMiss):
				missN.Add(1)
			case errors.Is(err, packcache.ErrRedis) && isKeyErr(err, k):
				if errors.Is(err, redis.ErrPoolTimeout) {
					poolN.Add(1)
				} else if otherRedisN.Add(1) <= 3 {
					t.Logf("a Redis error other than a pool timeout: %v", err)
				}
			default:
				mu.Lock()
				if len(bad) < 10 {
					bad = append(bad, fmt.Sprintf("Get %s = %+v, %v", k, v, err))
				}
				mu.Unlock()
			}
		})
	}
	// Every Get under way before the server resumes, and for longer than
	// the pool's timeout: a gap in time, not a wait for the Gets.
	waitFor(t, time.Minute, "every Get under way", func() bool { return started.Load() == n })
	time.Sleep(300*time.Millisecond - time.Since(start))
	s.Resume(t)
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(time.Minute):
		t.Fatal("Gets still blocked a minute after Resume: deadlock")
	}
	t.Logf("%d Gets in %v: %d values, %d misses, %d pool timeouts, %d other Redis errors",
		n, time.Since(start), okN.Load(), missN.Load(), poolN.Load(), otherRedisN.Load())
	for _, b := range bad {
		t.Error(b)
	}
	if poolN.Load() != 0 || otherRedisN.Load() != 0 {
		t.Errorf("%d Gets failed with the pool's timeout and %d with another Redis error: want none (the cache's Redis budget is a minute, and it does not ask a full pool)", poolN.Load(), otherRedisN.Load())
	}
	if okN.Load() != 100 || missN.Load() != n-100 {
		t.Errorf("%d values and %d misses, want 100 and %d", okN.Load(), missN.Load(), n-100)
	}
	for i := range 100 {
		k := fmt.Sprintf("pool:%d", i)
		if v, err := c.Get(ctx, k); err != nil || v.ID != k {
			t.Fatalf("Get %s after Resume: %+v, %v", k, v, err)
		}
	}
	if g := waitGoroutines(baseline+5, 3*time.Second); g > baseline+5 {
		t.Errorf("%d goroutines left, %d before", g, baseline)
	}
}

// TestBreakerReadThrough stops Redis under a read-through cache with
// WithCircuitBreaker(3, 200ms): once the breaker opens, Gets answer from the
// loader without touching Redis (1,000 of them in well under a second),
// and after a restart the cache goes back to Redis within the cool-down.
// The client makes one dial and no retries: go-redis's own retries of a
// refused dial are TestUnreachableRedisNamesCauseAndCostsLittle's subject.
func TestBreakerReadThrough(t *testing.T) {
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "stops and restarts the server")
	rdb := s.Client(t, func(o *redis.Options) {
		o.DialTimeout = 500 * time.Millisecond
		o.MaxRetries, o.DialerRetries = -1, 1
	})
	ctx := ctxT(t)
	var loads atomic.Int64
	c := mustNew[Channel](t, rdb, packcache.WithCircuitBreaker(3, 200*time.Millisecond),
		packcache.WithShareWindow(packcache.Off),
		packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
			loads.Add(1)
			return Channel{ID: key, Title: "from loader"}, nil
		})))
	if _, err := c.Get(ctx, "b:0"); err != nil {
		t.Fatal(err)
	}
	s.Stop(t)
	// Open the breaker; time the failing calls that do it.
	t0 := time.Now()
	for i := range 3 {
		if v, err := c.Get(ctx, fmt.Sprintf("b:%d", i)); err != nil || v.Title != "from loader" {
			t.Fatalf("Get with Redis down: %+v, %v", v, err)
		}
	}
	perFailure := time.Since(t0) / 3
	errsBefore := c.Stats().RedisErrors
	loadsBefore := loads.Load()
	start := time.Now()
	for i := range 1000 {
		k := fmt.Sprintf("b:%d", i%50)
		v, err := c.Get(ctx, k)
		if err != nil || v.ID != k || v.Title != "from loader" {
			t.Fatalf("Get %d with the breaker open: %+v, %v", i, v, err)
		}
	}
	took := time.Since(start)
	probes := c.Stats().RedisErrors - errsBefore
	t.Logf("a Get against the stopped server took %v; 1000 Gets with the breaker open took %v (%d probes reached Redis, %d loads)",
		perFailure, took, probes, loads.Load()-loadsBefore)
	// How fast Gets are with the breaker open is a benchmark's subject
	// (BenchmarkDeleteBreakerOpen); here, what they cost Redis: one probe
	// per cool-down at most, however long a busy machine took to make them.
	if maxProbes := uint64(took/(200*time.Millisecond)) + 2; probes > maxProbes {
		t.Errorf("%d calls reached Redis with the breaker open, want at most %d", probes, maxProbes)
	}
	if got := loads.Load() - loadsBefore; got != 1000 {
		t.Errorf("loader called %d times for 1000 Gets, want 1000", got)
	}

	s.Restart(t)
	back := time.Now()
	hits := c.Stats().Hits
	waitFor(t, 15*time.Second, "a Get answered from Redis after restart", func() bool {
		if v, err := c.Get(ctx, "b:back"); err != nil || v.ID != "b:back" {
			t.Fatalf("Get after restart: %+v, %v", v, err)
		}
		return c.Stats().Hits > hits
	})
	t.Logf("Gets hit Redis again %v after restart", time.Since(back))
}

// TestTLSWithACLUser runs redis-server with TLS (a CA and server
// certificate made here) and an ACL user, and uses the cache over it.
func TestTLSWithACLUser(t *testing.T) {
	t.Parallel()
	_, tlsAddr, roots := startTLS(t, "--user", "cacheuser", "on", ">s3cret-pw", "~*", "&*", "+@all")
	newClient := func(user, pw string, conf *tls.Config) *redis.Client {
		rc := redis.NewClient(&redis.Options{
			Addr: tlsAddr, Username: user, Password: pw, TLSConfig: conf,
			DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1,
			ContextTimeoutEnabled: true,
		})
		t.Cleanup(func() { rc.Close() })
		return rc
	}
	ctx := ctxT(t)
	rdb := newClient("cacheuser", "s3cret-pw", &tls.Config{RootCAs: roots, ServerName: "localhost", MinVersion: tls.VersionTLS12})
	if who, err := rdb.Do(ctx, "ACL", "WHOAMI").Text(); err != nil || who != "cacheuser" {
		t.Fatalf("ACL WHOAMI over TLS = %q, %v", who, err)
	}
	c := mustNew[Channel](t, rdb, packcache.WithCodec(codec.Zstd))
	want := makeChannel(3, 64<<10)
	if err := c.Set(ctx, "tls:doc", want); err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(ctx, "tls:doc")
	if err != nil || got.ID != want.ID || len(got.Messages) != len(want.Messages) {
		t.Fatalf("Get over TLS: %v", err)
	}
	if raw := rawGet(t, rdb, "tls:doc"); raw[0] != codec.HeaderZstd {
		t.Fatalf("stored value starts with 0x%02x, want zstd", raw[0])
	}
	// The credentials and the certificate are really checked.
	if err := newClient("cacheuser", "wrong", &tls.Config{RootCAs: roots, ServerName: "localhost"}).Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("wrong password: %v", err)
	}
	if err := newClient("cacheuser", "s3cret-pw", &tls.Config{ServerName: "localhost"}).Ping(ctx).Err(); err == nil {
		t.Error("server certificate from an unknown CA accepted")
	}
	if err := newClient("cacheuser", "s3cret-pw", nil).Ping(ctx).Err(); err == nil {
		t.Error("plaintext connection to the TLS port succeeded")
	}
}

// writeTestPKI makes a self-signed CA and a server certificate for
// localhost and 127.0.0.1 signed by it, writes the server's certificate and
// key to dir, and returns the CA certificate (PEM) and the two file names.
// startTLS starts a redis-server with TLS (a CA and server certificate
// made here) beside its plain port, with args, and returns it, its TLS
// address and the CA's pool; it skips the test where the server has no
// TLS.
func startTLS(t *testing.T, args ...string) (*redistest.Server, string, *x509.CertPool) {
	t.Helper()
	redistest.RequireServer(t, "starts redis-server with TLS")
	if ok, why := redistest.ServerHasTLS(); !ok {
		t.Skip("TLS test skipped: " + why)
	}
	dir := t.TempDir()
	caPEM, certFile, keyFile := writeTestPKI(t, dir)
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tlsPort := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := redistest.Start(t, append([]string{
		"--tls-port", strconv.Itoa(tlsPort),
		"--tls-cert-file", certFile,
		"--tls-key-file", keyFile,
		"--tls-ca-cert-file", caFile,
		"--tls-auth-clients", "no",
	}, args...)...)
	redistest.RequireReal(t, s, "starts redis-server with TLS")
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	return s, net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort)), roots
}

func writeTestPKI(t *testing.T, dir string) (caPEM []byte, certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "packcache test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile = filepath.Join(dir, "server.pem")
	keyFile = filepath.Join(dir, "server.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), certFile, keyFile
}

// slowGetHook delays the reply of the first GET it sees while armed, as a
// descheduled goroutine or a slow network would: the read is done in Redis
// but its caller has not yet heard.
type slowGetHook struct {
	armed atomic.Bool
	delay time.Duration
}

func (h *slowGetHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *slowGetHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if cmd.Name() == "get" && h.armed.CompareAndSwap(true, false) {
				time.Sleep(h.delay)
				break
			}
		}
		return err
	}
}
func (h *slowGetHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "get" && h.armed.CompareAndSwap(true, false) {
			time.Sleep(h.delay)
		}
		return err
	}
}

// TestFaultSlowReadAfterWrite: a loader-less Get whose GET has run (a miss)
// but whose reply is slow is still under way when a write to the key
// completes in this process. A Get that begins after the write returned must
// see the write, not join the stale read. Set and Delete end the sharing of
// reads under way (forget); a GetOrLoad whose load stores must too.
func TestFaultSlowReadAfterWrite(t *testing.T) {
	t.Parallel()
	for _, write := range []string{"Set", "GetOrLoad"} {
		t.Run(write, func(t *testing.T) {
			s := redistest.Start(t)
			hook := &slowGetHook{delay: 300 * time.Millisecond}
			rdb := s.Client(t)
			rdb.AddHook(hook)
			ctx := ctxT(t)
			c := mustNew[Channel](t, rdb)
			hook.armed.Store(true)
			first := make(chan error, 1)
			go func() { _, err := c.Get(ctx, "k"); first <- err }()
			waitFor(t, 5*time.Second, "the slow GET sent", func() bool { return !hook.armed.Load() })
			want := Channel{ID: "written"}
			switch write {
			case "Set":
				if err := c.Set(ctx, "k", want); err != nil {
					t.Fatal(err)
				}
			case "GetOrLoad":
				v, err := c.GetOrLoad(ctx, "k", func(context.Context) (Channel, error) { return want, nil })
				if err != nil || v.ID != want.ID {
					t.Fatalf("GetOrLoad = %+v, %v", v, err)
				}
			}
			if raw := rawGet(t, rdb, "k"); len(raw) == 0 {
				t.Fatal("write not stored")
			}
			v, err := c.Get(ctx, "k")
			if e := <-first; !errors.Is(e, packcache.ErrMiss) {
				t.Errorf("the slow Get begun before the write: %v, want ErrMiss", e)
			}
			if err != nil || v.ID != want.ID {
				t.Fatalf("Get after %s returned: %+v, %v; want the written value", write, v, err)
			}
		})
	}
}

// TestUnreachableRedisNamesCauseAndCostsLittle: with Redis stopped and the
// go-redis client at its defaults (five dial attempts a connection, three
// retries a command), a Get's error names the refused connection, not
// only the budget running out; and the refusal opens the node's breaker at
// once, so that of ten read-through Gets at most the first waits out the
// budget and the others answer from the loader at once. On the cluster,
// only the stopped master's breaker opens.
func TestUnreachableRedisNamesCauseAndCostsLittle(t *testing.T) {
	const budget = 2 * time.Second
	loader := packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
		return Channel{ID: key, Title: "loaded"}, nil
	}))
	check := func(t *testing.T, rdb redis.UniversalClient, keys []string, stop func()) {
		ctx := ctxT(t)
		// No share window: a Get right after the stop must not share the
		// read made just before it.
		c := mustNew[Channel](t, rdb, loader, packcache.WithRedisTimeout(budget), packcache.WithCircuitBreaker(5, time.Minute), packcache.WithShareWindow(packcache.Off))
		plain := mustNew[Channel](t, rdb, packcache.WithRedisTimeout(budget), packcache.WithCircuitBreaker(5, time.Minute), packcache.WithShareWindow(packcache.Off))
		for _, k := range keys { // connections made while Redis answers
			c.Get(ctx, k)
			plain.Get(ctx, k)
		}
		stop()
		// The cache without a loader waits out its own first refusal
		// beside the read-through one (their breakers are their own).
		plainErr := make(chan error, 1)
		go func() { _, err := plain.Get(ctx, keys[0]); plainErr <- err }()
		slow := 0
		for _, k := range keys {
			start := time.Now()
			v, err := c.Get(ctx, k)
			if err != nil || v.Title != "loaded" {
				t.Fatalf("read-through Get of %s with Redis stopped: %+v, %v", k, v, err)
			}
			if time.Since(start) >= budget/2 {
				slow++
			}
		}
		if slow > 1 {
			t.Fatalf("%d of %d read-through Gets waited for the Redis budget: a refused connection should open the breaker at once", slow, len(keys))
		}
		err := <-plainErr
		switch {
		case !errors.Is(err, packcache.ErrRedis):
			t.Fatalf("Get without a loader: %v, want ErrRedis", err)
		case errors.Is(err, packcache.ErrCircuitOpen):
			// Another call's refusal opened it first; the cause is named
			// by the calls that tried.
		case !errors.Is(err, syscall.ECONNREFUSED) || !strings.Contains(err.Error(), "connection refused") || !isKeyErr(err, keys[0]):
			t.Fatalf("Get without a loader: %q: want the key and the refused connection named", err)
		}
		var named bool
		for _, k := range keys[1:] {
			if _, err := plain.Get(ctx, k); errors.Is(err, syscall.ECONNREFUSED) && strings.Contains(err.Error(), "connection refused") {
				named = true
			}
		}
		if !named && !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("no error named the refused connection: %v", err)
		}
	}
	t.Run("single", func(t *testing.T) {
		s := redistest.Start(t)
		redistest.RequireReal(t, s, "stops the server")
		keys := make([]string, 10)
		for i := range keys {
			keys[i] = fmt.Sprintf("unreachable:%d", i)
		}
		check(t, s.Universal(t), keys, func() { s.Stop(t) })
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3)
		cl.AllowPartialCoverage(t)
		rdb := cl.Client(t)
		victim := cl.Nodes()[1]
		var keys, kept []string
		for i := 0; len(keys) < 10 || len(kept) < 5; i++ {
			k := fmt.Sprintf("unreachable:{%d}", i)
			if cl.NodeForKey(t, k) == victim {
				keys = append(keys, k)
			} else {
				kept = append(kept, k)
			}
		}
		check(t, rdb, keys[:10], func() { victim.Stop(t) })
		// The other masters' keys are read from Redis as before.
		ctx := ctxT(t)
		plain := mustNew[Channel](t, rdb)
		for _, k := range kept {
			if err := plain.Set(ctx, k, Channel{ID: k}); err != nil {
				t.Fatalf("Set of %s on a healthy master: %v", k, err)
			}
			if v, err := plain.Get(ctx, k); err != nil || v.ID != k {
				t.Fatalf("Get of %s on a healthy master: %+v, %v", k, v, err)
			}
		}
	})
}

// TestBreakerCountsCallerDeadline: a call whose caller's deadline passes
// while Redis is paused does not count against the breaker, even at a
// threshold of one, for every kind of call. (A minute's Redis budget, so
// that only the callers' deadlines end calls, on a loaded machine too.)
func TestBreakerCountsCallerDeadline(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	redistest.RequireReal(t, s, "CLIENT PAUSE")
	admin := s.Client(t)
	opts := []packcache.Option{packcache.WithCircuitBreaker(1, time.Minute), packcache.WithCoalescing(false), packcache.WithRedisTimeout(time.Minute)}
	c := mustNew[string](t, rdb, opts...)
	ops := map[string]func(ctx context.Context) error{
		"set":    func(ctx context.Context) error { return c.Set(ctx, "k", "v") },
		"delete": func(ctx context.Context) error { return c.Delete(ctx, "k") },
		"get":    func(ctx context.Context) error { _, err := c.Get(ctx, "k"); return err },
		"getmany": func(ctx context.Context) error {
			_, err := c.GetMany(ctx, []string{"k", "j"})
			return err
		},
	}
	opened := map[string]int{}
	for name, op := range ops {
		for range 8 {
			if err := admin.Do(context.Background(), "CLIENT", "PAUSE", "60", "ALL").Err(); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			op(ctx)
			cancel()
			// The probe waits out the rest of the pause, well within its budget.
			if _, err := c.Get(context.Background(), "probe"); errors.Is(err, packcache.ErrCircuitOpen) {
				opened[name]++
				// Close the breaker again with a fresh cache.
				c = mustNew[string](t, rdb, opts...)
			}
		}
	}
	if len(opened) > 0 {
		t.Errorf("breaker opened by callers' own deadlines (out of 8 each): %v", opened)
	}
}

func TestClusterHungBeforeSlotMap(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	for _, n := range cl.Nodes() {
		n.Pause(t)
	}
	defer func() {
		for _, n := range cl.Nodes() {
			n.Resume(t)
		}
	}()
	rdb := cl.Universal(t)
	c := mustNew[string](t, rdb, packcache.WithRedisTimeout(300*time.Millisecond),
		packcache.WithLoader[string](packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
			return "from-loader", nil
		})))
	for _, name := range []string{"background", "long deadline"} {
		ctx := context.Background()
		if name != "background" {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, time.Minute)
			defer cancel()
		}
		start := time.Now()
		v, err := c.Get(ctx, "k")
		el := time.Since(start)
		t.Logf("%s: Get = %q, %v after %v", name, v, err, el)
		if el > 2*time.Second {
			t.Errorf("%s: Get took %v with a 300ms Redis budget", name, el)
		}
	}
	start := time.Now()
	err := c.Set(context.Background(), "k", "v")
	t.Logf("Set: %v after %v", err, time.Since(start))
	if time.Since(start) > 2*time.Second {
		t.Errorf("Set took %v with a 300ms Redis budget", time.Since(start))
	}
}

// Share window 0 with the breaker open: no read at all, yet a Get arriving
// much later shares the first Get's loader call.
func TestWindowZeroSharesLoaderWhenBreakerOpen(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	ctx := ctxT(t)
	var calls atomic.Int64
	first := make(chan struct{}, 1)
	ld := packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
		n := calls.Add(1)
		if n == 1 {
			first <- struct{}{} // the first Get's load has begun
		}
		time.Sleep(400 * time.Millisecond) // the load's cost
		return "load" + strconv.FormatInt(n, 10), nil
	})
	c := mustNew[string](t, rdb, packcache.WithShareWindow(packcache.Off), packcache.WithCircuitBreaker(1, time.Minute),
		packcache.WithRedisTimeout(100*time.Millisecond), packcache.WithLoader[string](ld))
	s.Stop(t)
	c.Get(ctx, "warm") // opens the breaker
	calls.Store(0)
	done := make(chan string, 2)
	go func() { v, _ := c.Get(ctx, "k"); done <- v }()
	<-first
	time.Sleep(200 * time.Millisecond) // much later, while the first load still runs
	go func() { v, _ := c.Get(ctx, "k"); done <- v }()
	a, b := <-done, <-done
	t.Logf("values %q %q, loader calls %d", a, b, calls.Load())
	if calls.Load() != 2 {
		t.Errorf("with share window 0, a Get 200ms after another shared its loader call (no read was in flight)")
	}
}

// TestCircuitOpenWithoutLoader: with the breaker open, a Get without a
// loader fails at once with ErrCircuitOpen (which is also ErrRedis)
// rather than waiting on a Redis that is down.
func TestCircuitOpenWithoutLoader(t *testing.T) {
	s := redistest.Start(t)
	// No retries, so the two calls that open the breaker fail fast.
	rdb := s.Client(t, func(o *redis.Options) { o.MaxRetries, o.DialerRetries = -1, 1 })
	ctx := ctxT(t)
	c := mustNew[Channel](t, rdb, packcache.WithCircuitBreaker(2, time.Minute))
	s.Stop(t)
	// A refused connection opens the breaker at once, whatever its
	// threshold: nothing listens there.
	if _, err := c.Get(ctx, "k"); !errors.Is(err, packcache.ErrRedis) || errors.Is(err, packcache.ErrCircuitOpen) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Get before the breaker opens: %v, want ErrRedis naming the refused connection", err)
	}
	before := c.Stats().RedisErrors
	start := time.Now()
	_, err := c.Get(ctx, "k")
	if !errors.Is(err, packcache.ErrCircuitOpen) || !errors.Is(err, packcache.ErrRedis) {
		t.Fatalf("Get with the breaker open: %v", err)
	}
	if d := time.Since(start); d > 50*time.Millisecond || c.Stats().RedisErrors != before {
		t.Fatalf("open breaker still tried Redis (%v, %d more errors)", d, c.Stats().RedisErrors-before)
	}
	if _, err := c.GetMany(ctx, []string{"a", "b"}); !errors.Is(err, packcache.ErrCircuitOpen) {
		t.Fatalf("GetMany with the breaker open: %v", err)
	}
}

// TestBreakerIgnoresCallerContexts: callers whose contexts have ended,
// however many, do not open the breaker for the others.
func TestBreakerIgnoresCallerContexts(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	var loads atomic.Int64
	c := mustNew[Channel](t, rdb, packcache.WithCircuitBreaker(2, time.Minute), packcache.WithShareWindow(packcache.Off))
	rt := mustNew[Channel](t, rdb, packcache.WithCircuitBreaker(2, time.Minute), packcache.WithShareWindow(packcache.Off),
		packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
			loads.Add(1)
			return Channel{ID: key}, nil
		})))
	if err := c.Set(ctx, "ctx:k", Channel{ID: "ctx:k"}); err != nil {
		t.Fatal(err)
	}
	expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	cancelled, cancel2 := context.WithCancel(ctx)
	cancel2()
	keys := make([]string, 50)
	for i := range keys {
		keys[i] = fmt.Sprintf("ctx:%d", i)
	}
	for _, dead := range []context.Context{expired, cancelled} {
		for range 10 {
			c.GetMany(dead, keys)
			c.SetMany(dead, map[string]Channel{"ctx:x": {}, "ctx:y": {}})
			c.Set(dead, "ctx:z", Channel{})
			c.Delete(dead, "ctx:z", "ctx:w")
			c.Get(dead, "ctx:k")
			rt.GetOrLoadMany(dead, keys, func(context.Context, []string) (map[string]Channel, error) { return nil, nil })
		}
	}
	if v, err := c.Get(ctx, "ctx:k"); err != nil || v.ID != "ctx:k" {
		t.Fatalf("Get after callers' contexts ended: %+v, %v", v, err)
	}
	if v, err := rt.Get(ctx, "ctx:k"); err != nil || v.ID != "ctx:k" || loads.Load() != 0 {
		t.Fatalf("read-through Get after callers' contexts ended: %+v, %v, %d loads (want it from Redis)", v, err, loads.Load())
	}
	if st := c.Stats(); st.RedisErrors == 0 {
		t.Log("no Redis errors were counted at all")
	}
}

// TestBreakerCountsOncePerBatchPerNode: a batch of a hundred keys on a
// hung node is one failure, not a hundred.
func TestBreakerCountsOncePerBatchPerNode(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "stops the server")
	rdb := s.Client(t, func(o *redis.Options) { o.MaxRetries, o.DialerRetries = -1, 1 })
	ctx := ctxT(t)
	// A budget of a second, not 100 ms: a call is blamed on the node only
	// if a command of it waited for the node's reply at least half the
	// budget (breaker.Judge); with 100 ms, on a machine busy compiling,
	// a command written late was judged Late, the breaker did not count
	// it, and the third call found the breaker still closed.
	c := mustNew[Channel](t, rdb, packcache.WithCircuitBreaker(2, time.Minute), packcache.WithRedisTimeout(time.Second))
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = fmt.Sprintf("batch:%d", i)
	}
	c.GetMany(ctx, keys) // connections made while the server answers
	s.Pause(t)
	defer s.Resume(t)
	if _, err := c.GetMany(ctx, keys); !errors.Is(err, packcache.ErrRedis) || errors.Is(err, packcache.ErrCircuitOpen) {
		t.Fatalf("first GetMany: %v", err)
	}
	if _, err := c.Get(ctx, "batch:0"); !errors.Is(err, packcache.ErrRedis) || errors.Is(err, packcache.ErrCircuitOpen) {
		t.Fatalf("one GetMany of 100 keys opened a breaker that needs 2 failures: %v", err)
	}
	// That Get was the second failure: now it is open.
	if _, err := c.GetMany(ctx, keys); !errors.Is(err, packcache.ErrCircuitOpen) {
		t.Fatalf("after two failures: %v, want ErrCircuitOpen", err)
	}
}

// TestBreakerPerNode: with one master of a cluster dead, its breaker opens
// and its keys fail fast, while keys on the healthy masters are still
// served from Redis.
func TestBreakerPerNode(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	cl.AllowPartialCoverage(t)
	rdb := cl.Client(t, func(o *redis.ClusterOptions) {
		o.DialTimeout = 200 * time.Millisecond
		o.MaxRedirects = 2
		o.MaxRetries = -1
		o.DialerRetries = 1
	})
	ctx := ctxT(t)
	var loads atomic.Int64
	c := mustNew[Channel](t, rdb, packcache.WithCircuitBreaker(3, time.Minute), packcache.WithShareWindow(packcache.Off),
		packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
			loads.Add(1)
			return Channel{ID: key, Title: "loaded"}, nil
		})))
	plain := mustNew[Channel](t, rdb, packcache.WithCircuitBreaker(3, time.Minute), packcache.WithShareWindow(packcache.Off))
	victim := cl.Nodes()[1]
	var lost, kept []string
	for i := 0; len(lost) < 10 || len(kept) < 20; i++ {
		k := fmt.Sprintf("node:{%d}", i)
		if err := plain.Set(ctx, k, Channel{ID: k, Title: "stored"}); err != nil {
			t.Fatal(err)
		}
		if cl.NodeForKey(t, k) == victim {
			lost = append(lost, k)
		} else {
			kept = append(kept, k)
		}
	}
	victim.Stop(t)
	for _, k := range lost {
		plain.Get(ctx, k) // fails, and opens the victim's breaker
	}
	for _, k := range lost {
		if _, err := plain.Get(ctx, k); !errors.Is(err, packcache.ErrCircuitOpen) {
			t.Fatalf("Get of %s on the dead master: %v, want ErrCircuitOpen", k, err)
		}
		if v, err := c.Get(ctx, k); err != nil || v.Title != "loaded" {
			t.Fatalf("read-through Get of %s on the dead master: %+v, %v", k, v, err)
		}
	}
	before := loads.Load()
	for _, k := range kept {
		if v, err := c.Get(ctx, k); err != nil || v.Title != "stored" {
			t.Fatalf("read-through Get of %s on a healthy master: %+v, %v (want it from Redis)", k, v, err)
		}
		if _, err := plain.Get(ctx, k); err != nil {
			t.Fatalf("Get of %s on a healthy master: %v", k, err)
		}
	}
	if loads.Load() != before {
		t.Fatalf("keys on healthy masters were loaded: the breaker opened for every node")
	}
	// A batch across all masters: the healthy ones' keys are read.
	got, err := plain.GetMany(ctx, append(append([]string{}, kept...), lost...))
	if len(got) != len(kept) || !errors.Is(err, packcache.ErrCircuitOpen) {
		t.Fatalf("GetMany across masters: %d of %d healthy keys, %v", len(got), len(kept), err)
	}
}

// TestBreakerHotKeyOnDeadRedis: one hot key on a dead Redis trips the
// breaker after a few reads (each read a failure, whatever the number of
// callers sharing it), and read-through callers then get the loader's value
// without waiting on Redis.
func TestBreakerHotKeyOnDeadRedis(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "stops the server")
	rdb := s.Client(t, func(o *redis.Options) { o.MaxRetries, o.DialerRetries = -1, 1 })
	ctx := ctxT(t)
	c := mustNew[Channel](t, rdb, packcache.WithCircuitBreaker(3, time.Minute),
		packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
			return Channel{ID: key}, nil
		})))
	s.Stop(t)
	var wg sync.WaitGroup
	var gets atomic.Int64
	end := time.Now().Add(500 * time.Millisecond) // fifty share windows
	for range 20 {
		wg.Go(func() {
			for time.Now().Before(end) {
				gets.Add(1)
				if v, err := c.Get(ctx, "hot"); err != nil || v.ID != "hot" {
					t.Errorf("read-through Get: %+v, %v", v, err)
					return
				}
			}
		})
	}
	wg.Wait()
	// Redis was tried until the breaker opened, not once per share
	// window: a refused connection opens it at once, so after the reads
	// under way when it opened (at most the threshold), no other.
	if n := c.Stats().RedisErrors; n < 1 || n > 3 {
		t.Fatalf("%d Redis errors for %d Gets of a hot key over 500ms: want 1 to 3 before the breaker opened", n, gets.Load())
	}
}

// TestHungRedis: with Redis stopped by SIGSTOP, a read-through Get answers
// from the loader within the Redis budget plus the load time, and
// consecutive timeouts open the breaker, so that the hang costs a few
// budgets, not one per call.
func TestHungRedis(t *testing.T) {
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "pauses the server")
	rdb := s.Client(t)
	ctx := ctxT(t)
	const budget = 200 * time.Millisecond
	c := mustNew[Channel](t, rdb, packcache.WithRedisTimeout(budget), packcache.WithCircuitBreaker(5, time.Minute),
		packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
			return Channel{ID: key, Title: "loaded"}, nil
		})))
	plain := mustNew[Channel](t, rdb, packcache.WithRedisTimeout(budget), packcache.WithCircuitBreaker(5, time.Minute))
	if err := plain.Set(ctx, "hung:0", Channel{ID: "hung:0"}); err != nil {
		t.Fatal(err)
	}
	s.Pause(t)
	defer s.Resume(t)
	start := time.Now()
	v, err := c.Get(ctx, "hung:0")
	first := time.Since(start)
	if err != nil || v.Title != "loaded" {
		t.Fatalf("read-through Get with Redis hung: %+v, %v", v, err)
	}
	if first > 10*budget {
		t.Fatalf("first answer after %v, want about the budget (%v)", first, budget)
	}
	// Sequential Gets of other keys: each costs a budget until the
	// breaker opens after five in a row; then none waits.
	var opened time.Duration
	for i := 1; i <= 20; i++ {
		t0 := time.Now()
		if v, err := c.Get(ctx, fmt.Sprintf("hung:%d", i)); err != nil || v.Title != "loaded" {
			t.Fatalf("Get %d: %+v, %v", i, v, err)
		}
		if time.Since(t0) < budget/4 && opened == 0 {
			opened = time.Since(start)
		}
	}
	if opened == 0 {
		t.Fatal("the breaker never opened")
	}
	if n := c.Stats().RedisErrors; n != 5 {
		t.Fatalf("%d Redis calls timed out, want 5 (then the breaker is open)", n)
	}
	t.Logf("budget %v: first answer after %v; breaker open %v after the hang began", budget, first, opened)
	if _, err := plain.Get(ctx, "hung:0"); !errors.Is(err, packcache.ErrRedis) {
		t.Fatalf("loader-less Get with Redis hung: %v", err)
	}
}

// TestSlowLoadsAreNotRedisFailures: loads that outlive the load timeout
// fail their callers with ErrLoadTimeout and store nothing, and however
// many there are, they count as no Redis failure: the breaker stays
// closed and later loads store their values.
func TestSlowLoadsAreNotRedisFailures(t *testing.T) {
	_, rdb := single(t)
	ctx := ctxT(t)
	var slow atomic.Bool
	var returned atomic.Int64
	slow.Store(true)
	release := make(chan struct{}) // the slow loaders return once every Get has timed out
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	c := mustNew[Channel](t, rdb, packcache.WithLoadTimeout(50*time.Millisecond), packcache.WithCircuitBreaker(2, time.Minute),
		packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
			if slow.Load() {
				defer returned.Add(1)
				<-release // ignores ctx
			}
			return Channel{ID: key}, nil
		})))
	for i := range 6 {
		if _, err := c.Get(ctx, fmt.Sprintf("slow:%d", i)); !errors.Is(err, packcache.ErrLoadTimeout) {
			t.Fatalf("slow load %d: %v, want ErrLoadTimeout", i, err)
		}
	}
	slow.Store(false)
	close(release)
	waitFor(t, 30*time.Second, "the slow loaders returning", func() bool { return returned.Load() == 6 })
	if n := c.Stats().RedisErrors; n != 0 {
		t.Fatalf("slow loads counted %d Redis errors", n)
	}
	// Nothing stored; each load's lease is removed once its loader has
	// returned (after returned counts it: waited for).
	for i := range 6 {
		k := fmt.Sprintf("slow:%d", i)
		for deadline := time.Now().Add(30 * time.Second); rdb.Exists(ctx, k).Val() != 0; time.Sleep(10 * time.Millisecond) {
			if raw := rdb.Get(ctx, k).Val(); raw != "" && raw[0] != 0x0c || time.Now().After(deadline) {
				t.Fatalf("%s holds %q after its load timed out", k, raw)
			}
		}
	}
	if _, err := c.Get(ctx, "fast"); err != nil {
		t.Fatalf("a fast load after the slow ones: %v", err)
	}
	if n := rdb.Exists(ctx, "fast").Val(); n != 1 {
		t.Fatal("a fast load after the slow ones did not store: the breaker opened")
	}
}

// TestNewRefusesClientIgnoringDeadlines: a go-redis client that ignores
// context deadlines would let a hung Redis stall callers for the client's
// own timeouts and retries; New says so.
func TestNewRefusesClientIgnoringDeadlines(t *testing.T) {
	t.Parallel()
	s, _ := single(t)
	for name, rdb := range map[string]redis.UniversalClient{
		"client":  redis.NewClient(&redis.Options{Addr: s.Addr()}),
		"cluster": redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{s.Addr()}}),
		"ring":    redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": s.Addr()}}),
		"wrapped": wrappedClient{redis.NewClient(&redis.Options{Addr: s.Addr()})},
	} {
		if _, err := packcache.New[Channel](rdb); err == nil || !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
			t.Errorf("%s: New = %v, want an error naming ContextTimeoutEnabled", name, err)
		}
		rdb.Close()
	}
}

// TestNewRefusesClientSideCache: a client whose go-redis client-side
// cache is on would answer the cache's reads from go-redis's copy, past
// another process's Delete; New refuses it by name, and the same client
// without it is taken.
func TestNewRefusesClientSideCache(t *testing.T) {
	t.Parallel()
	s, _ := single(t)
	for name, rdb := range map[string]redis.UniversalClient{
		"config": redis.NewClient(&redis.Options{Addr: s.Addr(), Protocol: 3, ContextTimeoutEnabled: true,
			ClientSideCacheConfig: &redis.ClientSideCacheConfig{MaxEntries: 100}}),
		"cache": redis.NewClient(&redis.Options{Addr: s.Addr(), Protocol: 3, ContextTimeoutEnabled: true,
			ClientSideCache: redis.NewLocalCache(redis.CacheConfig{MaxEntries: 100})}),
		"universal": redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{s.Addr()}, Protocol: 3, ContextTimeoutEnabled: true,
			ClientSideCacheConfig: &redis.ClientSideCacheConfig{MaxEntries: 100}}),
		"wrapped": wrappedClient{redis.NewClient(&redis.Options{Addr: s.Addr(), Protocol: 3, ContextTimeoutEnabled: true,
			ClientSideCacheConfig: &redis.ClientSideCacheConfig{MaxEntries: 100}})},
	} {
		c, err := packcache.New[Channel](rdb)
		if !errors.Is(err, packcache.ErrClientSideCache) || !strings.Contains(err.Error(), "ClientSideCacheConfig") {
			t.Errorf("%s: New = %v, want an error matching ErrClientSideCache naming ClientSideCacheConfig", name, err)
		}
		if c != nil {
			c.Close()
		}
		rdb.Close()
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), Protocol: 3, ContextTimeoutEnabled: true})
	defer rdb.Close()
	c, err := packcache.New[Channel](rdb)
	if err != nil {
		t.Fatalf("New without a client-side cache: %v", err)
	}
	c.Close()
}

// TestScriptFlush: a SCRIPT FLUSH (a restart, a failover to a replica that
// never ran the scripts, an operator) between calls costs each script the
// cache runs one NOSCRIPT and an EVAL, never a failed call: a grouped Set
// and InvalidateGroups, a read-through store, a lock's acquire and
// release, a batch load's store and a dictionary's publication all land.
func TestScriptFlush(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	redistest.RequireReal(t, s, "SCRIPT FLUSH and INFO commandstats")
	ctx := ctxT(t)
	load := packcache.LoaderFunc[json.RawMessage](func(_ context.Context, key string) (json.RawMessage, error) {
		return json.RawMessage(`{"k":"` + key + `"}`), nil
	})
	c := mustNew[json.RawMessage](t, rdb, packcache.WithLoader(load), packcache.WithLock(time.Minute),
		packcache.WithPrefix("d:", packcache.Policy{Dictionary: profileDictionary(t, 1)}))
	profile, err := json.Marshal(profiles(1, 3)[0])
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		do   func() error
		want map[string]bool // keys Redis must hold afterwards (true) or not (false)
	}{
		{"grouped Set", func() error { return c.Set(ctx, "g:1", json.RawMessage(`{"a":1}`), packcache.InGroups("g")) },
			map[string]bool{"g:1": true, "{packcache:g}:g": true}},
		{"InvalidateGroups", func() error { return c.InvalidateGroups(ctx, "g") }, map[string]bool{"{packcache:g}:g": false}},
		{"read-through Get", func() error { _, err := c.Get(ctx, "r:1"); return err }, map[string]bool{"r:1": true}},
		{"GetOrLoadMany", func() error {
			_, err := c.GetOrLoadMany(ctx, []string{"m:1", "m:2"}, func(_ context.Context, keys []string) (map[string]json.RawMessage, error) {
				m := map[string]json.RawMessage{}
				for _, k := range keys {
					m[k] = json.RawMessage(`{}`)
				}
				return m, nil
			})
			return err
		}, map[string]bool{"m:1": true, "m:2": true}},
		{"dictionary Set", func() error { return c.Set(ctx, "d:1", profile) }, map[string]bool{"d:1": true}},
	}
	for _, st := range steps {
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		evals := s.CommandCount(t, "eval")
		if err := st.do(); err != nil {
			t.Fatalf("%s after SCRIPT FLUSH: %v", st.name, err)
		}
		if s.CommandCount(t, "eval") == evals {
			t.Errorf("%s after SCRIPT FLUSH ran no EVAL: the flush was not met", st.name)
		}
		for k, held := range st.want {
			if n := rdb.Exists(ctx, k).Val(); (n == 1) != held {
				t.Errorf("after %s, EXISTS %s = %d, want held=%v", st.name, k, n, held)
			}
		}
	}
	if keys := rdb.Keys(ctx, "packcache:dict:*").Val(); len(keys) != 1 {
		t.Errorf("dictionary keys %q after its Set, want one", keys)
	}
	if v, err := c.Get(ctx, "g:1"); err != nil || string(v) != `{"k":"g:1"}` {
		t.Errorf("Get of the invalidated member = %s, %v; want it loaded again", v, err)
	}
}

// wrappedClient is an application's own type over a go-redis client, as
// services wrap one for metrics or naming.
type wrappedClient struct{ *redis.Client }
