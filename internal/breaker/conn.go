package breaker

import (
	"context"
	"crypto/tls"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"
)

// What the cache learns from the connections themselves. A call that ran
// out of its budget may have waited on Redis, or on this process: for a
// CPU among thousands of goroutines, for a pooled connection, for a dial.
// Only the first is a failure of Redis's (see Judge). The connections
// tell them apart: New adds dialHook to the client, which wraps each
// connection the client makes so that its node learns when bytes last
// came back from Redis and since when a command written to it has had no
// reply; and which notes every dial that fails, whatever goroutine of
// go-redis's made it (go-redis dials on goroutines of its own, under
// contexts that are not the call's): a refused one opens the node's
// breaker in every cache over the client.

// A hub is where the caches over one client learn what its connections
// saw: the client gets one dialHook, whatever the number of caches over
// it, and each connection it dials reports to the node of every cache
// registered then. Hubs are kept by client, in hubs.
type hub struct {
	mu     sync.Mutex
	caches atomic.Pointer[[]*Nodes] // replaced, never changed in place
}

// hubs maps a client (weakly: a client no one holds is dropped) to its hub.
var hubs sync.Map // weak.Pointer[C] -> *hub

// hubFor returns c's hub, making it and hooking c (through hook, called
// once per client) if c has none yet.
func hubFor[C any](c *C, hook func(*hub)) *hub {
	key := weak.Make(c)
	if h, ok := hubs.Load(key); ok {
		return h.(*hub)
	}
	h, loaded := hubs.LoadOrStore(key, &hub{})
	if !loaded {
		runtime.AddCleanup(c, func(k weak.Pointer[C]) { hubs.Delete(k) }, key)
		hook(h.(*hub))
	}
	return h.(*hub)
}

// hooked holds the node clients of Clusters that hookNode hooked,
// weakly: a client no one holds is dropped.
var hooked sync.Map // weak.Pointer[redis.Client] -> struct{}

// hookNode hooks cl, a node client of the Cluster whose hub is h, once,
// however many caches over the Cluster meet it and however they do: the
// cluster makes it (OnNewNode), or a cache's call meets it, made before
// the first cache (Nodes.ForKey).
func hookNode(cl *redis.Client, h *hub) {
	key := weak.Make(cl)
	if _, loaded := hooked.LoadOrStore(key, struct{}{}); loaded {
		return
	}
	runtime.AddCleanup(cl, func(k weak.Pointer[redis.Client]) { hooked.Delete(k) }, key)
	cl.AddHook(dialHook{h})
}

func (h *hub) add(n *Nodes) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var cur []*Nodes
	if p := h.caches.Load(); p != nil {
		cur = *p
	}
	next := append(slices.Clip(cur), n)
	h.caches.Store(&next)
}

func (h *hub) remove(n *Nodes) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.caches.Load()
	if p == nil {
		return
	}
	next := slices.DeleteFunc(slices.Clone(*p), func(m *Nodes) bool { return m == n })
	h.caches.Store(&next)
}

// watchDials makes rdb's connections report to n's nodes: through the
// client's hub for a single-node or Cluster client (on a Cluster, each
// node's client is hooked as the cluster makes it, or, if the cluster
// made it before, when a cache first calls the node: see hookNode), or
// through a hook of n's own for a client of another kind. Connections
// the client made before its first cache was made are not watched: see
// Judge. Close ends the reports (hub.remove).
func watchDials(rdb redis.UniversalClient, n *Nodes) *hub {
	var h *hub
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		h = hubFor(c, func(h *hub) { c.OnNewNode(func(cl *redis.Client) { hookNode(cl, h) }) })
	case *redis.Client:
		h = hubFor(c, func(h *hub) { c.AddHook(dialHook{h}) })
	default:
		h = &hub{}
		rdb.AddHook(dialHook{h})
	}
	h.add(n)
	return h
}

// dialHook watches the connections of a client for the caches of its hub:
// see above. It changes nothing else: commands and pipelines pass through
// untouched.
type dialHook struct{ hub *hub }

func (d dialHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		p := d.hub.caches.Load()
		if p == nil || len(*p) == 0 {
			return conn, err
		}
		if err != nil {
			f := &dialFailure{addr: addr, err: err, at: time.Now().UnixNano()}
			if b, ok := ctx.Value(budgetKey{}).(*Budget); ok {
				b.dialed.Store(f)
			}
			refusedBy := make([]*Node, 0, len(*p))
			for _, n := range *p {
				if b := n.forAddr(addr); b.refusedDial(f) {
					refusedBy = append(refusedBy, b)
				}
			}
			for _, b := range refusedBy {
				b.ticks.abort()
			}
			return conn, err
		}
		watchers := make([]*Node, len(*p))
		for i, n := range *p {
			watchers[i] = n.forAddr(addr)
		}
		return watch(conn, watchers), nil
	}
}

