package breaker

import (
	"context"
	"sync/atomic"
	"time"
)

// A Budget is the context of one Redis call. go-redis bounds its network
// reads and writes by Deadline; Done ends its waits (for a pooled
// connection, between retries). A caller whose context cannot end, as the
// detached read a Get shares, gets a budget whose Done is a channel shared
// with every budget that ends within the same tick of the node's clock,
// closed by one timer per tick: so such a call arms no timer and
// allocates one small struct, and its waits end at most a tick (a
// sixteenth of the budget) after its deadline. Other callers get
// context.WithDeadline.
type Budget struct {
	context.Context // the caller's, for its values (and Done, Err when it can end)

	start    time.Time     // when the call got its turn at the node
	full     time.Duration // the budget, before any earlier deadline of the caller's
	deadline time.Time
	tick     *tick              // the shared Done, when the caller's context cannot end
	cancel   context.CancelFunc // the WithDeadline context's, otherwise
	dialed   atomic.Pointer[dialFailure]
}

type budgetKey struct{}

// Budget returns the context of one Redis call made for ctx to node (nil:
// a pipeline over several): ctx bounded by the budget from now, unless
// ctx's own deadline comes first. The caller calls End when the call is
// done.
func (n *Nodes) Budget(ctx context.Context, node *Node) *Budget {
	now := time.Now()
	b := &Budget{Context: ctx, start: now, full: n.budget}
	b.deadline = now.Add(n.budget)
	if ctx.Done() == nil {
		if node == nil {
			node = &n.one
		}
		b.tick = node.ticks.by(b.deadline.UnixNano())
		return b
	}
	if dl, ok := ctx.Deadline(); ok && dl.Before(b.deadline) {
		b.deadline = dl
		return b
	}
	b.Context, b.cancel = context.WithDeadline(ctx, b.deadline)
	return b
}

// Start is when the call got its turn at the node.
func (b *Budget) Start() time.Time { return b.start }

func (b *Budget) Deadline() (time.Time, bool) { return b.deadline, true }

func (b *Budget) Done() <-chan struct{} {
	if b.tick != nil {
		return b.tick.ch
	}
	return b.Context.Done()
}

func (b *Budget) Err() error {
	if b.tick == nil {
		return b.Context.Err()
	}
	select {
	case <-b.tick.ch:
		if b.tick.aborted {
			// The node refused a connection: see ticks.abort.
			return context.Canceled
		}
		return context.DeadlineExceeded
	default:
		return nil
	}
}

func (b *Budget) Value(key any) any {
	if key == (budgetKey{}) {
		return b
	}
	return b.Context.Value(key)
}

// End releases the budget's timer, if it has one of its own.
func (b *Budget) End() {
	if b.cancel != nil {
		b.cancel()
	}
}

// A tick is the shared end of the budgets whose deadlines fall before its
// own end.
type tick struct {
	end     int64 // unix nanoseconds
	ch      chan struct{}
	closed  atomic.Bool
	aborted bool                 // written before ch is closed, read after
	prev    atomic.Pointer[tick] // the tick before it, while that one is open
}

// close ends the tick's budgets: at its end, or early (aborted) when the
// node refused a connection. It reports whether it closed the tick.
func (t *tick) close(aborted bool) bool {
	if !t.closed.CompareAndSwap(false, true) {
		return false
	}
	t.aborted = aborted
	close(t.ch)
	t.prev.Store(nil) // every tick before it has ended too
	return true
}

// ticks hands out the shared ends of budgets, one set per node. As every
// budget is as long as every other, their deadlines come in the order they
// began, and one tick serves all the budgets begun within a sixteenth of
// the budget.
type ticks struct {
	cur  atomic.Pointer[tick]
	step int64 // nanoseconds
}

// by returns a tick that ends at or after deadline, and at most a step
// after it.
func (k *ticks) by(deadline int64) *tick {
	for {
		t := k.cur.Load()
		if t != nil && t.end >= deadline && t.end-deadline <= k.step {
			return t
		}
		nt := &tick{end: deadline + k.step, ch: make(chan struct{})}
		if t != nil && t.end > nt.end {
			// A longer budget than those before it: a tick of its own,
			// not shared.
			time.AfterFunc(time.Until(time.Unix(0, nt.end)), func() { nt.close(false) })
			return nt
		}
		if t != nil && !t.closed.Load() {
			nt.prev.Store(t)
		}
		if k.cur.CompareAndSwap(t, nt) {
			time.AfterFunc(time.Until(time.Unix(0, nt.end)), func() { nt.close(false) })
			return nt
		}
	}
}

// abort ends at once every budget of the node still running: the node
// refused a connection, and the calls under way would only wait out their
// budgets in go-redis's retries of the dial. Their error names the
// refusal (see Judge).
func (k *ticks) abort() {
	for t := k.cur.Swap(nil); t != nil; t = t.prev.Load() {
		t.close(true)
	}
}
