package packcache

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Pending invalidations through a Cluster failover. go-redis routes a
// key's commands by its map of the slots, which it reloads when a node
// answers MOVED, and otherwise about once a minute. A master that hangs
// (a stopped process, a host gone silent) answers nothing: its replica is
// promoted after the cluster's node timeout, but the client's map still
// names the hung master, so a pending invalidation retried through the
// client would go to it until the map is reloaded, or until it resumes,
// while every other process reads the old value from the new master.
//
// So on a Cluster each retry round of the pending invalidations also
// sends each key's DEL to a replica of its slot, as the client's map
// names it, concurrently with the DEL sent to the slot's master through
// the client:
//
//   - A replica that has been promoted owns the slot and runs the DEL: the
//     invalidation is answered there, as it would be by the master.
//   - A replica not promoted answers MOVED, naming the master it follows.
//     That is no landing. A MOVED naming a third node (another replica,
//     promoted) is followed: the DEL is sent there.
//   - While the master's DEL has not come back, the replicas are asked
//     again every failoverProbe, so that the DEL lands within about
//     failoverProbe of a promotion that happens during a round, not a
//     Redis budget later.
//
// A Redis failure of any call on a Cluster also asks go-redis to reload its
// map (ClusterClient.ReloadState, in the background), so that the
// process's other calls follow the new master too.
//
// A DEL sent to a node that does not own the slot changes nothing (the
// node answers MOVED), and a DEL the hung master runs when it resumes runs
// on data it is about to replace with its new master's, so the extra
// sends cannot undo a write.

// failoverProbe is how often a round whose master has not answered asks
// the replicas again.
const failoverProbe = 50 * time.Millisecond

// peers holds the client of each node go-redis made for a Cluster since
// New, by address: where a MOVED names a node, the client to follow it
// with.
type peers struct {
	cluster *redis.ClusterClient // nil: not a Cluster
	mu      sync.Mutex
	byAddr  map[string]*redis.Client
}

// watch records rdb's node clients from now on, if rdb is a Cluster.
func (p *peers) watch(rdb redis.UniversalClient) {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return
	}
	p.cluster = cc
	p.byAddr = map[string]*redis.Client{}
	cc.OnNewNode(func(n *redis.Client) {
		p.mu.Lock()
		p.byAddr[n.Options().Addr] = n
		p.mu.Unlock()
	})
}

func (p *peers) client(addr string) *redis.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.byAddr[addr]
}

// stale tells go-redis that its map of the Cluster's slots may be out of
// date: it reloads it in the background (at most one reload at a time).
func (p *peers) stale() {
	if p.cluster != nil {
		p.cluster.ReloadState(context.Background())
	}
}

// retryOnReplicas sends the owed DELs of keys (keeps[i] is key i's spared
// SHA-1) to the replicas of their slots, as described above, until each
// has run on a node that owns its slot, or the master's round ends (done
// closes), or ctx's Redis budget ends. It reports which keys ran, and
// whether any was sent to a replica. Once every key has run, it calls
// all: the round need not wait for the hung master.
func (c *Cache[T]) retryOnReplicas(ctx context.Context, keys, keeps []string, done <-chan struct{}, all func()) (ran []bool, sent bool) {
	ran = make([]bool, len(keys))
	p := &c.peers
	bud := c.budget(ctx)
	defer bud.end()
	tick := time.NewTicker(failoverProbe)
	defer tick.Stop()
	for {
		// The replicas each key's slot has now, as the client maps it:
		// keys whose slot has none but its master are not sent.
		groups := map[*redis.Client][]int{}
		for i, k := range keys {
			if ran[i] {
				continue
			}
			m, err := p.cluster.MasterForKey(bud, k)
			if err != nil {
				continue
			}
			r, err := p.cluster.SlaveForKey(bud, k)
			if err != nil || r.Options().Addr == m.Options().Addr {
				continue
			}
			groups[r] = append(groups[r], i)
		}
		if len(groups) == 0 {
			return ran, sent
		}
		sent = true
		var wg sync.WaitGroup
		var mu sync.Mutex
		for r, idx := range groups {
			wg.Go(func() {
				got := c.owedOnNode(bud, r, keys, keeps, idx)
				mu.Lock()
				for _, i := range got {
					ran[i] = true
				}
				mu.Unlock()
			})
		}
		wg.Wait()
		left := 0
		for _, r := range ran {
			if !r {
				left++
			}
		}
		if left == 0 {
			all()
			return ran, sent
		}
		select {
		case <-done:
			return ran, sent
		case <-bud.Done():
			return ran, sent
		case <-tick.C:
		}
	}
}

// owedOnNode sends the owed DELs of keys[idx] to node n in one pipeline,
// follows each MOVED that names a node other than n and the slot's
// master once, and returns the indexes of the keys whose DEL ran.
func (c *Cache[T]) owedOnNode(ctx context.Context, n *redis.Client, keys, keeps []string, idx []int) []int {
	var ran []int
	moved := map[string][]int{}
	send := func(n *redis.Client, idx []int) []redis.Cmder {
		pipe := n.Pipeline()
		cmds := make([]redis.Cmder, len(idx))
		for j, i := range idx {
			cmds[j] = runScript(ctx, pipe, owedScript, true, keys[i], keeps[i])
		}
		_, _ = pipe.Exec(ctx)
		again := false
		for j, cmd := range cmds {
			if isNoScript(cmd.Err()) {
				cmds[j] = runScript(ctx, pipe, owedScript, false, keys[idx[j]], keeps[idx[j]])
				again = true
			}
		}
		if again {
			_, _ = pipe.Exec(ctx)
		}
		return cmds
	}
	for j, cmd := range send(n, idx) {
		i := idx[j]
		switch err := cmd.Err(); {
		case err == nil:
			ran = append(ran, i)
		case movedTo(err) != "":
			to := movedTo(err)
			m, merr := c.peers.cluster.MasterForKey(ctx, keys[i])
			if to != n.Options().Addr && (merr != nil || to != m.Options().Addr) {
				moved[to] = append(moved[to], i)
			}
		}
	}
	for addr, idx := range moved {
		t := c.peers.client(addr)
		if t == nil {
			continue // a node go-redis has not met: its reload will
		}
		for j, cmd := range send(t, idx) {
			if cmd.Err() == nil {
				ran = append(ran, idx[j])
			}
		}
	}
	return ran
}

// movedTo returns the address a MOVED error reply names, or "".
func movedTo(err error) string {
	s := err.Error()
	if !strings.HasPrefix(s, "MOVED ") {
		return ""
	}
	f := strings.Fields(s)
	if len(f) != 3 {
		return ""
	}
	return f[2]
}
