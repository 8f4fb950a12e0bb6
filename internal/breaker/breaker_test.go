package breaker

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// events records what a Notifier is told, in order.
type events struct {
	mu  sync.Mutex
	got []bool
}

func (e *events) BreakerChanged(addr string, open bool) {
	e.mu.Lock()
	e.got = append(e.got, open)
	e.mu.Unlock()
}

func (e *events) all() []bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.got)
}

func newNode(cfg Config, notify Notifier) *Node {
	n := &Nodes{cfg: cfg, notify: notify, budget: time.Second, step: int64(time.Second / 16)}
	n.init(&n.one, "")
	return &n.one
}

// cooled ends b's cool-down now, as if it had passed.
func cooled(b *Node) { b.openUntil.Store(time.Now().Add(-time.Millisecond).UnixNano()) }

func TestOpensAfterConsecutiveFailures(t *testing.T) {
	ev := &events{}
	b := newNode(Config{Failures: 3, Cooldown: time.Hour}, ev)
	b.Feed(Failed)
	b.Feed(Failed)
	b.Feed(Healthy) // a success in between: the count starts again
	b.Feed(Failed)
	b.Feed(Failed)
	if !b.Allow() {
		t.Fatal("open after 2 consecutive failures, with Failures 3")
	}
	b.Feed(Failed)
	if b.Allow() {
		t.Fatal("closed after 3 consecutive failures")
	}
	b.Feed(Failed) // open already: told once
	if got := ev.all(); !slices.Equal(got, []bool{true}) {
		t.Fatalf("notifier told %v, want [open]", got)
	}
}

func TestHalfOpenLetsOneProbeThrough(t *testing.T) {
	for _, probe := range []Outcome{Healthy, Failed} {
		ev := &events{}
		b := newNode(Config{Failures: 1, Cooldown: time.Hour}, ev)
		b.Feed(Failed)
		cooled(b)
		if !b.Allow() {
			t.Fatal("no probe after the cool-down")
		}
		if b.Allow() {
			t.Fatal("a second probe while the first is under way")
		}
		b.Feed(probe)
		want := []bool{true, false}
		if probe == Failed {
			// The probe failed: open again, for a cool-down from now.
			want = []bool{true}
			if b.Allow() {
				t.Fatal("a call allowed after the probe failed")
			}
		} else {
			for i := range 2 { // closed: every call, not one probe
				if !b.Allow() {
					t.Fatalf("call %d refused after the probe succeeded", i)
				}
			}
		}
		if got := ev.all(); !slices.Equal(got, want) {
			t.Fatalf("probe %v: notifier told %v, want %v", probe, got, want)
		}
	}
}

func TestNeutralAndLateSayNothing(t *testing.T) {
	b := newNode(Config{Failures: 1, Cooldown: time.Hour}, nil)
	for range 10 {
		b.Feed(Neutral)
		b.Feed(Late)
	}
	if !b.Allow() {
		t.Fatal("neutral or late outcomes opened the breaker")
	}
}

func TestRefusedConnTripsAtOnce(t *testing.T) {
	b := newNode(Config{Failures: 100, Cooldown: time.Hour}, nil)
	b.Feed(RefusedConn)
	if b.Allow() {
		t.Fatal("a refused connection left the breaker closed")
	}
	off := newNode(Config{}, nil)
	for range 100 {
		off.Feed(Failed)
		off.Feed(RefusedConn)
	}
	if !off.Allow() {
		t.Fatal("a breaker with Failures 0 opened")
	}
}

func TestEnterBoundsCallsInFlight(t *testing.T) {
	n := &Nodes{cfg: Config{Failures: 1}, pool: 4, step: 1}
	n.init(&n.one, "")
	b := &n.one
	var held []Slot
	for range 3 { // the slots of calls that begin work
		s, err := b.Enter(context.Background(), nil, false)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	closing := make(chan struct{})
	errs := make(chan error, 2)
	go func() { _, err := b.Enter(ctx, nil, false); errs <- err }()
	go func() { _, err := b.Enter(context.Background(), closing, false); errs <- err }()
	for n.Waiting() != 2 {
		runtime.Gosched()
	}
	// A call that finishes work takes the slot kept for it while reads wait.
	fin, err := b.Enter(context.Background(), nil, true)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("a waiter whose context ended got %v", err)
	}
	close(closing)
	if err := <-errs; err != ErrClosing {
		t.Fatalf("a waiter of a closing cache got %v", err)
	}
	fin.Leave()
	held[0].Leave()
	s, err := b.Enter(context.Background(), nil, false)
	if err != nil {
		t.Fatal(err)
	}
	s.Leave()
}

