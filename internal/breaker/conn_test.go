package breaker

import (
	"context"
	"errors"
	"net"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/internal/redistest"
)

// A refused dial, made on a goroutine of go-redis's own under a context
// that is not the call's, still opens the breaker of every Nodes over the
// client at once and is named as the call's cause.
func TestRefusedDialTripsEveryWatcher(t *testing.T) {
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "needs a server that can be stopped")
	rdb := s.Client(t, func(o *redis.Options) { o.MaxRetries = -1 })
	var a, b events
	na := New(rdb, Config{Failures: 100, Cooldown: time.Hour}, &a, time.Second)
	nb := New(rdb, Config{Failures: 100, Cooldown: time.Hour}, &b, time.Second)
	na.Watch(rdb)
	nb.Watch(rdb)
	defer na.Close()
	defer nb.Close()
	s.Stop(t)
	bud := na.Budget(context.Background(), na.One())
	err := rdb.Get(bud, "k").Err()
	bud.End()
	o, cause := Judge(context.Background(), bud, na.One(), err)
	if o != RefusedConn || !errors.Is(cause, syscall.ECONNREFUSED) {
		t.Fatalf("Judge = %v, %v; want RefusedConn naming the refusal", o, cause)
	}
	for i, n := range []*Nodes{na, nb} {
		if n.One().Allow() {
			t.Fatalf("watcher %d: the breaker is closed after a refused dial", i)
		}
		if c := n.One().OpenCause(); !errors.Is(c, syscall.ECONNREFUSED) {
			t.Fatalf("watcher %d: OpenCause = %v, want the refusal", i, c)
		}
	}
}

// Reads are reported to the node; a Nodes closed hears no more.
func TestWatchedConnectionsReport(t *testing.T) {
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "needs real connections")
	rdb := s.Client(t)
	n := New(rdb, Config{Failures: 1, Cooldown: time.Hour}, nil, time.Second)
	n.Watch(rdb)
	before := time.Now().UnixNano()
	if err := rdb.Get(context.Background(), "k").Err(); err != redis.Nil {
		t.Fatal(err)
	}
	if got := n.One().lastRead.Load(); got < before {
		t.Fatalf("lastRead %d, before the GET %d", got, before)
	}
	if n.One().watched.Load() < 1 || n.One().unanswered.Load() != 0 {
		t.Fatalf("watched %d, unanswered %d; want ≥1, 0", n.One().watched.Load(), n.One().unanswered.Load())
	}
	n.Close()
	if err := rdb.Close(); err != nil {
		t.Fatal(err)
	}
	rdb2 := s.Client(t)
	n.Watch(rdb2)
	n.Close()
	after := n.One().lastRead.Load()
	if err := rdb2.Get(context.Background(), "k").Err(); err != redis.Nil {
		t.Fatal(err)
	}
	if got := n.One().lastRead.Load(); got != after {
		t.Fatal("a closed Nodes still hears its client's connections")
	}
}

// On a Cluster, every connection a node client dials once a Nodes
// watches the client is watched, once: whether the cluster made the node
// client before Watch (hooked when ForKey meets it) or after (hooked as it
// is made), and however many Nodes watch it or meet it.
func TestClusterNodesWatchedOnce(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	ctx := context.Background()
	for _, before := range []bool{true, false} {
		rdb := cl.Client(t)
		if before {
			// Every node client made, before any Nodes watches.
			if err := rdb.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil }); err != nil {
				t.Fatal(err)
			}
		}
		var all []*Nodes
		for range 2 {
			n := New(rdb, Config{Failures: 1, Cooldown: time.Hour}, nil, time.Second)
			n.Watch(rdb)
			defer n.Close()
			all = append(all, n)
		}
		// Each node's connections dialled before Watch.
		was := map[string]int64{}
		for i := range 30 {
			key := "w" + string(rune('a'+i))
			m, err := rdb.MasterForKey(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := was[m.Options().Addr]; !ok {
				was[m.Options().Addr] = 0
				if before {
					was[m.Options().Addr] = pooled(m.PoolStats())
				}
			}
			for _, n := range all {
				n.ForKey(ctx, key)
			}
			// A command, a pipeline (go-redis may give pipelines a pool
			// of their own), and a connection held.
			if err := m.Get(ctx, key).Err(); err != redis.Nil {
				t.Fatal(err)
			}
			pipe := m.Pipeline()
			pipe.Get(ctx, key)
			if _, err := pipe.Exec(ctx); err != redis.Nil {
				t.Fatal(err)
			}
			cn := m.Conn()
			if err := cn.Get(ctx, key).Err(); err != redis.Nil {
				t.Fatal(err)
			}
			cn.Close()
		}
		for _, n := range all {
			for addr, old := range was {
				b := n.forAddr(addr)
				total := pooled(b.pool.Load().PoolStats())
				if w := b.watched.Load(); w != total-old {
					t.Errorf("made before Watch %v: %s has %d connections, %d of them from before; %d watched, want %d", before, addr, total, old, w, total-old)
				}
			}
		}
	}
}

