package breaker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Config is a breaker's rule: Failures consecutive failures open it
// (0: never), for Cooldown.
type Config struct {
	Failures int
	Cooldown time.Duration
}

// A Notifier is told when a node's breaker opens or closes, in the order
// it does, and once, closed, when a node with an address is first known
// (a single-node client's when Nodes are made, a Cluster master's when a
// call first goes to it), so that every node it will hear of has a state
// from the start. addr is "" for the shared node of a client with no
// address of its own, and for a Cluster's calls whose master is unknown.
type Notifier interface {
	BreakerChanged(addr string, open bool)
}

// ErrClosing is what Enter returns when the closing channel it was given
// closes first.
var ErrClosing = errors.New("breaker: closing")

// A Node is one Redis node as the cache sees it: its breaker, what its
// connections saw, the shared ends of its calls' budgets, and its slots.
type Node struct {
	mu        sync.Mutex // orders openings and closings, so the notifier sees them in order
	cfg       Config
	addr      string   // the node's address, for the notifier; "" on a single node
	notify    Notifier // nil: nobody
	failures  atomic.Int64
	openUntil atomic.Int64 // unix nanoseconds; 0 when closed
	probeAt   atomic.Int64 // unix nanoseconds the probe began; 0 when none

	// What the node's connections saw (conn.go), in unix nanoseconds:
	// when a read last returned bytes, and when the first command written
	// since then was written (0: none is waiting).
	lastRead   atomic.Int64
	unanswered atomic.Int64
	refusal    atomic.Pointer[dialFailure] // the latest dial to the node that failed
	// What each connection saw of its own commands: the latest command a
	// connection was closed on, unanswered, from when it was sent to the
	// close (see peekedConn.Close); and the node's open connections
	// whose sockets the cache can look into (see waits).
	silence atomic.Pointer[span]
	conns   sync.Map // *peekedConn -> struct{}

	watched atomic.Int64                 // the node's connections that report (conn.go)
	pool    atomic.Pointer[redis.Client] // the node's client, for its pool's size; nil: unknown
	opened  atomic.Int64                 // unix nanoseconds the breaker last opened
	since   atomic.Int64                 // unix nanoseconds it last opened or closed, or the node was made

	ticks   ticks         // the shared ends of the budgets of calls to the node
	slots   chan struct{} // one per call in flight to the node; nil: no bound
	reserve chan struct{} // slots only calls that finish work may take (see Enter); nil: none
	waiting atomic.Int64  // calls waiting for a slot
}

// Addr is the node's address as the client names it ("FailoverClient"
// through Sentinel); "" for the shared node of a client with no address
// of its own, and on a Cluster for calls whose master is unknown.
func (b *Node) Addr() string { return b.addr }

// State reports whether the breaker is open (half open included: calls
// fail until a probe succeeds), and since when: the time it last opened
// or closed, or, if it never did, the time the node was made.
func (b *Node) State() (open bool, since time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.openUntil.Load() != 0, time.Unix(0, b.since.Load())
}

// A Slot is a call's turn at a node, taken by Enter and given back by
// Leave.
type Slot struct{ ch chan struct{} }

// Leave gives the slot back.
func (s Slot) Leave() {
	if s.ch != nil {
		<-s.ch
	}
}

// Enter waits for one of the node's slots, so that no more calls ask the
// client for a connection to the node than its pool holds: the thousands
// of a surge wait here, where waiting is not charged to their budgets,
// rather than in the pool. It returns ctx's error if ctx ends first, or
// ErrClosing if closing closes first. A call that enters leaves.
//
// A quarter of the slots are kept for calls that finish work (finishing):
// a load's store, a lease's extension or release, a write. They take any
// free slot, while calls that begin work (reads) take only the others. So
// a surge of reads queued at the node cannot hold back the stores that
// end the loads those reads wait for, nor the extensions that keep their
// leases alive meanwhile: under overload, work under way ends first.
func (b *Node) Enter(ctx context.Context, closing <-chan struct{}, finishing bool) (Slot, error) {
	if b.slots == nil {
		return Slot{}, nil
	}
	reserve := b.reserve
	if !finishing {
		reserve = nil // a nil channel: never ready
	}
	select {
	case b.slots <- struct{}{}:
		return Slot{b.slots}, nil
	case reserve <- struct{}{}:
		return Slot{reserve}, nil
	default:
	}
	b.waiting.Add(1)
	defer b.waiting.Add(-1)
	select {
	case b.slots <- struct{}{}:
		return Slot{b.slots}, nil
	case reserve <- struct{}{}:
		return Slot{reserve}, nil
	case <-ctx.Done():
		return Slot{}, ctx.Err()
	case <-closing:
		return Slot{}, ErrClosing
	}
}

// Waiting is the number of calls waiting in Enter.
func (b *Node) Waiting() int64 { return b.waiting.Load() }

// Allow reports whether a call may try the node: the breaker is closed,
// or it is half open and this call is the probe.
func (b *Node) Allow() bool {
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
	if p != 0 && now-p < int64(b.cfg.Cooldown) {
		return false
	}
	return b.probeAt.CompareAndSwap(p, now)
}

// OpenCause is the refused connection that opened the breaker, if one
// did in its latest opening; nil otherwise.
func (b *Node) OpenCause() error {
	if r := b.refusal.Load(); r != nil && Refused(r.err) && r.at >= b.opened.Load()-int64(b.cfg.Cooldown) {
		return r.err
	}
	return nil
}

// Feed tells the breaker what a call's outcome says of its node.
func (b *Node) Feed(o Outcome) {
	switch o {
	case Healthy:
		b.success()
	case Failed:
		b.failure()
	case RefusedConn:
		b.trip()
	}
}

