package redistest

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// StartClusterWithReplicas is StartCluster for a cluster whose masters (at
// least 3) have replicas each (at least 1): masters*(1+replicas)
// redis-server processes. Every node has a 1 s cluster-node-timeout, so a
// replica is promoted a few seconds after its master stops answering (see
// WaitPromoted). It returns once, besides what StartCluster waits for,
// every replica is in sync with its master. It registers a cleanup with tb
// that stops every node (resuming any paused one first). Each cluster is
// its test's alone: it is started for it, or it was started ahead for it
// by PrestartClustersWithReplicas and is taken by no other test.
func StartClusterWithReplicas(tb testing.TB, masters, replicas int) *Cluster {
	tb.Helper()
	if masters < 3 || replicas < 1 {
		tb.Fatalf("redistest: StartClusterWithReplicas needs at least 3 masters and 1 replica each, got %d and %d", masters, replicas)
	}
	bin := findServer()
	if bin == "" {
		if requireReal() {
			tb.Fatalf("redistest: StartClusterWithReplicas: %s", requiredMissing())
		}
		tb.Skipf("redistest: skipping: StartClusterWithReplicas needs a real server, but %s (the miniredis fallback has no cluster mode)", serverMissing())
	}
	c, err := takeAhead(masters, replicas)
	if c == nil && err == nil {
		dirs := make([]string, masters*(1+replicas))
		for i := range dirs {
			dirs[i] = tb.TempDir()
		}
		c, err = startCluster(bin, dirs, replicas, false, failoverNodeTimeout)
	}
	if err != nil {
		tb.Fatalf("redistest: StartClusterWithReplicas(%d, %d): %v", masters, replicas, err)
	}
	tb.Cleanup(func() {
		if err := c.close(); err != nil {
			tb.Errorf("redistest: stopping cluster: %v", err)
		}
	})
	return c
}

// replicate makes each replica replicate its master. CLUSTER REPLICATE
// needs the replica to know the master, which it may not yet, its
// handshake with the master still under way: it is sent again until it
// does.
func (c *Cluster) replicate() error {
	deadline := time.Now().Add(clusterTimeout)
	for i, m := range c.nodes {
		id, err := m.admin.doString(adminTimeout, "CLUSTER", "MYID")
		if err != nil {
			return fmt.Errorf("CLUSTER MYID on %s: %w", m.addr, err)
		}
		for _, r := range c.replicas[i] {
			for {
				_, err := r.admin.do(adminTimeout, "CLUSTER", "REPLICATE", id)
				if err == nil {
					break
				}
				var re respError
				if !errors.As(err, &re) || !strings.Contains(string(re), "Unknown node") || time.Now().After(deadline) {
					return fmt.Errorf("CLUSTER REPLICATE %s on %s: %w", m.addr, r.addr, err)
				}
				time.Sleep(pollInterval)
			}
		}
	}
	return nil
}

// replicasHealth returns nil if every replica reports a live link to its
// master as started, and every node knows it as that master's replica (a
// client that loads its slot map from a node that does not yet would not
// know the replica). It is nil for a cluster without replicas.
func (c *Cluster) replicasHealth() error {
	if len(c.replicas) == 0 {
		return nil
	}
	ids := make([]string, len(c.nodes))
	for i, m := range c.nodes {
		id, err := m.admin.doString(adminTimeout, "CLUSTER", "MYID")
		if err != nil {
			return fmt.Errorf("CLUSTER MYID on %s: %w", m.addr, err)
		}
		ids[i] = id
	}
	for _, s := range c.all() {
		nodes, err := s.admin.doString(adminTimeout, "CLUSTER", "NODES")
		if err != nil {
			return fmt.Errorf("CLUSTER NODES on %s: %w", s.addr, err)
		}
		masterOf := map[string]string{} // replica address: its master's id, as s sees it
		for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
			f := strings.Fields(line)
			if len(f) >= 8 && slices.Contains(strings.Split(f[2], ","), "slave") {
				addr, _, _ := strings.Cut(f[1], "@")
				masterOf[addr] = f[3]
			}
		}
		for i, rs := range c.replicas {
			for _, r := range rs {
				if masterOf[r.addr] != ids[i] {
					return fmt.Errorf("%s does not see %s as a replica of %s yet", s.addr, r.addr, c.nodes[i].addr)
				}
			}
		}
	}
	for i, rs := range c.replicas {
		for _, r := range rs {
			info, err := r.admin.doString(adminTimeout, "INFO", "replication")
			if err != nil {
				return fmt.Errorf("INFO replication on %s: %w", r.addr, err)
			}
			kv := parseInfo(info)
			if kv["role"] != "slave" || kv["master_port"] != fmt.Sprint(c.nodes[i].port) || kv["master_link_status"] != "up" {
				return fmt.Errorf("replica %s: role:%s master_port:%s master_link_status:%s (want a live link to %s)",
					r.addr, kv["role"], kv["master_port"], kv["master_link_status"], c.nodes[i].addr)
			}
		}
	}
	return nil
}