// A connection dialled before Watch makes an expiry with nothing come
// back the node's, wherever the watched ones are: go-redis may keep
// pipelines' connections in a pool of their own, which counts too.
func TestUnwatchedConnectionBeside(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	rdb := s.Client(t)
	n := New(rdb, Config{Failures: 1, Cooldown: time.Hour}, nil, time.Second)
	if err := rdb.Get(ctx, "k").Err(); err != redis.Nil { // dialled before Watch
		t.Fatal(err)
	}
	n.Watch(rdb)
	defer n.Close()
	pipe := rdb.Pipeline()
	pipe.Get(ctx, "k")
	if _, err := pipe.Exec(ctx); err != redis.Nil {
		t.Fatal(err)
	}
	st := rdb.PoolStats()
	t.Logf("pool %d, pipelines' pool %v, watched %d", st.TotalConns, st.PipelineStats != nil, n.One().watched.Load())
	bud := n.Budget(ctx, n.One())
	defer bud.End()
	if !n.One().unresponsive(bud) {
		t.Fatal("an expiry with an unwatched connection in the pool, nothing come back since the call began, was not the node's")
	}
}

// judged is what Judge makes of an expiry of a call that began a budget
// ago on n's node.
func judged(n *Nodes) Outcome {
	now := time.Now()
	bud := &Budget{Context: context.Background(), start: now.Add(-time.Second), full: time.Second, deadline: now}
	o, _ := Judge(context.Background(), bud, n.One(), context.DeadlineExceeded)
	return o
}

// rawWatched dials s and watches the connection for n's node, as the
// dial hook does.
func rawWatched(t *testing.T, s *redistest.Server, n *Nodes) *watchedSysConn {
	t.Helper()
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	w, ok := watch(conn, []*Node{n.One()}).(*watchedSysConn)
	if !ok {
		t.Fatal("a TCP connection is not watched as a socket")
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// An expiry is the node's when a command written to it has had no reply
// for half the budget, on any connection of the node's, whatever the
// node's other connections read meanwhile; not when the reply is there,
// unread (its reader was late), nor when the command was written less
// than half the budget ago (this process was late to write it). The
// silent connection is open (a pool's callers wait for it) or closed on
// its command (go-redis closes the connection of a call that ran out of
// its budget). A blocking BLPOP stands for the command a paused or hung
// server does not answer; a PING for one it answers.
func TestUnansweredConnectionFailsNode(t *testing.T) {
	if !peeks {
		t.Skip("the sockets cannot be looked into on this platform")
	}
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "needs real connections")
	rdb := s.Client(t)
	n := New(rdb, Config{Failures: 1, Cooldown: time.Hour}, nil, time.Second)
	n.Watch(rdb)
	defer n.Close()
	ctx := context.Background()
	ask := func(w *watchedSysConn, cmd string) {
		t.Helper()
		if _, err := w.Write([]byte(cmd)); err != nil {
			t.Fatal(err)
		}
		w.sent.Store(time.Now().Add(-time.Second).UnixNano()) // written a budget ago
	}
	answered := func() {
		t.Helper()
		if err := rdb.Get(ctx, "k").Err(); err != redis.Nil { // the node answers another connection
			t.Fatal(err)
		}
	}

	// A reply there, unread: this process was late.
	pong := rawWatched(t, s, n)
	ask(pong, "PING\r\n")
	deadline := time.Now().Add(time.Minute)
	for !waiting(pong.sys) {
		if time.Now().After(deadline) {
			t.Fatal("no PONG within a minute")
		}
		runtime.Gosched()
	}
	answered()
	if o := judged(n); o != Late {
		t.Fatalf("a reply waiting unread: %v, want Late", o)
	}

	// A command with no reply on an open connection: the node's.
	blocked := rawWatched(t, s, n)
	ask(blocked, "BLPOP budget:none 0\r\n")
	answered()
	if o := judged(n); o != Failed {
		t.Fatalf("an open connection without a reply for a budget: %v, want Failed", o)
	}
	// Written just now: it has not waited half the budget.
	blocked.sent.Store(time.Now().UnixNano())
	if o := judged(n); o != Late {
		t.Fatalf("a command written just now: %v, want Late", o)
	}

	// Closed on a command with no reply: the node's, though other
	// connections answer after the close.
	blocked.sent.Store(time.Now().Add(-time.Second).UnixNano())
	blocked.Close()
	answered()
	if o := judged(n); o != Failed {
		t.Fatalf("a connection closed without a reply after a budget: %v, want Failed", o)
	}
}
