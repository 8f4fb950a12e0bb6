package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const clusterSlots = 16384

// failoverNodeTimeout is the cluster node timeout of StartCluster's
// clusters, whose tests stop a master and wait for its peers to mark it
// failed: short, so that they need not wait long.
const failoverNodeTimeout = time.Second

// sharedNodeTimeout is the cluster node timeout of the shared cluster of
// Targets, which no test means to fail: Redis's default. With a second, a
// node that could not answer its peers' pings for a second, as on a busy
// machine (its CPU taken by other processes while it works through a
// large pipeline), was marked failed, and every test on the cluster got
// CLUSTERDOWN until it answered again.
const sharedNodeTimeout = 15 * time.Second

// Cluster is a local Redis Cluster made of its own redis-server processes:
// masters only, started by StartCluster, or masters each with replicas,
// started by StartClusterWithReplicas.
type Cluster struct {
	nodes []*Server // the masters as started, in slot order
	// first[i] is the first slot served by nodes[i]; nodes[i] serves
	// first[i] through first[i+1]-1 (the last node up to slot 16383).
	first []int
	// replicas[i] are the replicas nodes[i] was started with.
	replicas [][]*Server
}

// all returns every node: the masters, then the replicas.
func (c *Cluster) all() []*Server {
	all := slices.Clone(c.nodes)
	for _, rs := range c.replicas {
		all = append(all, rs...)
	}
	return all
}

// StartCluster starts a Redis Cluster of masters (at least 3) redis-server
// processes on 127.0.0.1, each in its own tb.TempDir with cluster mode
// enabled and a 1 s node timeout, assigns the 16384 slots in equal ranges,
// joins the nodes and waits (up to 20 seconds) until every node reports
// cluster_state:ok and all nodes agree on the slot map. It registers a
// cleanup with tb that stops every node.
//
// Miniredis has no cluster mode: if redis-server is not on PATH,
// StartCluster skips the test, or fails it when PACKCACHE_REQUIRE_REDIS=1.
func StartCluster(tb testing.TB, masters int) *Cluster {
	tb.Helper()
	if masters < 3 {
		tb.Fatalf("redistest: StartCluster needs at least 3 masters, got %d", masters)
	}
	bin := findServer()
	if bin == "" {
		if requireReal() {
			tb.Fatalf("redistest: StartCluster: %s", requiredMissing())
		}
		tb.Skipf("redistest: skipping: StartCluster needs a real server, but %s (the miniredis fallback has no cluster mode)", serverMissing())
	}
	c, err := takeSpare(bin, masters)
	if c == nil && err == nil {
		dirs := make([]string, masters)
		for i := range dirs {
			dirs[i] = tb.TempDir()
		}
		c, err = startCluster(bin, dirs, 0, false, failoverNodeTimeout)
	}
	if err != nil {
		tb.Fatalf("redistest: StartCluster(%d): %v", masters, err)
	}
	tb.Cleanup(func() {
		if err := c.close(); err != nil {
			tb.Errorf("redistest: stopping cluster: %v", err)
		}
	})
	return c
}

// startCluster starts len(dirs) nodes in parallel, forms the cluster (see
// formCluster) and waits until it is healthy. On error every started node
// has been stopped.
func startCluster(bin string, dirs []string, replicas int, ownDirs bool, nodeTimeout time.Duration) (*Cluster, error) {
	c, err := formCluster(bin, dirs, replicas, ownDirs, nodeTimeout)
	if err != nil {
		return nil, err
	}
	if err := c.waitHealthy(clusterTimeout); err != nil {
		_ = c.close()
		return nil, err
	}
	return c, nil
}

