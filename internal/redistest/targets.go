package redistest

import (
	"errors"
	"fmt"
	"os"
	"sync"
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

// shared holds the servers behind Targets: sets of a single-node server
// and a cluster, each lent to one test at a time. They belong to the test
// binary, not to a test: their processes, directories and admin
// connections are independent of any testing.TB and are released by
// Shutdown.
var shared sharedState

type sharedState struct {
	mu       sync.Mutex
	max      int           // how many sets there may be (SharedSets); 0 means 1
	err      error         // a startup error, reported by every later Targets call
	failed   chan struct{} // closed when err is set
	sets     []*set        // every set started
	starting int           // sets being started
	held     map[testing.TB]*set
}

// freeSets holds the sets no test holds.
var freeSets = make(chan *set, maxSets)

const maxSets = 64

// A set is one single-node server and one cluster (nil when redis-server
// is missing, and the server is the miniredis fallback).
type set struct {
	single  *Server
	cluster *Cluster
}

// SharedSets lets up to n tests use Targets at once, each with a set of
// servers of its own (n <= 1: one set, and tests take turns). A set is
// started only when a test finds every set started so far in use. Call it
// from TestMain, before m.Run.
func SharedSets(n int) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	shared.max = min(max(n, 1), maxSets)
}

// PrestartSharedSet starts one set of the servers behind Targets now, in
// the background, so that the first test to call Targets need not wait
// for it to start. Call it from TestMain after SharedSets, only if tests
// that call Targets are to run. It does nothing without redis-server on
// PATH, or once any set is started or starting.
func PrestartSharedSet() {
	if findServer() == "" {
		return
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.err != nil || len(shared.sets)+shared.starting > 0 {
		return
	}
	if shared.held == nil {
		shared.held = map[testing.TB]*set{}
		shared.failed = make(chan struct{})
	}
	shared.starting++
	prestarting.Add(1)
	go func() {
		defer prestarting.Done()
		st, err := startSet(nil)
		shared.mu.Lock()
		defer shared.mu.Unlock()
		shared.starting--
		if err != nil {
			if shared.err == nil {
				shared.err = err
				close(shared.failed)
			}
			return
		}
		shared.sets = append(shared.sets, st)
		freeSets <- st
	}()
}

// prestarting counts the sets PrestartSharedSet is starting, for Shutdown
// to wait for.
var prestarting sync.WaitGroup

// acquire returns the set tb holds, or waits for one that no other test
// holds (starting a new one when the limit allows) and holds it for tb
// until tb ends.
func acquire(tb testing.TB) (*set, error) {
	shared.mu.Lock()
	if st := shared.held[tb]; st != nil {
		shared.mu.Unlock()
		return st, nil
	}
	if shared.err != nil {
		shared.mu.Unlock()
		return nil, shared.err
	}
	if shared.held == nil {
		shared.held = map[testing.TB]*set{}
		shared.failed = make(chan struct{})
	}
	var st *set
	start := false
	select {
	case st = <-freeSets:
	default:
		if len(shared.sets)+shared.starting < max(shared.max, 1) {
			shared.starting++
			start = true
		}
	}
	failed := shared.failed
	shared.mu.Unlock()
	if start {
		var err error
		st, err = startSet(tb)
		shared.mu.Lock()
		shared.starting--
		if err != nil {
			if shared.err == nil {
				shared.err = err
				close(shared.failed) // the tests waiting for a set report it too
			}
			shared.mu.Unlock()
			return nil, err
		}
		shared.sets = append(shared.sets, st)
		shared.mu.Unlock()
	}
	if st == nil {
		select {
		case st = <-freeSets:
		case <-failed:
			return nil, shared.errLocked()
		}
	}
	shared.mu.Lock()
	shared.held[tb] = st
	shared.mu.Unlock()
	tb.Cleanup(func() { // registered first, so it runs after the Clients are closed
		shared.mu.Lock()
		delete(shared.held, tb)
		shared.mu.Unlock()
		freeSets <- st
	})
	return st, nil
}

// errLocked returns the startup error under shared.mu.
func (*sharedState) errLocked() error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	return shared.err
}

var clusterOmittedOnce sync.Once