func (b *Node) success() {
	if b.failures.Load() != 0 {
		b.failures.Store(0)
	}
	if b.openUntil.Load() != 0 {
		b.mu.Lock()
		if b.openUntil.Swap(0) != 0 {
			b.probeAt.Store(0)
			b.since.Store(time.Now().UnixNano())
			b.changed(false)
		}
		b.mu.Unlock()
	}
}

func (b *Node) failure() {
	if b.cfg.Failures <= 0 {
		return
	}
	if n := b.failures.Add(1); n >= int64(b.cfg.Failures) || b.openUntil.Load() != 0 {
		b.open()
	}
}

// trip opens the breaker at once, for a failure that leaves no doubt: a
// refused connection.
func (b *Node) trip() {
	if b.cfg.Failures <= 0 {
		return
	}
	b.failures.Store(int64(b.cfg.Failures))
	b.open()
}

// open opens the breaker for a cool-down from now, or, if it is open,
// starts its cool-down again.
func (b *Node) open() {
	b.mu.Lock()
	now := time.Now()
	old := b.openUntil.Swap(now.Add(b.cfg.Cooldown).UnixNano())
	if old == 0 {
		b.opened.Store(now.UnixNano())
		b.since.Store(now.UnixNano())
	}
	b.probeAt.Store(0)
	if old == 0 {
		b.changed(true)
	}
	b.mu.Unlock()
}

// known tells the notifier of a node just made, closed, if it has an
// address; under mu, so that an opening that follows is told after it.
func (b *Node) known() {
	if b.addr == "" {
		return
	}
	b.mu.Lock()
	if b.openUntil.Load() == 0 {
		b.changed(false)
	}
	b.mu.Unlock()
}

func (b *Node) changed(open bool) {
	if b.notify != nil {
		b.notify.BreakerChanged(b.addr, open)
	}
}

// refusedDial notes a dial to the node that failed; a refused one opens
// the breaker. It reports whether it was refused: then the caller ends
// the node's calls under way (ticks.abort), once every cache over the
// client has been told, so that no call released by the abort finds a
// breaker not yet open.
func (b *Node) refusedDial(f *dialFailure) bool {
	b.refusal.Store(f)
	if !Refused(f.err) {
		return false
	}
	b.trip()
	return true
}

// answered notes a reply from the node at now: it is alive, and nothing
// written to it before now is waiting on a dead node.
func (b *Node) answered(now int64) {
	b.lastRead.Store(now)
	if b.unanswered.Load() != 0 {
		b.unanswered.Store(0)
	}
}

// asked notes a command written to the node at now.
func (b *Node) asked(now int64) {
	if b.unanswered.Load() == 0 {
		b.unanswered.CompareAndSwap(0, now)
	}
}

// A span is a time from one instant to another, in unix nanoseconds.
type span struct{ from, to int64 }

// silent notes that a connection of the node was closed at to with no
// reply to the command it had sent at from (nor any byte of one waiting
// on its socket).
func (b *Node) silent(from, to int64) {
	if s := b.silence.Load(); s == nil || s.to < to {
		b.silence.Store(&span{from, to})
	}
}

// unresponsive reports whether the node, rather than this process, is what
// a call under bud, ending now, waited on. It is the rule Judge states;
// the node is what the call waited on if either holds:
//
//   - a command written to the node went unanswered for at least half the
//     budget within the call's time (from its start to now), on any of
//     the node's connections, the call's own or another's: one closed
//     with no reply (go-redis closes the connection of a command that ran
//     out of its budget), or one still open that waits, as one does that
//     a pool's callers wait for; unanswered meaning that nothing came back
//     on that connection since the command was written and nothing waits
//     unread on its socket (so a reply that came, but whose reader was
//     late for a CPU, is an answer);
//   - nothing came back from the node, on any connection, since the call
//     began, and a command has waited on it for at least half the budget.
//
// The first holds when the node answers other connections but not this
// command (writes paused, a command stuck behind a hung one); the second
// covers connections the cache cannot look into (on platforms where it
// cannot, and connections not watched). Only watched connections tell: if
// the node's pool holds connections made before the cache was
// (unwatched), the call may have used one, and an expiry with no reply
// from the node since the call began is taken as the node's, as if
// nothing were watched.
func (b *Node) unresponsive(bud *Budget) bool {
	start, now := bud.start.UnixNano(), time.Now().UnixNano()
	half := int64(bud.deadline.Sub(bud.start)) / 2
	if s := b.silence.Load(); s != nil && min(s.to, now)-max(s.from, start) >= half {
		return true
	}
	if start <= now-half && b.waits(now-half) {
		return true
	}
	if b.lastRead.Load() >= start {
		return false
	}
	if w := b.unanswered.Load(); w != 0 {
		return w <= bud.deadline.UnixNano()-half
	}
	cl := b.pool.Load()
	return cl == nil || pooled(cl.PoolStats()) > b.watched.Load()
}

// waits reports whether an open connection of the node has waited since
// before since for the reply to a command, and none has come nor waits
// unread.
func (b *Node) waits(since int64) bool {
	found := false
	b.conns.Range(func(k, _ any) bool {
		if sent := k.(*peekedConn).unanswered(); sent != 0 && sent <= since {
			found = true
		}
		return !found
	})
	return found
}

// pooled counts the connections a client holds: its pool's, its separate
// pipeline pool's (go-redis makes one where pipelines have buffers of
// their own), and its Pub/Sub connections, every one dialled through the
// hooks that watch them.
func pooled(st *redis.PoolStats) int64 {
	n := int64(st.TotalConns) + int64(st.PubSubStats.Active)
	if st.PipelineStats != nil {
		n += int64(st.PipelineStats.TotalConns)
	}
	return n
}