// Replicas returns the replicas master was started with (none for a
// cluster started by StartCluster, or for a Server not among Nodes).
func (c *Cluster) Replicas(master *Server) []*Server {
	if i := slices.Index(c.nodes, master); i >= 0 && i < len(c.replicas) {
		return slices.Clone(c.replicas[i])
	}
	return nil
}

// WaitReplicated waits until every replica master was started with has
// applied all that master had written when WaitReplicated was called, on
// any connection: it reads master's master_repl_offset once, then polls
// each replica's INFO replication (every 20 ms) until its
// slave_repl_offset reaches it. It fails the test if that does not happen
// within timeout.
//
// WAIT sent on another connection than the writes' does not do this on
// every server: on Redis 7.4 and Valkey 8.0 it counts the replicas that
// acknowledged that connection's own writes, so on a connection that
// wrote nothing (a new client's, or another of a pool's) it returns at
// once, with the number of replicas online; Redis 7.0's covered every
// connection's writes (TestWaitCoversOtherConnections).
func (c *Cluster) WaitReplicated(tb testing.TB, master *Server, timeout time.Duration) {
	tb.Helper()
	info, err := master.admin.doString(adminTimeout, "INFO", "replication")
	if err != nil {
		tb.Fatalf("redistest: INFO replication on %s: %v", master.addr, err)
	}
	want, err := strconv.ParseInt(parseInfo(info)["master_repl_offset"], 10, 64)
	if err != nil {
		tb.Fatalf("redistest: master_repl_offset of %s: %v", master.addr, err)
	}
	deadline := time.Now().Add(timeout)
	for _, r := range c.Replicas(master) {
		for {
			// A paused replica holds an INFO until its deadline: no
			// later than the caller's, so that timeout is what it waits.
			info, err := r.admin.doString(max(min(adminTimeout, time.Until(deadline)), pollInterval), "INFO", "replication")
			var got int64 = -1
			if err == nil {
				got, _ = strconv.ParseInt(parseInfo(info)["slave_repl_offset"], 10, 64)
			}
			if got >= want {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("redistest: replica %s applied offset %d, not %s's %d, within %v (last error: %v)", r.addr, got, master.addr, want, timeout, err)
			}
			time.Sleep(pollInterval)
		}
	}
}

// WaitPromoted polls replica (CLUSTER NODES, every 20 ms) until it reports
// itself a master serving slots, as it does once a failover has promoted
// it, and returns when it first saw that. It fails the test if that does
// not happen within timeout. It asks only replica, so a paused master does
// not hold it up.
func (c *Cluster) WaitPromoted(tb testing.TB, replica *Server, timeout time.Duration) time.Time {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		nodes, err := replica.admin.doString(adminTimeout, "CLUSTER", "NODES")
		if err == nil && servesSlots(nodes) {
			return time.Now()
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: %s not promoted within %v (last CLUSTER NODES: %v)\n%s", replica.addr, timeout, err, nodes)
		}
		time.Sleep(pollInterval)
	}
}

// servesSlots reports whether the "myself" line of CLUSTER NODES output
// is a master with at least one slot.
func servesSlots(nodes string) bool {
	for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		flags := strings.Split(f[2], ",")
		if slices.Contains(flags, "myself") {
			return slices.Contains(flags, "master") && len(f) > 8
		}
	}
	return false
}

