package packcache_test

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	gojson "github.com/goccy/go-json"
	"github.com/klauspost/compress/zstd"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// BenchmarkFloor sets packcache's hit path beside the hand-written floor
// it is measured against, in one run, each pair on the same value:
//
//   - typed: Cache[Channel].Get with WithShareWindow(0) (every Get reads
//     Redis and decodes) against go-redis GET + klauspost zstd DecodeAll
//     into a reused buffer + go-json Unmarshal;
//   - raw: Cache[json.RawMessage].Get against GET + DecodeAll;
//   - near: a near hit (WithLocalCache) against a read-locked map read of
//     the same value.
//
// Run it with interleaved rounds and compare medians:
//
//	go test -run=NONE -bench=Floor -benchmem -count=10 . | tee floor.txt
//	go run golang.org/x/perf/cmd/benchstat@latest -col /impl floor.txt
func BenchmarkFloor(b *testing.B) {
	s := redistest.Start(b)
	rdb := s.Universal(b)
	ctx := context.Background()
	ch, raw := benchChannel(b, 128<<10)
	frame, err := codec.AppendValue(nil, codec.Zstd, raw)
	if err != nil {
		b.Fatal(err)
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(0))
	if err != nil {
		b.Fatal(err)
	}
	defer dec.Close()
	if err := rdb.Set(ctx, "floor:hand", frame, 0).Err(); err != nil {
		b.Fatal(err)
	}
	var buf []byte // the floor's reused buffer
	floorRead := func(b *testing.B) []byte {
		data, err := rdb.Get(ctx, "floor:hand").Bytes()
		if err != nil {
			b.Fatal(err)
		}
		if buf, err = dec.DecodeAll(data[1:], buf[:0]); err != nil { // past the header byte
			b.Fatal(err)
		}
		return buf
	}

	b.Run("typed/impl=packcache", func(b *testing.B) {
		c := mustNew[Channel](b, rdb, packcache.WithShareWindow(packcache.Off))
		if err := c.Set(ctx, "floor:typed", ch); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(int64(len(raw)))
		b.ReportAllocs()
		for b.Loop() {
			if v, err := c.Get(ctx, "floor:typed"); err != nil || len(v.Messages) != len(ch.Messages) {
				b.Fatal(err)
			}
		}
	})
	b.Run("typed/impl=floor", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		b.ReportAllocs()
		for b.Loop() {
			var v Channel
			if err := gojson.Unmarshal(floorRead(b), &v); err != nil || len(v.Messages) != len(ch.Messages) {
				b.Fatal(err)
			}
		}
	})
	// interleaved: one Get and one floor read per iteration, each timed,
	// so that the machine's noise falls on both alike; it reports the
	// median of each and their ratio.
	b.Run("typed/impl=interleaved", func(b *testing.B) {
		c := mustNew[Channel](b, rdb, packcache.WithShareWindow(packcache.Off))
		if err := c.Set(ctx, "floor:typed", ch); err != nil {
			b.Fatal(err)
		}
		var pc, fl []float64
		for b.Loop() {
			t0 := time.Now()
			if v, err := c.Get(ctx, "floor:typed"); err != nil || len(v.Messages) != len(ch.Messages) {
				b.Fatal(err)
			}
			t1 := time.Now()
			var v Channel
			if err := gojson.Unmarshal(floorRead(b), &v); err != nil || len(v.Messages) != len(ch.Messages) {
				b.Fatal(err)
			}
			pc, fl = append(pc, float64(t1.Sub(t0))), append(fl, float64(time.Since(t1)))
		}
		reportInterleaved(b, pc, fl)
	})
	b.Run("raw/impl=packcache", func(b *testing.B) {
		c := mustNew[json.RawMessage](b, rdb, packcache.WithShareWindow(packcache.Off))
		if err := c.Set(ctx, "floor:raw", raw); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(int64(len(raw)))
		b.ReportAllocs()
		for b.Loop() {
			if v, err := c.Get(ctx, "floor:raw"); err != nil || len(v) != len(raw) {
				b.Fatal(err)
			}
		}
	})
	b.Run("raw/impl=floor", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		b.ReportAllocs()
		for b.Loop() {
			if v := floorRead(b); len(v) != len(raw) {
				b.Fatal(len(v))
			}
		}
	})
	b.Run("raw/impl=floor-fresh", func(b *testing.B) {
		// As the floor, but into a slice of the caller's own, as a Get
		// of []byte must return.
		b.SetBytes(int64(len(raw)))
		b.ReportAllocs()
		for b.Loop() {
			data, err := rdb.Get(ctx, "floor:hand").Bytes()
			if err != nil {
				b.Fatal(err)
			}
			v, err := dec.DecodeAll(data[1:], make([]byte, 0, len(raw)+32))
			if err != nil || len(v) != len(raw) {
				b.Fatal(err)
			}
		}
	})
	b.Run("near/impl=packcache", func(b *testing.B) {
		redistest.RequireServer(b, "the near cache needs CLIENT TRACKING")
		c := mustNew[Channel](b, rdb, packcache.WithLocalCache(packcache.LocalCache{MaxBytes: 16 << 20, TTL: time.Hour, MaxLag: time.Minute}))
		if err := c.Set(ctx, "floor:near", ch); err != nil {
			b.Fatal(err)
		}
		for c.Stats().NearHits == 0 {
			c.Get(ctx, "floor:near")
			time.Sleep(time.Millisecond) // until the invalidation stream is proven
		}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if v, err := c.Get(ctx, "floor:near"); err != nil || v.ID != ch.ID {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("near/impl=floor", func(b *testing.B) {
		var mu sync.RWMutex
		m := map[string]Channel{"floor:near": ch}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				mu.RLock()
				v, ok := m["floor:near"]
				mu.RUnlock()
				if !ok || v.ID != ch.ID {
					b.Fatal("missing")
				}
			}
		})
	})
}

// reportInterleaved reports the medians of two interleaved series of
// nanoseconds and their ratio.
func reportInterleaved(b *testing.B, pc, fl []float64) {
	med := func(x []float64) float64 {
		x = slices.Clone(x)
		slices.Sort(x)
		return x[len(x)/2]
	}
	if len(pc) == 0 {
		return
	}
	b.ReportMetric(med(pc), "packcache-ns")
	b.ReportMetric(med(fl), "floor-ns")
	b.ReportMetric(med(pc)/med(fl), "ratio")
}