// Targets returns the topologies a behavioural suite should run against: a
// single-node server ("single") and a 3-master cluster ("cluster"). The
// cluster's nodes have Redis's default node timeout (15 s), so that a node
// starved of CPU on a busy machine is not marked failed; StartCluster's
// have 1 s, for the tests that fail a master.
//
// The servers are started on the first call and shared by every later call
// in the test binary; call Shutdown from TestMain after m.Run to stop them.
// Each call makes sure the servers are up (restarting any a previous test
// stopped and resuming any it paused), flushes all data and resets command
// statistics, so every test starts clean. A test holds its servers from
// its first Targets call until it ends, and no other test uses them
// meanwhile: by default there is one set, and tests using Targets take
// turns (a call waits until the test holding the servers has ended), so
// such tests may call t.Parallel and then run alongside tests with their
// own servers, never alongside each other. SharedSets allows more sets,
// and so more such tests at once, each on servers of its own. A test may call Targets more than once. The Clients are new for
// each call and closed when tb's test ends, so tests may add hooks to them
// or close them.
//
// If redis-server is not on PATH, Targets returns only a miniredis-backed
// single-node target (and fails the test when PACKCACHE_REQUIRE_REDIS=1).
func Targets(tb testing.TB) []Target {
	tb.Helper()
	st, err := acquire(tb)
	if err != nil {
		tb.Fatalf("redistest: starting the shared Targets servers: %v", err)
	}
	if err := st.heal(); err != nil {
		tb.Fatalf("redistest: Targets: %v", err)
	}

	ts := []Target{{Name: "single", Client: st.single.Universal(tb), Server: st.single}}
	if st.cluster != nil {
		ts = append(ts, Target{Name: "cluster", Client: st.cluster.Universal(tb), Cluster: st.cluster})
	} else {
		clusterOmittedOnce.Do(func() {
			tb.Logf("redistest: Targets: %s, so only the single-node (miniredis) target runs", serverMissing())
		})
	}
	return ts
}

// startSet starts a set of servers.
// tb is nil when it is started ahead (PrestartSharedSet), and then
// redis-server is on PATH.
func startSet(tb testing.TB) (_ *set, err error) {
	st := &set{}
	bin := findServer()
	if bin == "" {
		tb.Helper()
		if requireReal() {
			return nil, fmt.Errorf("%s", requiredMissing())
		}
		logFallback(tb)
		if st.single, err = startMini(); err != nil {
			return nil, err
		}
		return st, nil
	}
	dirs := make([]string, 4)
	for i := range dirs {
		if dirs[i], err = os.MkdirTemp("", "redistest-shared-*"); err != nil {
			for _, d := range dirs[:i] {
				_ = os.RemoveAll(d)
			}
			return nil, err
		}
	}
	var wg sync.WaitGroup
	var errSingle, errCluster error
	wg.Go(func() {
		st.single, errSingle = startServer(serverConfig{bin: bin, dir: dirs[0], ownDir: true})
		if errSingle != nil {
			_ = os.RemoveAll(dirs[0])
		}
	})
	wg.Go(func() {
		st.cluster, errCluster = startCluster(bin, dirs[1:], 0, true, sharedNodeTimeout)
		if errCluster != nil {
			for _, d := range dirs[1:] {
				_ = os.RemoveAll(d)
			}
		}
	})
	wg.Wait()
	if errSingle != nil || errCluster != nil {
		_ = st.close()
	}
	if errSingle != nil {
		return nil, fmt.Errorf("single-node server: %w", errSingle)
	}
	if errCluster != nil {
		return nil, fmt.Errorf("cluster: %w", errCluster)
	}
	return st, nil
}

// close stops the set's servers.
func (st *set) close() error {
	var errSingle, errCluster error
	var wg sync.WaitGroup
	if st.single != nil {
		wg.Go(func() { errSingle = st.single.close() })
	}
	if st.cluster != nil {
		wg.Go(func() { errCluster = st.cluster.close() })
	}
	wg.Wait()
	return errors.Join(errSingle, errCluster)
}

// heal brings the set's servers back to a clean running state. Only the
// test holding the set calls it.
func (st *set) heal() error {
	servers := []*Server{st.single}
	if st.cluster != nil {
		servers = append(servers, st.cluster.nodes...)
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
	if c := st.cluster; c != nil && c.health() != nil {
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
// (KeepSpareClusters) and clusters started ahead
// (PrestartClustersWithReplicas) not taken, and removes their directories. Call it from TestMain after m.Run; it does nothing if Targets
// was never called. A later Targets call starts new servers. (Should a
// test binary die without calling Shutdown, Linux still kills the servers,
// which are started with a parent-death signal, but their temporary
// directories remain.)
func Shutdown() {
	// The spares, the clusters started ahead and the shared sets are
	// stopped at once: each stop waits for its servers to act on SIGTERM.
	var errSpares, errAhead error
	var others sync.WaitGroup
	others.Go(func() { errSpares = stopSpares() })
	others.Go(func() { errAhead = stopAhead() })
	defer func() {
		others.Wait()
		if errSpares != nil {
			fmt.Fprintf(os.Stderr, "redistest: Shutdown: spare clusters: %v\n", errSpares)
		}
		if errAhead != nil {
			fmt.Fprintf(os.Stderr, "redistest: Shutdown: clusters started ahead: %v\n", errAhead)
		}
	}()
	prestarting.Wait()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	errs := make([]error, len(shared.sets))
	var wg sync.WaitGroup
	for i, st := range shared.sets {
		wg.Go(func() { errs[i] = st.close() })
	}
	wg.Wait()
	for len(freeSets) > 0 {
		<-freeSets
	}
	shared.sets, shared.err, shared.held, shared.failed = nil, nil, nil, nil
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintf(os.Stderr, "redistest: Shutdown: %v\n", err)
	}
}
