package packcache

import (
	"context"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/internal/tracking"
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
// So on a Cluster each retry round (internal/owed) also sends each key's DEL to a few
// other nodes, concurrently with the DEL sent to the slot's master through
// the client: a replica of the slot, as the client's map names it, and
// others the client has met, at random, up to failoverFanout:
//
//   - A replica that has been promoted owns the slot and runs the DEL: the
//     invalidation is answered there, as it would be by the master.
//   - A node that does not own the slot answers MOVED, naming the master
//     it knows (or CLUSTERDOWN while the cluster has not settled). A MOVED
//     naming the master the client maps the slot to is no news; one
//     naming another node (the promoted replica, which every node learns
//     of within moments of the promotion) is followed: the DEL is sent
//     there.
//   - While the master's DEL has not come back, this is done again every
//     owed.ProbeEvery (50 ms), and the next round follows that long after
//     one that nothing answered: the DEL reaches a promoted replica about
//     50 ms after the promotion, not a Redis budget later.
//
// (go-redis's own choice of a replica, SlaveForKey, is not enough alone:
// it answers with the master while it holds the replica for failing, for
// up to FailingTimeoutSeconds.)
//
// A Redis failure of any call on a Cluster also asks go-redis to reload its
// map (ClusterClient.ReloadState, in the background), so that the
// process's other calls follow the new master too.
//
// A DEL sent to a node that does not own the slot changes nothing (the
// node answers MOVED), and a DEL the hung master runs when it resumes runs
// on data it is about to replace with its new master's, so the extra
// sends cannot undo a write.

// failoverFanout is how many nodes besides the master each probe asks.
const failoverFanout = 3

// peers holds the client of each node go-redis made for a Cluster since
// New, by address: where a MOVED names a node, the client to follow it
// with. For a node go-redis has not made a client of (its map does not
// list the node: it was loaded from a view that did not, and its reload
// may wait on the hung master for the client's ReadTimeout), peers makes
// one of its own, with the options of the Cluster's node clients, and
// closes it with the cache.
type peers struct {
	cluster *redis.ClusterClient // nil: not a Cluster
	mu      sync.Mutex
	byAddr  map[string]*redis.Client
	own     map[string]*redis.Client // made by peers; closed by close
	closed  bool
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

// client returns the client of the node at addr, making one if go-redis
// has none (nil once closed, or before go-redis made any node client to
// copy the options of).
func (p *peers) client(addr string) *redis.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.byAddr[addr]; c != nil {
		return c
	}
	if c := p.own[addr]; c != nil || p.closed {
		return c
	}
	for _, like := range p.byAddr {
		o := *like.Options()
		o.Addr = addr
		tracking.Own(&o) // as the tracker's connections
		c := redis.NewClient(&o)
		if p.own == nil {
			p.own = map[string]*redis.Client{}
		}
		p.own[addr] = c
		return c
	}
	return nil
}

// close closes the clients peers made.
func (p *peers) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	for _, c := range p.own {
		c.Close()
	}
}

// others returns up to n node clients, not at addr: first the client's
// choice of a replica of key's slot, then nodes met since New, in no set
// order.
func (p *peers) others(ctx context.Context, key, addr string, n int) []*redis.Client {
	var out []*redis.Client
	seen := map[string]bool{addr: true}
	if r, err := p.cluster.SlaveForKey(ctx, key); err == nil && !seen[r.Options().Addr] {
		seen[r.Options().Addr] = true
		out = append(out, r)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for a, c := range p.byAddr { // map order: a different few each time
		if len(out) == n {
			break
		}
		if !seen[a] {
			seen[a] = true
			out = append(out, c)
		}
	}
	return out
}

// stale tells go-redis that its map of the Cluster's slots may be out of
// date: it reloads it in the background (at most one reload at a time).
func (p *peers) stale() {
	if p.cluster != nil {
		p.cluster.ReloadState(context.Background())
	}
}

// probe sends the owed invalidations (owedCommand: a DEL, or a group's
// invalidation script) of the keys i not ran[i] (keeps[i] is key
// i's spared SHA-1) to up to failoverFanout nodes besides the master the
// client maps each key's slot to, following their MOVED replies, as
// described above, within ctx, a Redis budget. It sets ran[i] for each
// key whose DEL ran, and reports whether it sent any.
func (p *peers) probe(ctx context.Context, keys, keeps []string, ran []bool) (sent bool) {
	// The keys left, by the master the client maps their slots to.
	byMaster := map[string][]int{}
	for i, k := range keys {
		if ran[i] {
			continue
		}
		m, err := p.cluster.MasterForKey(ctx, k)
		if err != nil {
			continue
		}
		byMaster[m.Options().Addr] = append(byMaster[m.Options().Addr], i)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for master, idx := range byMaster {
		for _, n := range p.others(ctx, keys[idx[0]], master, failoverFanout) {
			sent = true
			wg.Go(func() {
				got := p.invalidate(ctx, n, master, keys, keeps, idx)
				mu.Lock()
				for _, i := range got {
					ran[i] = true
				}
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	return sent
}

// invalidate sends the owed DELs of keys[idx], whose slots the client
// maps to master, to node n in one pipeline, follows once each MOVED that
// names a node other than n and master, and returns the indexes of the
// keys whose DEL ran.
func (p *peers) invalidate(ctx context.Context, n *redis.Client, master string, keys, keeps []string, idx []int) []int {
	var ran []int
	moved := map[string][]int{}
	send := func(n *redis.Client, idx []int) []redis.Cmder {
		pipe := n.Pipeline()
		cmds := make([]redis.Cmder, len(idx))
		for j, i := range idx {
			cmds[j] = owedCommand(ctx, pipe, true, keys[i], keeps[i])
		}
		_, _ = pipe.Exec(ctx)
		again := false
		for j, cmd := range cmds {
			if isNoScript(cmd.Err()) {
				cmds[j] = owedCommand(ctx, pipe, false, keys[idx[j]], keeps[idx[j]])
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
			if to := movedTo(err); to != n.Options().Addr && to != master {
				moved[to] = append(moved[to], i)
			}
		}
	}
	for addr, idx := range moved {
		t := p.client(addr)
		if t == nil {
			continue // closed
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
