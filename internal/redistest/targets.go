package redistest

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Target is one Redis topology that behavioural suites run against.
type Target struct {
	// Name is "single" or "cluster", suitable for t.Run.
	Name string
	// Client is a client for the topology, new for each Targets call and
	// closed when that test ends.
	Client redis.UniversalClient
	// Server is the single-node server; nil for the cluster target.
	Server *Server
	// Cluster is the cluster; nil for the single-node target.
	Cluster *Cluster
}

// CommandCount returns how many times cmd was called on the target (summed
// over nodes for a cluster) since the last ResetStats. See
// Server.CommandCount.
func (t Target) CommandCount(tb testing.TB, cmd string) int64 {
	tb.Helper()
	if t.Cluster != nil {
		return t.Cluster.CommandCount(tb, cmd)
	}
	return t.Server.CommandCount(tb, cmd)
}

// ResetStats resets the command statistics of the target's server(s).
func (t Target) ResetStats(tb testing.TB) {
	tb.Helper()
	if t.Cluster != nil {
		t.Cluster.ResetStats(tb)
		return
	}
	t.Server.ResetStats(tb)
}

// FlushAll deletes every key on the target's server(s).
func (t Target) FlushAll(tb testing.TB) {
	tb.Helper()
	if t.Cluster != nil {
		t.Cluster.FlushAll(tb)
		return
	}
	t.Server.FlushAll(tb)
}

// shared holds the servers behind Targets. They belong to the test binary,
// not to a test: their processes, directories and admin connections are
// independent of any testing.TB and are released by Shutdown.
var shared struct {
	mu      sync.Mutex
	started bool
	err     error // startup error, reported by every Targets call
	single  *Server
	cluster *Cluster // nil when redis-server is missing
}

// turn is held by the test using the shared servers, holder, from its
// first Targets call until it ends.
var (
	turn   = make(chan struct{}, 1)
	holder atomic.Pointer[testing.TB]
)

// takeTurn waits until no other test holds the shared servers and holds
// them for tb until tb ends.
func takeTurn(tb testing.TB) {
	if h := holder.Load(); h != nil && *h == tb {
		return // tb holds them already
	}
	turn <- struct{}{}
	holder.Store(&tb)
	tb.Cleanup(func() { // registered first, so it runs after the Clients are closed
		holder.Store(nil)
		<-turn
	})
}

var clusterOmittedOnce sync.Once

// Targets returns the topologies a behavioural suite should run against: a
// single-node server ("single") and a 3-master cluster ("cluster").
//
// The servers are started on the first call and shared by every later call
// in the test binary; call Shutdown from TestMain after m.Run to stop them.
// Each call makes sure the servers are up (restarting any a previous test
// stopped and resuming any it paused), flushes all data and resets command
// statistics, so every test starts clean. Tests using Targets take turns:
// a call waits until the test holding the servers has ended, so such tests
// may call t.Parallel and then run alongside tests with their own servers,
// never alongside each other. A test may call Targets more than once. The Clients are new for
// each call and closed when tb's test ends, so tests may add hooks to them
// or close them.
//
// If redis-server is not on PATH, Targets returns only a miniredis-backed
// single-node target (and fails the test when PACKCACHE_REQUIRE_REDIS=1).
func Targets(tb testing.TB) []Target {
	tb.Helper()
	takeTurn(tb)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.started {
		shared.started = true
		shared.err = startShared(tb)
	}
	if shared.err != nil {
		tb.Fatalf("redistest: starting the shared Targets servers: %v", shared.err)
	}
	if err := healShared(); err != nil {
		tb.Fatalf("redistest: Targets: %v", err)
	}

	ts := []Target{{Name: "single", Client: shared.single.Universal(tb), Server: shared.single}}
	if shared.cluster != nil {
		ts = append(ts, Target{Name: "cluster", Client: shared.cluster.Universal(tb), Cluster: shared.cluster})
	} else {
		clusterOmittedOnce.Do(func() {
			tb.Logf("redistest: Targets: no %s on PATH, so only the single-node (miniredis) target runs", serverBinary)
		})
	}
	return ts
}

