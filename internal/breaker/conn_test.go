package breaker

import (
	"context"
	"errors"
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
