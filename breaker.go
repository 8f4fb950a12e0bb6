package packcache

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// A breaker stops calls from waiting on a Redis node that keeps failing:
// after cfg.failures consecutive failures it opens for cfg.cooldown, then
// lets one call through to probe. The probe's success closes it; its
// failure opens it again.
type breaker struct {
	mu        sync.Mutex // orders openings and closings, so observers see them in order
	cfg       breakerConfig
	addr      string   // the node's address, for observers; "" on a single node
	obs       Observer // told when it opens or closes; nil: nobody
	failures  atomic.Int64
	openUntil atomic.Int64 // unix nanoseconds; 0 when closed
	probeAt   atomic.Int64 // unix nanoseconds the probe began; 0 when none
}

// allow reports whether a call may try the node.
func (b *breaker) allow() bool {
	until := b.openUntil.Load()
	if until == 0 {
		return true
	}
	now := time.Now().UnixNano()
	if now < until {
		return false
	}
	// Half open: one probe at a time. A probe that never reported (its
	// caller gave up first) is replaced after a cool-down.
	p := b.probeAt.Load()
	if p != 0 && now-p < int64(b.cfg.cooldown) {
		return false
	}
	return b.probeAt.CompareAndSwap(p, now)
}

func (b *breaker) success() {
	if b.failures.Load() != 0 {
		b.failures.Store(0)
	}
	if b.openUntil.Load() != 0 {
		b.mu.Lock()
		if b.openUntil.Swap(0) != 0 {
			b.probeAt.Store(0)
			b.notify(false)
		}
		b.mu.Unlock()
	}
}

func (b *breaker) failure() {
	if b.cfg.failures <= 0 {
		return
	}
	if n := b.failures.Add(1); n >= int64(b.cfg.failures) || b.openUntil.Load() != 0 {
		b.mu.Lock()
		old := b.openUntil.Swap(time.Now().Add(b.cfg.cooldown).UnixNano())
		b.probeAt.Store(0)
		if old == 0 {
			b.notify(true)
		}
		b.mu.Unlock()
	}
}

// trip opens the breaker at once, for a failure that leaves no doubt: a
// refused connection.
func (b *breaker) trip() {
	if b.cfg.failures <= 0 {
		return
	}
	b.failures.Store(int64(b.cfg.failures))
	b.mu.Lock()
	old := b.openUntil.Swap(time.Now().Add(b.cfg.cooldown).UnixNano())
	b.probeAt.Store(0)
	if old == 0 {
		b.notify(true)
	}
	b.mu.Unlock()
}

func (b *breaker) notify(open bool) {
	if b.obs != nil {
		state := "closed"
		if open {
			state = "open"
		}
		b.obs.ObserveRedis(RedisEvent{Node: b.addr, Breaker: state})
	}
}

// nodes holds one breaker per Redis node. On a *redis.ClusterClient a key's
// node is its slot's master, as the client itself maps it; on any other
// client every key has the one node.
type nodes struct {
	cfg     breakerConfig
	obs     Observer
	cluster *redis.ClusterClient
	one     breaker // the node of a non-cluster client, and of keys whose master is unknown
	byAddr  sync.Map
}

func newNodes(rdb redis.UniversalClient, cfg breakerConfig, obs Observer) *nodes {
	n := &nodes{cfg: cfg, obs: obs}
	n.one.cfg, n.one.obs = cfg, obs
	n.cluster, _ = rdb.(*redis.ClusterClient)
	if c, ok := rdb.(*redis.Client); ok {
		n.one.addr = c.Options().Addr // "FailoverClient" through Sentinel
	}
	return n
}

// forKey returns the breaker of key's node. It costs a slot computation
// and a map read on a cluster, and nothing otherwise.
func (n *nodes) forKey(ctx context.Context, key string) *breaker {
	if n.cluster == nil {
		return &n.one
	}
	cl, err := n.cluster.MasterForKey(ctx, key)
	if err != nil {
		// No cluster state at all (no node answered): the failure that
		// follows is charged to the shared bucket.
		return &n.one
	}
	return n.forAddr(cl.Options().Addr)
}

// forAddr returns the breaker of the node at addr: on a Cluster, the
// master there; on any other client, the one node.
func (n *nodes) forAddr(addr string) *breaker {
	if n.cluster == nil {
		return &n.one
	}
	if b, ok := n.byAddr.Load(addr); ok {
		return b.(*breaker)
	}
	b, _ := n.byAddr.LoadOrStore(addr, &breaker{cfg: n.cfg, addr: addr, obs: n.obs})
	return b.(*breaker)
}

// outcome is what one Redis operation says about its node's health.
type outcome uint8

const (
	healthy     outcome = iota // the node answered (a value, nil, or an error reply about the data)
	neutral                    // says nothing of the node: the caller's own context ended
	failed                     // the node's own failure
	refusedConn                // nothing listens at the node's address: open the breaker now
)

// judgeRedis classifies err from a Redis operation whose caller's context
// is still live (see judgeCall): the node answered, or it failed.
func judgeRedis(err error) outcome {
	if err == nil || err == redis.Nil {
		return healthy
	}
	var re redis.Error
	if errors.As(err, &re) {
		// An error reply: the node is up unless the reply says it cannot
		// serve (still loading its data set, cut off from the cluster or
		// its master).
		msg := re.Error()
		for _, p := range unavailableReplies {
			if strings.HasPrefix(msg, p) {
				return failed
			}
		}
		return healthy
	}
	// Network errors, refused connections, an exhausted pool, and the
	// cache's own budget running out (the caller's context is still live,
	// so a deadline error is the budget's).
	return failed
}

var unavailableReplies = []string{"LOADING", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN"}

// feed tells b what an operation's outcome says of its node.
func (b *breaker) feed(o outcome) {
	switch o {
	case healthy:
		b.success()
	case failed:
		b.failure()
	case refusedConn:
		b.trip()
	}
}