// startShared starts the shared servers. shared.mu must be held.
func startShared(tb testing.TB) (err error) {
	tb.Helper()
	bin := findServer()
	if bin == "" {
		if requireReal() {
			return fmt.Errorf("%s not found on PATH and %s=1", serverBinary, RequireEnv)
		}
		logFallback(tb)
		shared.single, err = startMini()
		return err
	}
	defer func() {
		if err != nil {
			shutdownLocked()
			shared.started = true // keep reporting the error instead of retrying
		}
	}()
	dirs := make([]string, 4)
	for i := range dirs {
		if dirs[i], err = os.MkdirTemp("", "redistest-shared-*"); err != nil {
			for _, d := range dirs[:i] {
				_ = os.RemoveAll(d)
			}
			return err
		}
	}
	var wg sync.WaitGroup
	var errSingle, errCluster error
	wg.Go(func() {
		shared.single, errSingle = startServer(serverConfig{bin: bin, dir: dirs[0], ownDir: true})
		if errSingle != nil {
			_ = os.RemoveAll(dirs[0])
		}
	})
	wg.Go(func() {
		shared.cluster, errCluster = startCluster(bin, dirs[1:], true)
		if errCluster != nil {
			for _, d := range dirs[1:] {
				_ = os.RemoveAll(d)
			}
		}
	})
	wg.Wait()
	if errSingle != nil {
		return fmt.Errorf("single-node server: %w", errSingle)
	}
	if errCluster != nil {
		return fmt.Errorf("cluster: %w", errCluster)
	}
	return nil
}

// healShared brings the shared servers back to a clean running state.
// shared.mu must be held.
func healShared() error {
	servers := []*Server{shared.single}
	if shared.cluster != nil {
		servers = append(servers, shared.cluster.nodes...)
	}
	for _, s := range servers {
		if !s.running() {
			if err := s.restartProc(); err != nil {
				return fmt.Errorf("restarting %s stopped by an earlier test: %w", s.addr, err)
			}
		} else if s.isPaused() {
			if err := s.signal(false); err != nil {
				return fmt.Errorf("resuming %s paused by an earlier test: %w", s.addr, err)
			}
		}
	}
	// A node stopped or paused by an earlier test may still be marked as
	// failed by its peers.
	if c := shared.cluster; c != nil && c.health() != nil {
		if err := c.waitHealthy(clusterTimeout); err != nil {
			return err
		}
	}
	var errs []error
	for _, s := range servers {
		if err := s.flushAll(); err != nil {
			errs = append(errs, fmt.Errorf("FLUSHALL on %s: %w", s.addr, err))
		} else if err := s.resetStats(); err != nil {
			errs = append(errs, fmt.Errorf("CONFIG RESETSTAT on %s: %w", s.addr, err))
		}
	}
	return errors.Join(errs...)
}

// Shutdown stops the servers started by Targets, and the spare clusters
// (KeepSpareClusters) not taken, and removes their directories. Call it from TestMain after m.Run; it does nothing if Targets
// was never called. A later Targets call starts new servers. (Should a
// test binary die without calling Shutdown, Linux still kills the servers,
// which are started with a parent-death signal, but their temporary
// directories remain.)
func Shutdown() {
	if err := stopSpares(); err != nil {
		fmt.Fprintf(os.Stderr, "redistest: Shutdown: spare clusters: %v\n", err)
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	shutdownLocked()
}

func shutdownLocked() {
	var errs []error
	if shared.single != nil {
		errs = append(errs, shared.single.close())
	}
	if shared.cluster != nil {
		errs = append(errs, shared.cluster.close())
	}
	shared.single, shared.cluster = nil, nil
	shared.started, shared.err = false, nil
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintf(os.Stderr, "redistest: Shutdown: %v\n", err)
	}
}
