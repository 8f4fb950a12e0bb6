package packcache

import (
	"context"
	"testing"
	"time"

	"github.com/packcache/packcache/internal/redistest"
)

// A store made again after a first copy that ran (its reply came too
// late) reports the store the first one made, so that it can be repeated
// like a SET; one over a lease that is gone, with other bytes in place,
// still stores nothing.
func TestStoreScriptIsRepeatable(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client(t)
	ctx := context.Background()
	lease := "\x0clease-1"
	rdb.Set(ctx, "k", lease, time.Minute)
	args := storeArgs(guard{kind: guardLease, value: lease}, []byte("value"), time.Minute)
	for i := range 2 {
		if n, err := storeScript.Run(ctx, rdb, []string{"k"}, args...).Int(); err != nil || n != 1 {
			t.Fatalf("store %d over its own lease = %d, %v; want 1", i, n, err)
		}
	}
	if v := rdb.Get(ctx, "k").Val(); v != "value" {
		t.Fatalf("the key holds %q", v)
	}
	// The same bytes stored again set their time to live anew (a reload
	// of an unchanged value keeps it for another TTL).
	rdb.PExpire(ctx, "k", time.Second)
	if n, err := storeScript.Run(ctx, rdb, []string{"k"}, args...).Int(); err != nil || n != 1 {
		t.Fatalf("store of the bytes in place = %d, %v; want 1", n, err)
	}
	if d := rdb.PTTL(ctx, "k").Val(); d <= time.Second {
		t.Fatalf("PTTL %v after storing the same bytes for a minute", d)
	}
	other := storeArgs(guard{kind: guardLease, value: lease}, []byte("older"), time.Minute)
	if n, err := storeScript.Run(ctx, rdb, []string{"k"}, other...).Int(); err != nil || n != 0 {
		t.Fatalf("a store over a lease that is gone = %d, %v; want 0", n, err)
	}
}
