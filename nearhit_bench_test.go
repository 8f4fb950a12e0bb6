package packcache_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
)

// nearHitRounds is how many pairs of benchmarks one BenchmarkNearHit
// runs.
const nearHitRounds = 7

// nearHitDoc and nearHitMsg have the shape of the tests' Channel, declared
// here so that this file depends on the package's exported API and
// redistest alone, and measures the same thing before and after the
// package's own test helpers change.
type nearHitDoc struct {
	ID       string       `json:"id"`
	Title    string       `json:"title"`
	Messages []nearHitMsg `json:"messages"`
}

type nearHitMsg struct {
	ID     int64     `json:"id"`
	Author string    `json:"author"`
	Text   string    `json:"text"`
	Sent   time.Time `json:"sent"`
	Likes  []string  `json:"likes,omitempty"`
}

// BenchmarkNearHit sets the cost of a near hit, Cache.Get of a key the
// near cache holds (WithLocalCache, the default share window), beside
// the floor it is measured against: a read of the same value from a map
// guarded by a sync.RWMutex, read-locked. Both run in one goroutine;
// issue 23 wants the ratio at most 8.
//
// Timing each call is too coarse for a 25 ns map read, so it runs whole
// benchmarks instead, one of each in turn, nearHitRounds rounds (the
// sub-benchmarks round=N/impl=packcache and round=N/impl=floor), so that
// the machine's noise falls on both alike, and logs the median ns/op of
// each and the ratio of the medians. One run takes about half a minute;
// the figure is the spread of several, each a run of its own (-count
// would repeat each sub-benchmark in place, undoing the interleaving):
//
//	go test -c -o packcache.test .
//	for i in 1 2 3 4 5; do ./packcache.test -test.run=NONE -test.bench='^BenchmarkNearHit$' -test.v | grep -E 'nearhit:|^Bench'; done
//
// (testing.Benchmark cannot be called from inside a benchmark: it waits
// for the lock the running benchmark holds.)
func BenchmarkNearHit(b *testing.B) {
	redistest.RequireServer(b, "the near cache needs CLIENT TRACKING")
	s := redistest.Start(b)
	rdb := s.Universal(b)
	ctx := context.Background()
	c, err := packcache.New[nearHitDoc](rdb,
		packcache.WithRedisTimeout(time.Minute),
		packcache.WithLocalCache(packcache.LocalCache{MaxBytes: 16 << 20, TTL: time.Hour, MaxLag: time.Minute}))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	doc := nearHitDoc{ID: "ch-1", Title: "Course announcements"}
	for i := range 200 {
		doc.Messages = append(doc.Messages, nearHitMsg{
			ID: int64(i), Author: fmt.Sprintf("student%04d", i),
			Text: strings.Repeat("lecture notes ", 1+i%8), Sent: time.Unix(int64(1_790_000_000+37*i), 0),
		})
	}
	const key = "nearhit:doc"
	if err := c.Set(ctx, key, doc); err != nil {
		b.Fatal(err)
	}
	for c.Stats().NearHits == 0 { // until the invalidation stream is proven and the value kept
		if _, err := c.Get(ctx, key); err != nil {
			b.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}

	var mu sync.RWMutex
	m := map[string]nearHitDoc{key: doc}
	var gets uint64
	near := func(b *testing.B) {
		for b.Loop() {
			if v, err := c.Get(ctx, key); err != nil || v.ID != doc.ID {
				b.Fatal(v.ID, err)
			}
		}
		gets += uint64(b.N) // after Loop: every iteration it ran
	}
	floor := func(b *testing.B) {
		for b.Loop() {
			mu.RLock()
			v, ok := m[key]
			mu.RUnlock()
			if !ok || v.ID != doc.ID {
				b.Fatal("missing")
			}
		}
	}

	hits := c.Stats().NearHits
	var pc, fl []float64
	nsPerOp := func(b *testing.B) float64 { return float64(b.Elapsed().Nanoseconds()) / float64(b.N) }
	for i := range nearHitRounds {
		var p, f float64
		runNear := func() {
			b.Run(fmt.Sprintf("round=%d/impl=packcache", i+1), func(b *testing.B) { near(b); p = nsPerOp(b) })
		}
		runFloor := func() {
			b.Run(fmt.Sprintf("round=%d/impl=floor", i+1), func(b *testing.B) { floor(b); f = nsPerOp(b) })
		}
		if i%2 == 0 {
			runNear()
			runFloor()
		} else {
			runFloor()
			runNear()
		}
		if p == 0 || f == 0 {
			b.Fatal("a round's benchmark failed")
		}
		pc, fl = append(pc, p), append(fl, f)
	}
	// Every Get above was a near hit, or the figure is of something else.
	if got := c.Stats().NearHits - hits; got != gets {
		b.Fatalf("%d of the rounds' %d Gets were near hits", got, gets)
	}
	med := func(x []float64) float64 {
		x = slices.Clone(x)
		slices.Sort(x)
		return x[len(x)/2]
	}
	b.Logf("nearhit: near hit %.1f ns/op, map read %.1f ns/op, ratio %.2f (medians of %d interleaved rounds; target: ratio <= 8)",
		med(pc), med(fl), med(pc)/med(fl), len(pc))
}