func TestJudge(t *testing.T) {
	timeout := context.DeadlineExceeded
	cases := []struct {
		name  string
		err   error
		setup func(b *Node, bud *Budget)
		want  Outcome
	}{
		{"nil", nil, nil, Healthy},
		{"miss", redis.Nil, nil, Healthy},
		{"client closed", redis.ErrClosed, nil, Failed},
		{"LOADING", errReply("LOADING Redis is loading the dataset in memory"), nil, Failed},
		{"WRONGTYPE", errReply("WRONGTYPE Operation against a key holding the wrong kind of value"), nil, Healthy},
		{"expired, the node answered since the call began", timeout, func(b *Node, bud *Budget) {
			b.answered(bud.start.Add(time.Millisecond).UnixNano())
		}, Late},
		{"expired, nothing written waits", timeout, func(b *Node, bud *Budget) {
			// Every connection of the pool is watched, and none waits.
			b.pool.Store(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}))
			b.watched.Store(1)
		}, Late},
		{"expired, a command waited half the budget unanswered", timeout, func(b *Node, bud *Budget) {
			b.asked(bud.start.UnixNano())
		}, Failed},
		{"expired, a command written late in the budget", timeout, func(b *Node, bud *Budget) {
			b.asked(bud.deadline.Add(-time.Millisecond).UnixNano())
		}, Late},
		{"expired, connections unwatched", timeout, nil, Failed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newNode(Config{Failures: 1}, nil)
			bud := &Budget{Context: context.Background(), start: time.Now().Add(-time.Second), full: time.Second}
			bud.deadline = bud.start.Add(time.Second)
			if tc.setup != nil {
				tc.setup(b, bud)
			}
			got, cause := Judge(context.Background(), bud, b, tc.err)
			if got != tc.want {
				t.Fatalf("Judge(%v) = %v, want %v", tc.err, got, tc.want)
			}
			if tc.err != nil && !errors.Is(cause, tc.err) {
				t.Fatalf("the cause %v does not wrap %v", cause, tc.err)
			}
		})
	}
	t.Run("the caller's own context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		b := newNode(Config{Failures: 1}, nil)
		bud := &Budget{Context: ctx, start: time.Now(), deadline: time.Now().Add(time.Second)}
		o, cause := Judge(ctx, bud, b, timeout)
		if o != Neutral || !errors.Is(cause, context.Canceled) {
			t.Fatalf("Judge = %v, %v; want Neutral, the caller's cancellation", o, cause)
		}
	})
}

type errReply string

func (e errReply) Error() string { return string(e) }
func (errReply) RedisError()     {}

func TestTicksAreSharedAndAbort(t *testing.T) {
	n := &Nodes{budget: time.Hour, step: int64(time.Hour / 16)}
	n.init(&n.one, "")
	a := n.Budget(context.Background(), nil)
	b := n.Budget(context.Background(), nil)
	if a.Done() != b.Done() {
		t.Fatal("two budgets begun together do not share their end")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	own := n.Budget(ctx, nil)
	defer own.End()
	if own.Done() == a.Done() {
		t.Fatal("a caller whose context can end shares a tick")
	}
	n.one.ticks.abort()
	<-a.Done()
	if !errors.Is(a.Err(), context.Canceled) {
		t.Fatalf("an aborted budget's Err is %v, want Canceled", a.Err())
	}
	c := n.Budget(context.Background(), nil)
	if c.Err() != nil || c.Done() == a.Done() {
		t.Fatal("a budget begun after the abort is over already")
	}
}

// addrEvents records the addresses a Notifier is told of, with the state.
type addrEvents struct {
	mu  sync.Mutex
	got []string
}

func (e *addrEvents) BreakerChanged(addr string, open bool) {
	e.mu.Lock()
	e.got = append(e.got, addr+map[bool]string{true: " open", false: " closed"}[open])
	e.mu.Unlock()
}

// TestStateAndKnown: a single-node client's node is told closed, with its
// address, as Nodes are made; State says open or closed and since when,
// the time of the last change (issue 24: Stats.Breakers, and the same
// labels on one node as on a Cluster).
func TestStateAndKnown(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer rdb.Close()
	ev := &addrEvents{}
	made := time.Now()
	n := New(rdb, Config{Failures: 1, Cooldown: time.Hour}, ev, time.Second)
	if !slices.Equal(ev.got, []string{"127.0.0.1:1 closed"}) {
		t.Fatalf("told %q as Nodes were made, want the node closed", ev.got)
	}
	var nodes []*Node
	n.Each(func(b *Node) { nodes = append(nodes, b) })
	if len(nodes) != 1 || nodes[0] != n.One() || nodes[0].Addr() != "127.0.0.1:1" {
		t.Fatalf("Each: %v, want the one node", nodes)
	}
	b := n.One()
	open, since := b.State()
	if open || since.Before(made.Add(-time.Second)) || since.After(time.Now()) {
		t.Errorf("State: open %v since %v, want closed since it was made (%v)", open, since, made)
	}
	b.Feed(Failed)
	open, opened := b.State()
	if !open || opened.Before(since) {
		t.Errorf("after a failure: open %v since %v, want open since then", open, opened)
	}
	b.Feed(Failed) // open already: its cool-down starts again, not its state
	if _, again := b.State(); !again.Equal(opened) {
		t.Errorf("a failure while open moved since from %v to %v", opened, again)
	}
	b.Feed(Healthy)
	open, closed := b.State()
	if open || closed.Before(opened) {
		t.Errorf("after a success: open %v since %v, want closed since then", open, closed)
	}
	if !slices.Equal(ev.got, []string{"127.0.0.1:1 closed", "127.0.0.1:1 open", "127.0.0.1:1 closed"}) {
		t.Errorf("told %q", ev.got)
	}
}
