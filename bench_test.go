package packcache_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// Benchmarks against a redis-server of their own (redistest.Start). Run
//
//	go test -run=NONE -bench=Get -benchmem .
//
// to see packcache's Get next to BenchmarkBaselineGet, the same value read
// with hand-written go-redis + codec.Zstd + encoding/json.
//
// Get benchmarks use WithShareWindow(0) so that every Get reads Redis and
// decodes: with the default window, repeated Gets of one key within 10 ms
// share one read, which BenchmarkGetShared measures. Values are compressed
// whatever their size (WithCompressAbove(0)) so the codecs differ at 1 KB.

var benchCodecs = []struct {
	name string
	c    codec.Codec
}{
	{"none", codec.None},
	{"lz4", codec.LZ4},
	{"snappy", codec.Snappy},
	{"zstd", codec.Zstd},
}

var benchSizes = []struct {
	name string
	size int
}{
	{"1KB", 1 << 10},
	{"128KB", 128 << 10},
}

func benchChannel(b *testing.B, size int) (Channel, []byte) {
	b.Helper()
	ch := makeChannel(uint64(size), size)
	raw, err := json.Marshal(ch)
	if err != nil {
		b.Fatal(err)
	}
	return ch, raw
}

func BenchmarkGet(b *testing.B) {
	s := redistest.Start(b)
	rdb := s.Universal(b)
	ctx := context.Background()
	for _, sz := range benchSizes {
		ch, raw := benchChannel(b, sz.size)
		for _, cd := range benchCodecs {
			b.Run(cd.name+"/"+sz.name, func(b *testing.B) {
				c := mustNew[Channel](b, rdb, packcache.WithCodec(cd.c), packcache.WithCompressAbove(packcache.CompressAll), packcache.WithShareWindow(packcache.Off))
				key := "bench:get:" + cd.name + ":" + sz.name
				if err := c.Set(ctx, key, ch); err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(len(raw)))
				b.ReportAllocs()
				for b.Loop() {
					v, err := c.Get(ctx, key)
					if err != nil || len(v.Messages) != len(ch.Messages) {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkGetShared is Get with the default share window: sequential Gets
// of one key mostly reuse the last read.
func BenchmarkGetShared(b *testing.B) {
	s := redistest.Start(b)
	rdb := s.Universal(b)
	ctx := context.Background()
	for _, sz := range benchSizes {
		ch, raw := benchChannel(b, sz.size)
		b.Run("zstd/"+sz.name, func(b *testing.B) {
			c := mustNew[Channel](b, rdb)
			key := "bench:shared:" + sz.name
			if err := c.Set(ctx, key, ch); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Get(ctx, key); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkGetRaw(b *testing.B) {
	s := redistest.Start(b)
	rdb := s.Universal(b)
	ctx := context.Background()
	for _, sz := range benchSizes {
		_, raw := benchChannel(b, sz.size)
		for _, cd := range benchCodecs {
			b.Run(cd.name+"/"+sz.name, func(b *testing.B) {
				c := mustNew[[]byte](b, rdb, packcache.WithCodec(cd.c), packcache.WithCompressAbove(packcache.CompressAll), packcache.WithShareWindow(packcache.Off))
				key := "bench:getraw:" + cd.name + ":" + sz.name
				if err := c.Set(ctx, key, raw); err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(len(raw)))
				b.ReportAllocs()
				for b.Loop() {
					v, err := c.Get(ctx, key)
					if err != nil || len(v) != len(raw) {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkBaselineGet reads the value packcache's default codec would
// store, by hand: GET, codec.Zstd.Decode into a pooled buffer, then
// json.Unmarshal (encoding/json) or packcache.JSON.Unmarshal (the default
// serializer, the like-for-like baseline).
func BenchmarkBaselineGet(b *testing.B) {
	s := redistest.Start(b)
	rdb := s.Universal(b)
	ctx := context.Background()
	bufs := sync.Pool{New: func() any { b := make([]byte, 0, 256<<10); return &b }}
	for _, sz := range benchSizes {
		ch, raw := benchChannel(b, sz.size)
		for _, ser := range []struct {
			name      string
			unmarshal func([]byte, any) error
		}{{"encoding-json", json.Unmarshal}, {"packcache.JSON", packcache.JSON.Unmarshal}} {
			b.Run("zstd/"+sz.name+"/"+ser.name, func(b *testing.B) {
				key := "bench:baseline:" + sz.name
				z, err := codec.Zstd.Encode(nil, raw)
				if err != nil {
					b.Fatal(err)
				}
				if err := rdb.Set(ctx, key, z, 0).Err(); err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(len(raw)))
				b.ReportAllocs()
				for b.Loop() {
					data, err := rdb.Get(ctx, key).Bytes()
					if err != nil {
						b.Fatal(err)
					}
					buf := bufs.Get().(*[]byte)
					out, err := codec.Zstd.Decode((*buf)[:0], data, (64 << 20))
					if err != nil {
						b.Fatal(err)
					}
					var v Channel
					if err := ser.unmarshal(out, &v); err != nil || len(v.Messages) != len(ch.Messages) {
						b.Fatal(err)
					}
					*buf = out[:0]
					bufs.Put(buf)
				}
			})
		}
	}
}

func BenchmarkSet(b *testing.B) {
	s := redistest.Start(b)
	rdb := s.Universal(b)
	ctx := context.Background()
	for _, sz := range benchSizes {
		ch, raw := benchChannel(b, sz.size)
		for _, cd := range benchCodecs {
			b.Run(cd.name+"/"+sz.name, func(b *testing.B) {
				c := mustNew[Channel](b, rdb, packcache.WithCodec(cd.c), packcache.WithCompressAbove(packcache.CompressAll))
				key := "bench:set:" + cd.name + ":" + sz.name
				b.SetBytes(int64(len(raw)))
				b.ReportAllocs()
				for b.Loop() {
					if err := c.Set(ctx, key, ch); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkSetRaw is Set of []byte: packcache's own cost without
// encoding/json.
func BenchmarkSetRaw(b *testing.B) {
	s := redistest.Start(b)
	rdb := s.Universal(b)
	ctx := context.Background()
	for _, sz := range benchSizes {
		_, raw := benchChannel(b, sz.size)
		b.Run("zstd/"+sz.name, func(b *testing.B) {
			c := mustNew[[]byte](b, rdb, packcache.WithCompressAbove(packcache.CompressAll))
			key := "bench:setraw:" + sz.name
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				if err := c.Set(ctx, key, raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSurgeWarm: each iteration releases 1000 goroutines at once on
// one warm 128 KB key. A Set (untimed) before each iteration ends the
// sharing of the previous iteration's read, so every surge does its own
// Redis read; gets/op reports how many GETs Redis saw per surge.
func BenchmarkSurgeWarm(b *testing.B) {
	callers := 1000
	if n, err := strconv.Atoi(os.Getenv("PACKCACHE_SURGE_CALLERS")); err == nil {
		callers = n
	}
	s := redistest.Start(b)
	rdb := s.Universal(b)
	ctx := context.Background()
	ch, _ := benchChannel(b, 128<<10)
	c := mustNew[Channel](b, rdb)
	const key = "bench:surge"
	if err := c.Set(ctx, key, ch); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	var gets int64
	iters := 0
	for b.Loop() {
		b.StopTimer()
		if err := c.Set(ctx, key, ch); err != nil {
			b.Fatal(err)
		}
		before := s.CommandCount(b, "get")
		start := make(chan struct{})
		var ready, done sync.WaitGroup
		errs := make(chan error, callers)
		for range callers {
			ready.Add(1)
			done.Add(1)
			go func() {
				defer done.Done()
				ready.Done()
				<-start
				if v, err := c.Get(ctx, key); err != nil || len(v.Messages) != len(ch.Messages) {
					errs <- fmt.Errorf("surge Get: %v", err)
				}
			}()
		}
		ready.Wait()
		b.StartTimer()
		close(start)
		done.Wait()
		b.StopTimer()
		gets += s.CommandCount(b, "get") - before
		iters++
		select {
		case err := <-errs:
			b.Fatal(err)
		default:
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(gets)/float64(iters), "gets/op")
}
