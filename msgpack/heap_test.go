package msgpack_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
	"github.com/packcache/packcache/msgpack"
)

// heapRow is a row of a table, as a document of rows holds it.
type heapRow struct {
	ID     int64    `json:"id"`
	Name   string   `json:"name"`
	Score  float64  `json:"score"`
	Rank   int      `json:"rank"`
	Active bool     `json:"active"`
	Tags   []string `json:"tags"`
}

// heapRows returns rows of about size bytes of msgpack, the same for a
// given seed.
func heapRows(seed uint64, size int) []heapRow {
	r := rand.New(rand.NewPCG(seed, 11))
	var rows []heapRow
	for n := 0; n < size; {
		row := heapRow{
			ID:     int64(seed<<20) | int64(len(rows)),
			Name:   words[r.IntN(len(words))] + " " + words[r.IntN(len(words))],
			Score:  r.Float64() * 1000,
			Rank:   r.IntN(100),
			Active: r.IntN(2) == 0,
		}
		for range r.IntN(3) {
			row.Tags = append(row.Tags, words[r.IntN(len(words))])
		}
		rows = append(rows, row)
		n += 60 + len(row.Name)
	}
	return rows
}

func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// nearHeap reads keys once each through a msgpack cache of T with a near
// cache of maxBytes, and returns what that added to the heap, with the
// cache still held, once the near cache's evictions are done, and its
// Stats. Otter evicts on a goroutine of its own: until it has, the near
// cache holds more, so the heap is looked at again until it is within
// bound, for at most 10 s (without the bound, it never is).
func nearHeap[T any](t *testing.T, rdb redis.UniversalClient, keys []string, maxBytes int64) (grew int64, st packcache.Stats) {
	ctx := ctxT(t)
	opts := []packcache.Option{packcache.WithSerializer(msgpack.Serializer), packcache.WithShareWindow(packcache.Off), packcache.WithRedisTimeout(time.Minute)}
	plain := newCache[T](t, rdb, opts...) // sets up what a first read does, counted before
	for _, k := range keys {
		if _, err := plain.Get(ctx, k); err != nil {
			t.Fatalf("Get %s: %v", k, err)
		}
	}
	c := newCache[T](t, rdb, append(opts, packcache.WithLocalCache(packcache.LocalCache{MaxBytes: maxBytes, TTL: time.Hour, MaxLag: time.Minute}))...)
	deadline := time.Now().Add(10 * time.Second)
	for c.Stats().NearHits == 0 {
		if _, err := c.Get(ctx, "heap:ready"); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the near cache does not serve")
		}
	}
	before := liveHeap()
	for _, k := range keys {
		if _, err := c.Get(ctx, k); err != nil {
			t.Fatalf("Get %s: %v", k, err)
		}
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		grew, st = liveHeap()-before, c.Stats()
		if (grew <= 2*maxBytes && st.NearBytes <= uint64(maxBytes)) || time.Now().After(deadline) {
			break
		}
		runtime.Gosched()
	}
	runtime.KeepAlive(c)
	runtime.KeepAlive(plain)
	return grew, st
}

// TestNearHeapBound: as the root package's test of the name, with the
// msgpack serializer: 400 values of 1 to 64 KB (13 MiB of msgpack per
// shape, each decoding to several times that, so over twice MaxBytes
// however little a value were weighed), read once each through a 4 MiB
// near cache, add at most twice MaxBytes to the heap, for T = any
// (msgpack's maps, slices, integers, floats and strings), a slice of
// structs, a struct with maps, slices and times, and a map. The bound is
// relative, so the scale is not the subject: a quarter of the root
// test's, it costs a quarter of the CPU.
func TestNearHeapBound(t *testing.T) {
	if raceEnabled {
		// The race detector changes allocation sizes and slows the writes:
		// CI runs this test without -race.
		t.Skip("run without -race")
	}
	redistest.RequireServer(t, "the near cache needs CLIENT TRACKING")
	s := redistest.Start(t)
	rdb := s.Universal(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// A near cache of 4 MiB and values of 1-64 KB; 16 MiB and 1-256 KB
	// under PACKCACHE_LONG=1, as CI's allocation step runs it: the same
	// 3.2 times MaxBytes per shape.
	maxBytes := int64(4 << 20)
	if os.Getenv("PACKCACHE_LONG") == "1" {
		maxBytes = 16 << 20
	}
	r := rand.New(rand.NewPCG(24, 5))
	sizes := make([]int, 400)
	for i := range sizes {
		sizes[i] = 1<<10 + r.IntN(int(maxBytes)/64-1<<10)
	}
	opts := []packcache.Option{packcache.WithSerializer(msgpack.Serializer), packcache.WithRedisTimeout(time.Minute)}
	rowsW := newCache[[]heapRow](t, rdb, opts...)
	mapW := newCache[map[string]heapRow](t, rdb, opts...)
	docW := newCache[Doc](t, rdb, opts...)
	if err := rowsW.Set(ctx, "heap:ready", nil); err != nil {
		t.Fatal(err)
	}
	// Made and written by a few goroutines at once: the documents and
	// their encoding are seconds of CPU, and nothing is measured yet.
	keys := map[string][]string{}
	for _, shape := range []string{"rows", "keyed", "doc"} {
		for i := range sizes {
			keys[shape] = append(keys[shape], fmt.Sprintf("heap:%s:%d", shape, i))
		}
	}
	next := make(chan int)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := range next {
				size := sizes[i]
				rows := heapRows(uint64(i), size)
				m := make(map[string]heapRow, len(rows))
				for j, row := range rows {
					m[fmt.Sprintf("row-%d", j)] = row
				}
				for _, err := range []error{
					rowsW.Set(ctx, keys["rows"][i], rows),
					mapW.Set(ctx, keys["keyed"][i], m),
					docW.Set(ctx, keys["doc"][i], makeDoc(uint64(i), size/90)),
				} {
					if err != nil {
						select {
						case errs <- err:
						default:
						}
					}
				}
			}
		})
	}
	for i := range sizes {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	run := func(name string, f func(t *testing.T) (int64, packcache.Stats)) {
		t.Run(name, func(t *testing.T) {
			grew, st := f(t)
			t.Logf("heap grew %.1f MiB; Stats: %.1f MiB held", float64(grew)/(1<<20), float64(st.NearBytes)/(1<<20))
			if st.NearBytes > uint64(maxBytes) {
				t.Errorf("Stats reports %d bytes held, over MaxBytes %d", st.NearBytes, maxBytes)
			}
			if grew > 2*maxBytes {
				t.Errorf("the near cache added %.1f MiB to the heap, over twice its MaxBytes of %d MiB", float64(grew)/(1<<20), maxBytes>>20)
			}
		})
	}
	run("any", func(t *testing.T) (int64, packcache.Stats) { return nearHeap[any](t, rdb, keys["rows"], maxBytes) })
	run("[]Row", func(t *testing.T) (int64, packcache.Stats) {
		return nearHeap[[]heapRow](t, rdb, keys["rows"], maxBytes)
	})
	run("struct", func(t *testing.T) (int64, packcache.Stats) { return nearHeap[Doc](t, rdb, keys["doc"], maxBytes) })
	run("map", func(t *testing.T) (int64, packcache.Stats) {
		return nearHeap[map[string]heapRow](t, rdb, keys["keyed"], maxBytes)
	})
}