func (dialHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (dialHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A watchedConn is a connection to a node that tells the node (its breaker
// in each cache over the client) when it reads a reply and when it writes
// a command, and keeps, for itself, since when a command written on it
// has had no reply (sent): what a node that answers other connections
// but not this one's command is judged by (see Node.unresponsive).
type watchedConn struct {
	net.Conn
	nodes  []*Node
	sent   atomic.Int64 // unix nanoseconds the first command written since the last reply was; 0: none waits
	closed atomic.Bool
}

func (c *watchedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.sent.Load() != 0 {
		c.sent.Store(0)
	}
	c.tell(n, (*Node).answered)
	return n, err
}

func (c *watchedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 && c.sent.Load() == 0 {
		c.sent.CompareAndSwap(0, time.Now().UnixNano())
	}
	c.tell(n, (*Node).asked)
	return n, err
}

// tell calls note for every node, with the time now, if n, the bytes read
// or written, is not zero.
func (c *watchedConn) tell(n int, note func(b *Node, now int64)) {
	if n > 0 {
		now := time.Now().UnixNano()
		for _, b := range c.nodes {
			note(b, now)
		}
	}
}

func (c *watchedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		for _, b := range c.nodes {
			b.watched.Add(-1)
		}
	}
	return c.Conn.Close()
}

// A peekedConn is a watchedConn whose socket the cache can look at
// without reading it (waiting): whether the reply to a command that has
// had none is there, unread. That socket is the connection's own, or,
// for TLS, the one beneath it, where a reply's records wait until the
// TLS layer reads them. Its nodes list it while it is open (Node.conns),
// so that a call can be judged by what the node's other connections wait
// on.
type peekedConn struct {
	*watchedConn
	peek syscall.Conn
}

// Close tells the node, before it closes the connection, whether a reply
// was waiting unread on it. go-redis closes a connection whose call ran
// out of its budget. If the reply had come meanwhile, and only the
// goroutine meant to read it was late (waiting for a CPU), the node did
// answer, and the call is judged late, not failed. If nothing had come
// for the command it waits on, the node did not answer it from when it
// was sent to now: the node keeps that silence (Node.silent).
func (c *peekedConn) Close() error {
	if !c.closed.Load() {
		now := time.Now().UnixNano()
		if waiting(c.peek) {
			for _, b := range c.nodes {
				b.answered(now)
			}
		} else if sent := c.sent.Load(); sent != 0 && peeks {
			for _, b := range c.nodes {
				b.silent(sent, now)
			}
		}
		for _, b := range c.nodes {
			b.conns.Delete(c)
		}
	}
	return c.watchedConn.Close()
}

// unanswered reports since when the command the connection waits on has
// had no reply, with nothing waiting unread on the socket: 0 if none
// waits, or its reply is there.
func (c *peekedConn) unanswered() int64 {
	sent := c.sent.Load()
	if sent == 0 || !peeks || waiting(c.peek) || c.sent.Load() != sent {
		return 0
	}
	return sent
}

// A watchedSysConn is a peekedConn whose connection gives access to its
// file descriptor, which go-redis uses to check an idle connection's
// health before reuse: the wrapper must not hide it. (A TLS connection
// gives none, and its wrapper gives none either: go-redis would read TLS
// records, such as TLS 1.3's session tickets, as data it did not expect.)
type watchedSysConn struct {
	*peekedConn
	sys syscall.Conn
}

func (c *watchedSysConn) SyscallConn() (syscall.RawConn, error) { return c.sys.SyscallConn() }

func watch(conn net.Conn, nodes []*Node) net.Conn {
	for _, b := range nodes {
		b.watched.Add(1)
	}
	w := &watchedConn{Conn: conn, nodes: nodes}
	sys, _ := conn.(syscall.Conn)
	peek := sys
	if tc, ok := conn.(*tls.Conn); ok && peek == nil {
		peek, _ = tc.NetConn().(syscall.Conn)
	}
	if peek == nil {
		return w
	}
	pc := &peekedConn{w, peek}
	if peeks {
		for _, b := range nodes {
			b.conns.Store(pc, struct{}{})
		}
	}
	if sys != nil {
		return &watchedSysConn{pc, sys}
	}
	return pc
}
