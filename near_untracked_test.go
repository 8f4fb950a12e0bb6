package packcache_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
)

// TestNearUntracked: a near cache bounded by time alone serves an entry
// until Untracked after the read that filled it, and never after: while
// another process's write stands in Redis, every Get that returns the old
// value began before the entry's recorded end, which is at most Untracked
// after the filling Get returned; then the new value is read. This
// process's own write still drops its entry at once. No CLIENT TRACKING is
// asked for: the server's tracking counters stay at zero.
func TestNearUntracked(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "reads the server's tracking counters")
	ctx := ctxT(t)
	rdb := s.Client(t)
	other := s.Client(t)
	const bound = 300 * time.Millisecond
	c := mustNew[Channel](t, rdb, packcache.WithShareWindow(packcache.Off),
		packcache.WithLocalCache(packcache.LocalCache{MaxBytes: 16 << 20, TTL: time.Hour, Untracked: bound}))
	for round := range 3 {
		key := fmt.Sprintf("u:k:%d", round)
		if err := other.Set(ctx, key, `{"id":"old"}`, 0).Err(); err != nil {
			t.Fatal(err)
		}
		waitNear(t, c, key)
		filled := time.Now() // after the filling Get returned
		end, ok := packcache.NearExpiry(c, key)
		if !ok {
			t.Fatal("no entry after a near hit")
		}
		if end.After(filled.Add(bound)) {
			t.Fatalf("the entry ends %v after the read that filled it returned; the bound is %v", end.Sub(filled), bound)
		}
		if err := other.Set(ctx, key, `{"id":"new"}`, 0).Err(); err != nil {
			t.Fatal(err)
		}
		served := 0
		waitFor(t, time.Minute, "the new value, once the entry ended", func() bool {
			before := c.Stats().NearHits
			began := time.Now()
			v, err := c.Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if v.ID == "old" {
				if c.Stats().NearHits == before {
					t.Fatal("the old value, not from the near cache")
				}
				if !began.Before(end) {
					t.Fatalf("round %d: a Get begun %v after the entry's end returned the old value", round, began.Sub(end))
				}
				served++
			}
			return v.ID == "new"
		})
		t.Logf("round %d: the old value served %d times after the other process's write, until the entry's end", round, served)
	}
	// Its own write drops the entry at once.
	waitNear(t, c, "u:k:2")
	if err := c.Set(ctx, "u:k:2", Channel{ID: "own"}); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, "u:k:2"); err != nil || v.ID != "own" {
		t.Fatalf("Get right after this process's Set: %+v, %v", v, err)
	}
	if !c.Stats().NearServing {
		t.Fatal("an untracked near cache reports it does not serve")
	}
	if n := infoField(t, other, "clients", "tracking_clients"); n != 0 {
		t.Fatalf("%d tracking clients: an untracked near cache asked for tracking", n)
	}
}