// formCluster starts len(dirs) nodes in parallel and forms the cluster:
// len(dirs)/(1+replicas) masters, each followed in dirs by the directories
// of its replicas. It returns before the nodes agree on the cluster. On
// error every started node has been stopped.
func formCluster(bin string, dirs []string, replicas int, ownDirs bool, nodeTimeout time.Duration) (_ *Cluster, err error) {
	started := make([]*Server, len(dirs))
	errs := make([]error, len(dirs))
	var wg sync.WaitGroup
	for i := range dirs {
		wg.Go(func() {
			started[i], errs[i] = startServer(serverConfig{bin: bin, dir: dirs[i], ownDir: ownDirs, cluster: true, nodeTimeout: nodeTimeout})
		})
	}
	wg.Wait()
	defer func() {
		if err != nil {
			for _, s := range started {
				if s != nil {
					_ = s.close()
				}
			}
		}
	}()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	n := len(dirs) / (1 + replicas)
	c := &Cluster{nodes: make([]*Server, n), first: make([]int, n)}
	for i := range n {
		group := started[i*(1+replicas) : (i+1)*(1+replicas)]
		c.nodes[i] = group[0]
		if replicas > 0 {
			c.replicas = append(c.replicas, group[1:])
		}
	}
	for _, s := range started {
		s.cluster = c
	}

	for i, s := range c.nodes {
		c.first[i] = i * clusterSlots / n
		last := (i+1)*clusterSlots/n - 1
		// Distinct config epochs, as redis-cli --cluster create does, so
		// that no epoch collision has to be resolved.
		if _, err := s.admin.do(adminTimeout, "CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i+1)); err != nil {
			return nil, fmt.Errorf("CLUSTER SET-CONFIG-EPOCH on %s: %w", s.addr, err)
		}
		if _, err := s.admin.do(adminTimeout, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(c.first[i]), strconv.Itoa(last)); err != nil {
			return nil, fmt.Errorf("CLUSTER ADDSLOTSRANGE %d %d on %s: %w", c.first[i], last, s.addr, err)
		}
	}
	// Every node meets every other, rather than the first all and gossip
	// the rest: gossip names a few peers per ping, and a node pings a peer
	// it already heard from once a second, or every half node timeout:
	// with the 15 s of a cluster started ahead, its replicas took 1-4 s to
	// know their masters, which CLUSTER REPLICATE needs.
	for i, a := range started {
		for _, b := range started[i+1:] {
			if _, err := a.admin.do(adminTimeout, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(b.port)); err != nil {
				return nil, fmt.Errorf("CLUSTER MEET %s from %s: %w", b.addr, a.addr, err)
			}
		}
	}
	if replicas > 0 {
		if err := c.replicate(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// health returns nil if every node reports cluster_state:ok with all slots
// served and all nodes have the same view of node addresses and slots.
func (c *Cluster) health() error {
	var ref string
	all := c.all()
	for i, s := range all {
		ci, err := s.admin.doString(adminTimeout, "CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("CLUSTER INFO on %s: %w", s.addr, err)
		}
		info := parseInfo(ci)
		for k, want := range map[string]string{
			"cluster_state":          "ok",
			"cluster_slots_assigned": strconv.Itoa(clusterSlots),
			"cluster_slots_ok":       strconv.Itoa(clusterSlots),
			"cluster_known_nodes":    strconv.Itoa(len(all)),
		} {
			if info[k] != want {
				return fmt.Errorf("node %s reports %s:%s (want %s)", s.addr, k, info[k], want)
			}
		}
		nodes, err := s.admin.doString(adminTimeout, "CLUSTER", "NODES")
		if err != nil {
			return fmt.Errorf("CLUSTER NODES on %s: %w", s.addr, err)
		}
		view := canonicalNodes(nodes)
		if i == 0 {
			ref = view
		} else if view != ref {
			return fmt.Errorf("nodes disagree on the slot map:\n%s sees:\n%s\n%s sees:\n%s", c.nodes[0].addr, ref, s.addr, view)
		}
	}
	return c.replicasHealth()
}

// canonicalNodes reduces CLUSTER NODES output to "id addr slots..." lines,
// sorted, dropping the per-observer fields (flags, ping times, link state).
func canonicalNodes(s string) string {
	var lines []string
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		lines = append(lines, strings.Join(append([]string{f[0], addr}, f[8:]...), " "))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// waitHealthy polls health until it succeeds or timeout passes.
func (c *Cluster) waitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := c.health()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster not healthy after %v: %w", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) close() error {
	// All at once: each node's stop waits for its server to act on
	// SIGTERM, which it does on its next cron tick (up to 100 ms).
	all := c.all()
	errs := make([]error, len(all))
	var wg sync.WaitGroup
	for i, s := range all {
		wg.Go(func() { errs[i] = s.close() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Addrs returns the "127.0.0.1:port" addresses of all nodes: the masters
// as started, in slot order, then their replicas.
func (c *Cluster) Addrs() []string {
	all := c.all()
	a := make([]string, len(all))
	for i, s := range all {
		a[i] = s.addr
	}
	return a
}

// Nodes returns each master as started as a Server, in slot order: Stop,
// Restart, Pause, CommandCount and so on work per node. (After a failover
// the master of a slot range may be one of Replicas.)
func (c *Cluster) Nodes() []*Server { return slices.Clone(c.nodes) }

// NodeForKey returns the master, as started, that serves key's hash slot.
func (c *Cluster) NodeForKey(tb testing.TB, key string) *Server {
	tb.Helper()
	slot, err := c.keySlot(key)
	if err != nil {
		tb.Fatalf("redistest: CLUSTER KEYSLOT %q: %v", key, err)
	}
	i, found := slices.BinarySearch(c.first, slot)
	if !found {
		i--
	}
	return c.nodes[i]
}

func (c *Cluster) keySlot(key string) (int, error) {
	var err error
	for _, s := range c.nodes {
		var v any
		if v, err = s.admin.do(adminTimeout, "CLUSTER", "KEYSLOT", key); err == nil {
			n, ok := v.(int64)
			if !ok {
				return 0, fmt.Errorf("unexpected reply %#v", v)
			}
			return int(n), nil
		}
	}
	return 0, err // no node answered
}

// Client returns a new go-redis cluster client seeded with all nodes, with
// go-redis defaults changed by opts, and registers a cleanup with tb that
// closes it. It honours context deadlines (ContextTimeoutEnabled).
func (c *Cluster) Client(tb testing.TB, opts ...func(*redis.ClusterOptions)) *redis.ClusterClient {
	tb.Helper()
	o := &redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true}
	for _, f := range opts {
		f(o)
	}
	cc := redis.NewClusterClient(o)
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Universal returns a new cluster-mode redis.UniversalClient seeded with all
// nodes, with go-redis defaults changed by opts, and registers a cleanup
// with tb that closes it. It honours context deadlines
// (ContextTimeoutEnabled).
func (c *Cluster) Universal(tb testing.TB, opts ...func(*redis.UniversalOptions)) redis.UniversalClient {
	tb.Helper()
	o := &redis.UniversalOptions{Addrs: c.Addrs(), IsClusterMode: true, ContextTimeoutEnabled: true}
	for _, f := range opts {
		f(o)
	}
	u := redis.NewUniversalClient(o)
	tb.Cleanup(func() { _ = u.Close() })
	return u
}

// WaitHealthy waits (up to 20 seconds) until every node reports
// cluster_state:ok and all nodes agree on the slot map, for example after
// stopping a node with Server.Stop and starting it again some other way.
// Server.Restart of a node already waits for this.
func (c *Cluster) WaitHealthy(tb testing.TB) {
	tb.Helper()
	if err := c.waitHealthy(clusterTimeout); err != nil {
		tb.Fatalf("redistest: %v", err)
	}
}

// CommandCount returns the sum over the masters as started of
// Server.CommandCount.
func (c *Cluster) CommandCount(tb testing.TB, cmd string) int64 {
	tb.Helper()
	n, err := c.commandCount(cmd)
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	return n
}

func (c *Cluster) commandCount(cmd string) (int64, error) {
	var sum int64
	for _, s := range c.nodes {
		n, err := s.commandCount(cmd)
		if err != nil {
			return 0, fmt.Errorf("INFO commandstats on %s: %w", s.addr, err)
		}
		sum += n
	}
	return sum, nil
}

// ResetStats runs CONFIG RESETSTAT on every master as started.
func (c *Cluster) ResetStats(tb testing.TB) {
	tb.Helper()
	if err := c.resetStats(); err != nil {
		tb.Fatalf("redistest: %v", err)
	}
}

func (c *Cluster) resetStats() error {
	for _, s := range c.nodes {
		if err := s.resetStats(); err != nil {
			return fmt.Errorf("CONFIG RESETSTAT on %s: %w", s.addr, err)
		}
	}
	return nil
}

// FlushAll deletes every key on every master as started (their replicas
// follow).
func (c *Cluster) FlushAll(tb testing.TB) {
	tb.Helper()
	if err := c.flushAll(); err != nil {
		tb.Fatalf("redistest: %v", err)
	}
}

func (c *Cluster) flushAll() error {
	for _, s := range c.nodes {
		if err := s.flushAll(); err != nil {
			return fmt.Errorf("FLUSHALL on %s: %w", s.addr, err)
		}
	}
	return nil
}

// AllowPartialCoverage makes every node keep serving the slots it holds
// when a master fails (cluster-require-full-coverage no): by default a
// cluster that loses slots refuses every command once the others agree the
// node failed, and tests of partial availability need the other case.
func (c *Cluster) AllowPartialCoverage(tb testing.TB) {
	tb.Helper()
	for _, n := range c.nodes {
		rc := n.Client(tb)
		if err := rc.ConfigSet(context.Background(), "cluster-require-full-coverage", "no").Err(); err != nil {
			tb.Fatalf("redistest: CONFIG SET cluster-require-full-coverage: %v", err)
		}
		rc.Close()
	}
}

// Spare clusters. A Redis Cluster master reports cluster_state:ok no
// sooner than 2 s after it started (Redis's CLUSTER_WRITABLE_DELAY), so a
// StartCluster waits at least that long, mostly idle. With
// KeepSpareClusters, StartCluster takes a cluster started earlier in the
// background, and starts the next one.
var spares struct {
	mu    sync.Mutex
	keep  int      // how many to keep started; 0: none
	ready []*spare // started or starting, oldest first
}

// A spare is a cluster of spareMasters masters being started, or started.
type spare struct {
	done chan struct{} // closed once c or err is set
	c    *Cluster
	err  error
}

const spareMasters = 3

// KeepSpareClusters makes StartCluster of 3 masters take a cluster started
// ahead of it, in the background, keeping n of them started (n <= 0: none,
// the default). Each costs three idle redis-server processes until it is
// taken. A TestMain that calls it must call Shutdown after m.Run, which
// stops the spares that were not taken.
func KeepSpareClusters(n int) {
	spares.mu.Lock()
	defer spares.mu.Unlock()
	spares.keep = max(n, 0)
}

// PrestartSpareClusters starts the spare clusters KeepSpareClusters asked
// for now, in the background, instead of at the first StartCluster, which
// then takes one too. Call it from TestMain after KeepSpareClusters, only
// if tests that call StartCluster are to run.
func PrestartSpareClusters() {
	bin := findServer()
	if bin == "" {
		return
	}
	spares.mu.Lock()
	defer spares.mu.Unlock()
	for len(spares.ready) < spares.keep {
		spares.ready = append(spares.ready, startSpare(bin))
	}
}

// takeSpare returns a spare cluster of masters, or nil (and no error) if
// none is kept for that size; it starts another in its place.
func takeSpare(bin string, masters int) (*Cluster, error) {
	spares.mu.Lock()
	if spares.keep == 0 || masters != spareMasters {
		spares.mu.Unlock()
		return nil, nil
	}
	var sp *spare
	if len(spares.ready) > 0 {
		sp, spares.ready = spares.ready[0], spares.ready[1:]
	}
	for len(spares.ready) < spares.keep {
		spares.ready = append(spares.ready, startSpare(bin))
	}
	spares.mu.Unlock()
	if sp == nil {
		return nil, nil // the first: start it in the foreground
	}
	<-sp.done
	return sp.c, sp.err
}

// startSpare starts a cluster in the background, in directories of its
// own that closing it removes.
func startSpare(bin string) *spare {
	sp := &spare{done: make(chan struct{})}
	go func() {
		defer close(sp.done)
		dirs := make([]string, spareMasters)
		for i := range dirs {
			d, err := os.MkdirTemp("", "redistest-spare-*")
			if err != nil {
				sp.err = err
				for _, d := range dirs[:i] {
					_ = os.RemoveAll(d)
				}
				return
			}
			dirs[i] = d
		}
		if sp.c, sp.err = startCluster(bin, dirs, 0, true, failoverNodeTimeout); sp.err != nil {
			for _, d := range dirs {
				_ = os.RemoveAll(d)
			}
		}
	}()
	return sp
}

// stopSpares stops the spare clusters not taken, waiting for those still
// starting, and keeps no more.
func stopSpares() error {
	spares.mu.Lock()
	left := spares.ready
	spares.ready, spares.keep = nil, 0
	spares.mu.Unlock()
	errs := make([]error, len(left))
	var wg sync.WaitGroup
	for i, sp := range left {
		wg.Go(func() {
			<-sp.done
			if sp.c != nil {
				errs[i] = sp.c.close()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
