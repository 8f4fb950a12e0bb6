package packcache_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
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

// heapRows returns about size bytes of JSON: an array of rows (or an
// object of them, keyed by name, if keyed), the same for a given seed.
func heapRows(seed uint64, size int, keyed bool) []byte {
	r := rand.New(rand.NewPCG(seed, 11))
	var b strings.Builder
	b.Grow(size + 200)
	open, end := byte('['), byte(']')
	if keyed {
		open, end = '{', '}'
	}
	b.WriteByte(open)
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		if keyed {
			fmt.Fprintf(&b, `"row-%d":`, i)
		}
		fmt.Fprintf(&b, `{"id":%d,"name":"%s %s","score":%.2f,"rank":%d,"active":%t,"tags":[`,
			seed<<20|uint64(i), words[r.IntN(len(words))], words[r.IntN(len(words))], r.Float64()*1000, r.IntN(100), r.IntN(2) == 0)
		for j := range r.IntN(3) {
			if j > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"%s"`, words[r.IntN(len(words))])
		}
		b.WriteString("]}")
	}
	b.WriteByte(end)
	return []byte(b.String())
}

// heapSizes are the sizes of the values TestNearHeapBound reads: 400,
// from 1 KB to 1/64 of maxBytes (256 KB for 16 MiB), the same each run:
// 3.2 times maxBytes of JSON per shape, so that a near cache that weighed
// its values at nothing would hold over the test's bound of twice
// MaxBytes for every T, []byte included (600 values took half as long
// again).
func heapSizes(maxBytes int) []int {
	r := rand.New(rand.NewPCG(24, 5))
	s := make([]int, 400)
	for i := range s {
		s[i] = 1<<10 + r.IntN(maxBytes/64-1<<10)
	}
	return s
}

// liveHeap returns the bytes of live heap, after two collections (the
// second frees what the first left in sync.Pool's victim caches).
func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// nearHeap reads keys once each through a cache of T with a near cache
// of maxBytes, and returns what that added to the heap, with the cache
// and its near cache still held, and the near cache's Stats.
func nearHeap[T any](t *testing.T, rdb redis.UniversalClient, keys []string, maxBytes int64, opts ...packcache.Option) (grew int64, st packcache.Stats) {
	ctx := ctxT(t)
	// Whatever a first read sets up (the decompressor's windows, the
	// serializer's caches, buffers in pools) is set up by a cache without
	// a near cache first, and counted before.
	plain := mustNew[T](t, rdb, append([]packcache.Option{packcache.WithShareWindow(packcache.Off)}, opts...)...)
	for _, k := range keys {
		if _, err := plain.Get(ctx, k); err != nil {
			t.Fatalf("Get %s: %v", k, err)
		}
	}
	// A long MaxLag: a loaded machine delaying heartbeats must not stop
	// the near cache taking values in.
	c := mustNew[T](t, rdb, append([]packcache.Option{
		packcache.WithLocalCache(packcache.LocalCache{MaxBytes: maxBytes, TTL: time.Hour, MaxLag: time.Minute}),
		packcache.WithShareWindow(packcache.Off),
	}, opts...)...)
	waitNear(t, c, "heap:ready")
	before := liveHeap()
	for _, k := range keys {
		if _, err := c.Get(ctx, k); err != nil {
			t.Fatalf("Get %s: %v", k, err)
		}
	}
	packcache.SettleNear(c)
	after := liveHeap()
	st = c.Stats()
	runtime.KeepAlive(c)
	runtime.KeepAlive(plain)
	return after - before, st
}

// TestNearHeapBound: 400 values of 1 to 256 KB, read once each through a
// 16 MiB near cache, add at most twice MaxBytes to the heap, for T = any
// (trees of maps, slices, float64 and strings), []byte, json.RawMessage, a
// slice of structs, a struct, and a map; and Stats reports at most
// MaxBytes held. What an entry weighs is the heap its decoded value keeps
// alive, not its serialized length: a tree of any is many times the JSON
// it was read from, and a []byte decompressed into may have room to spare.
// (The msgpack module checks its serializer the same way.)
func TestNearHeapBound(t *testing.T) {
	if raceEnabled {
		// The race detector changes allocation sizes and slows the 1,200
		// compressed writes past a minute: CI runs this test without
		// -race, with the other allocation bounds.
		t.Skip("run without -race")
	}
	t.Parallel()
	if !redistest.Alone(t) {
		return // measured in a process of its own
	}
	redistest.RequireServer(t, "the near cache needs CLIENT TRACKING")
	_, rdb := single(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// 16 MiB under PACKCACHE_LONG=1, as CI runs it; 4 MiB, and values a
	// quarter the size, otherwise: a quarter of the seconds, the same
	// ratios.
	maxBytes := int64(sized(4<<20, 16<<20))
	if err := rdb.Set(ctx, "heap:ready", "null", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// The values are written as Set writes them (compressed, as most of
	// them are at these sizes), once for each document shape.
	w := mustNew[json.RawMessage](t, rdb)
	sizes := heapSizes(int(maxBytes))
	shapes := map[string]func(seed uint64, size int) []byte{
		"rows":  func(seed uint64, size int) []byte { return heapRows(seed, size, false) },
		"keyed": func(seed uint64, size int) []byte { return heapRows(seed, size, true) },
		"channel": func(seed uint64, size int) []byte {
			b, err := json.Marshal(makeChannel(seed, size))
			if err != nil {
				t.Error(err) // on a writing goroutine: not Fatal
			}
			return b
		},
	}
	// Made and written by a few goroutines at once: the documents and
	// their compression are seconds of CPU, and nothing is measured yet.
	keys := map[string][]string{}
	type write struct {
		doc  func(seed uint64, size int) []byte
		key  string
		i    int
		size int
	}
	writes := make(chan write)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for wr := range writes {
				if err := w.Set(ctx, wr.key, wr.doc(uint64(wr.i), wr.size)); err != nil {
					select {
					case errs <- fmt.Errorf("Set %s: %w", wr.key, err):
					default:
					}
				}
			}
		})
	}
	for shape, doc := range shapes {
		for i, size := range sizes {
			k := fmt.Sprintf("heap:%s:%d", shape, i)
			writes <- write{doc, k, i, size}
			keys[shape] = append(keys[shape], k)
		}
	}
	close(writes)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	check := func(t *testing.T, grew int64, st packcache.Stats) {
		t.Logf("heap grew %.1f MiB; Stats: %.1f MiB held", float64(grew)/(1<<20), float64(st.NearBytes)/(1<<20))
		if st.NearBytes > uint64(maxBytes) {
			t.Errorf("Stats reports %d bytes held, over MaxBytes %d", st.NearBytes, maxBytes)
		}
		if grew > 2*maxBytes {
			t.Errorf("the near cache added %.1f MiB to the heap, over twice its MaxBytes of %d MiB", float64(grew)/(1<<20), maxBytes>>20)
		}
	}
	run := func(name string, f func(t *testing.T) (int64, packcache.Stats)) {
		t.Run(name, func(t *testing.T) {
			grew, st := f(t)
			check(t, grew, st)
		})
	}
	run("any", func(t *testing.T) (int64, packcache.Stats) { return nearHeap[any](t, rdb, keys["rows"], maxBytes) })
	run("[]byte", func(t *testing.T) (int64, packcache.Stats) { return nearHeap[[]byte](t, rdb, keys["rows"], maxBytes) })
	run("json.RawMessage", func(t *testing.T) (int64, packcache.Stats) {
		return nearHeap[json.RawMessage](t, rdb, keys["rows"], maxBytes)
	})
	run("[]Row", func(t *testing.T) (int64, packcache.Stats) {
		return nearHeap[[]heapRow](t, rdb, keys["rows"], maxBytes)
	})
	run("struct", func(t *testing.T) (int64, packcache.Stats) {
		return nearHeap[Channel](t, rdb, keys["channel"], maxBytes)
	})
	run("map", func(t *testing.T) (int64, packcache.Stats) {
		return nearHeap[map[string]heapRow](t, rdb, keys["keyed"], maxBytes)
	})
	run("any/DecodePerCaller", func(t *testing.T) (int64, packcache.Stats) {
		return nearHeap[any](t, rdb, keys["rows"], maxBytes, packcache.WithDecodePerCaller())
	})
}