// Clusters with replicas started ahead (PrestartClustersWithReplicas). A
// cluster of six nodes takes several seconds to start, mostly waiting
// (gossip, replication's first sync, CLUSTER_WRITABLE_DELAY), so a test
// binary whose tests each need one can start them while earlier tests run.
var ahead struct {
	mu    sync.Mutex
	ready map[[2]int][]*spare // by {masters, replicas}, oldest first
}

// PrestartClustersWithReplicas starts n clusters of masters masters with
// replicas replicas each, now, in the background, in directories of their
// own; StartClusterWithReplicas of that shape takes one of them (each is
// taken once) instead of starting one, and starts one itself once they
// are taken. Call it from TestMain, before m.Run, only if tests that call
// StartClusterWithReplicas are to run, and call Shutdown after m.Run,
// which stops those not taken.
//
// While it waits to be taken, a cluster started ahead has Redis's default
// node timeout (15 s), so that no node is marked failed, nor any replica
// promoted, because the machine was too busy for a node to answer its
// peers for a second; StartClusterWithReplicas sets every node's timeout
// to the 1 s of a cluster it starts itself, and waits until the cluster
// is healthy with every replica of its master, before returning it.
func PrestartClustersWithReplicas(masters, replicas, n int) {
	bin := findServer()
	if bin == "" || masters < 3 || replicas < 1 {
		return
	}
	ahead.mu.Lock()
	defer ahead.mu.Unlock()
	if ahead.ready == nil {
		ahead.ready = map[[2]int][]*spare{}
	}
	shape := [2]int{masters, replicas}
	for range n {
		sp := &spare{done: make(chan struct{})}
		go func() {
			defer close(sp.done)
			dirs := make([]string, masters*(1+replicas))
			for i := range dirs {
				d, err := os.MkdirTemp("", "redistest-ahead-*")
				if err != nil {
					sp.err = err
					for _, d := range dirs[:i] {
						_ = os.RemoveAll(d)
					}
					return
				}
				dirs[i] = d
			}
			// Formed, not waited for: with nodes that ping each peer
			// every 7.5 s, every node took 3-6 s more to see every
			// replica; takeAhead waits, at 1 s.
			if sp.c, sp.err = formCluster(bin, dirs, replicas, true, sharedNodeTimeout); sp.err != nil {
				for _, d := range dirs {
					_ = os.RemoveAll(d)
				}
			}
		}()
		ahead.ready[shape] = append(ahead.ready[shape], sp)
	}
}

// takeAhead returns a cluster of that shape started ahead, with its nodes'
// timeout set to failoverNodeTimeout, or nil (and no error) if none is
// left.
func takeAhead(masters, replicas int) (*Cluster, error) {
	shape := [2]int{masters, replicas}
	ahead.mu.Lock()
	var sp *spare
	if q := ahead.ready[shape]; len(q) > 0 {
		sp, ahead.ready[shape] = q[0], q[1:]
	}
	ahead.mu.Unlock()
	if sp == nil {
		return nil, nil
	}
	<-sp.done
	if sp.err != nil {
		return nil, sp.err
	}
	c := sp.c
	ms := strconv.FormatInt(failoverNodeTimeout.Milliseconds(), 10)
	for _, s := range c.all() {
		if _, err := s.admin.do(adminTimeout, "CONFIG", "SET", "cluster-node-timeout", ms); err != nil {
			_ = c.close()
			return nil, fmt.Errorf("CONFIG SET cluster-node-timeout %s on %s: %w", ms, s.addr, err)
		}
		s.nodeTimeout = failoverNodeTimeout // for a restart
	}
	if err := c.waitHealthy(clusterTimeout); err != nil {
		_ = c.close()
		return nil, err
	}
	return c, nil
}

// stopAhead stops the clusters started ahead and not taken, waiting for
// those still starting.
func stopAhead() error {
	ahead.mu.Lock()
	left := ahead.ready
	ahead.ready = nil
	ahead.mu.Unlock()
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, q := range left {
		for _, sp := range q {
			wg.Go(func() {
				<-sp.done
				if sp.c != nil {
					if err := sp.c.close(); err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
				}
			})
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}
