package breaker

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Nodes holds one Node per Redis node of a client. On a
// *redis.ClusterClient a key's node is its slot's master, as the client
// itself maps it; on any other client every key has the one node.
type Nodes struct {
	cfg     Config
	notify  Notifier
	budget  time.Duration // each call's
	step    int64         // the ticks' step
	pool    int           // the client's connections per node; 0: unknown
	cluster *redis.ClusterClient
	one     Node // the node of a non-cluster client, and of keys whose master is unknown
	byAddr  sync.Map
	hub     *hub // where the client's connections report (conn.go)
}

// New returns the nodes of rdb, whose calls get budget each. Watch makes
// rdb's connections report to them.
func New(rdb redis.UniversalClient, cfg Config, notify Notifier, budget time.Duration) *Nodes {
	n := &Nodes{cfg: cfg, notify: notify, budget: budget, step: int64(max(budget/16, time.Millisecond))}
	n.cluster, _ = rdb.(*redis.ClusterClient)
	switch c := rdb.(type) {
	case *redis.Client:
		n.pool = c.Options().PoolSize
	case *redis.ClusterClient:
		n.pool = c.Options().PoolSize
	}
	addr := ""
	if c, ok := rdb.(*redis.Client); ok {
		addr = c.Options().Addr // "FailoverClient" through Sentinel
		n.one.pool.Store(c)
	}
	n.init(&n.one, addr)
	n.one.known()
	return n
}

// Watch makes the connections rdb dials from now on report to n (see
// conn.go), until Close. Connections the client made before are not
// watched: see Node.unresponsive.
func (n *Nodes) Watch(rdb redis.UniversalClient) { n.hub = watchDials(rdb, n) }

// Close stops the reports of the client's connections to n.
func (n *Nodes) Close() {
	if n.hub != nil {
		n.hub.remove(n)
	}
}

// init readies a node. The caller tells the notifier of it (known) once
// it is in use.
func (n *Nodes) init(b *Node, addr string) {
	b.cfg, b.notify, b.addr = n.cfg, n.notify, addr
	b.since.Store(time.Now().UnixNano())
	b.ticks.step = n.step
	if n.pool > 0 {
		r := n.pool / 4
		b.slots = make(chan struct{}, n.pool-r)
		if r > 0 {
			b.reserve = make(chan struct{}, r)
		}
	}
}

// One is the node of a single-node client, and on a Cluster the node of
// calls whose key's master is unknown and of pipelines over several.
func (n *Nodes) One() *Node { return &n.one }

// ForKey returns key's node. It costs a slot computation and a map read
// on a Cluster, and nothing otherwise; on a Cluster whose slot map is not
// loaded yet, loading it is a Redis call bounded by ctx, which the caller
// gives a budget (see Nodes.Budget).
func (n *Nodes) ForKey(ctx context.Context, key string) *Node {
	if n.cluster == nil {
		return &n.one
	}
	cl, err := n.cluster.MasterForKey(ctx, key)
	if err != nil {
		// No cluster state at all (no node answered): the failure that
		// follows is charged to the shared bucket.
		return &n.one
	}
	b := n.forAddr(cl.Options().Addr)
	if b.pool.Load() != cl {
		b.pool.Store(cl)
		if n.hub != nil {
			// A node client the cluster made before the first cache
			// watched it is met here first: watched from now on.
			hookNode(cl, n.hub)
		}
	}
	return b
}

// Find returns key's node as ForKey does, under a budget of its own from
// ctx when finding it may be a Redis call.
func (n *Nodes) Find(ctx context.Context, key string) *Node {
	if n.cluster == nil {
		return &n.one
	}
	bud := n.Budget(ctx, &n.one)
	defer bud.End()
	return n.ForKey(bud, key)
}

// forAddr returns the node at addr: on a Cluster, the master there; on
// any other client, the one node.
func (n *Nodes) forAddr(addr string) *Node {
	if n.cluster == nil {
		return &n.one
	}
	if b, ok := n.byAddr.Load(addr); ok {
		return b.(*Node)
	}
	nb := &Node{}
	n.init(nb, addr)
	b, loaded := n.byAddr.LoadOrStore(addr, nb)
	if !loaded {
		nb.known()
	}
	return b.(*Node)
}

// Each calls f with each node the cache has a state for: the node of a
// single-node client; on a Cluster each master a call went to, ordered
// by address, and the shared node of calls whose master is unknown if
// its breaker ever opened.
func (n *Nodes) Each(f func(*Node)) {
	if n.cluster == nil {
		f(&n.one)
		return
	}
	if n.one.opened.Load() != 0 {
		f(&n.one)
	}
	var masters []*Node
	n.byAddr.Range(func(_, b any) bool {
		masters = append(masters, b.(*Node))
		return true
	})
	slices.SortFunc(masters, func(a, b *Node) int { return strings.Compare(a.addr, b.addr) })
	for _, b := range masters {
		f(b)
	}
}

// Waiting is the number of calls waiting for a slot, over every node.
func (n *Nodes) Waiting() int64 {
	w := n.one.Waiting()
	n.byAddr.Range(func(_, b any) bool {
		w += b.(*Node).Waiting()
		return true
	})
	return w
}

// A Batch is the nodes of a pipeline's keys: each node is asked once
// whether it may be tried, and told once what the pipeline says of it.
type Batch struct {
	of      []*Node
	allow   map[*Node]bool
	outcome map[*Node]Outcome
}

// Batch returns the nodes of keys. ctx is the pipeline's budgeted
// context: finding a key's node can be a Redis call.
func (n *Nodes) Batch(ctx context.Context, keys []string) *Batch {
	nb := &Batch{of: make([]*Node, len(keys)), allow: map[*Node]bool{}, outcome: map[*Node]Outcome{}}
	for i, k := range keys {
		b := n.ForKey(ctx, k)
		nb.of[i] = b
		if _, asked := nb.allow[b]; !asked {
			nb.allow[b] = b.Allow()
		}
	}
	return nb
}

// Of is key i's node.
func (nb *Batch) Of(i int) *Node { return nb.of[i] }

// Allowed reports whether key i's node may be tried.
func (nb *Batch) Allowed(i int) bool { return nb.allow[nb.of[i]] }

// Saw records the outcome of key i's command: a node that failed any
// command failed the batch once; one whose caller gave up says nothing.
func (nb *Batch) Saw(i int, o Outcome) {
	b := nb.of[i]
	if cur, ok := nb.outcome[b]; !ok || o > cur {
		nb.outcome[b] = o
	}
}

// Feed tells each node once what the batch said of it.
func (nb *Batch) Feed() {
	for b, o := range nb.outcome {
		b.Feed(o)
	}
}
