package packcacheotel_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
)

// BenchmarkGetHit measures a Get that finds its value in Redis (one GET,
// one decode) with no observer and with this package's, recording into the
// OpenTelemetry SDK. The share window is 0, so every Get reads Redis. The
// redis-server is the benchmark's own. Besides wall time per Get, which
// on a busy machine is mostly the round trip's waiting, it reports the
// process's CPU time per Get (cpu-ns/op), where the observer's cost shows.
// Compare the two with
//
//	go test -run '^$' -bench BenchmarkGetHit -count 6 | tee hit.txt
//	benchstat -col /observer hit.txt
func BenchmarkGetHit(b *testing.B) {
	s := redistest.Start(b)
	rdb := s.Client(b)
	ctx := context.Background()
	for _, size := range []struct {
		name  string
		bytes int
	}{{"1KiB", 1 << 10}, {"128KiB", 128 << 10}} {
		doc := makeDoc("bench", size.bytes)
		for _, observed := range []bool{false, true} {
			name := "size=" + size.name + "/observer=off"
			opts := []packcache.Option{packcache.WithShareWindow(packcache.Off), packcache.WithPrefix("doc:", packcache.Policy{})}
			if observed {
				name = "size=" + size.name + "/observer=otel"
				obs, _ := newObserver(b)
				opts = append(opts, packcache.WithObserver(obs))
			}
			b.Run(name, func(b *testing.B) {
				c := newCache(b, rdb, opts...)
				if err := c.Set(ctx, "doc:bench", doc); err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				cpu0, _ := cpuTime()
				for b.Loop() {
					if _, err := c.Get(ctx, "doc:bench"); err != nil {
						b.Fatal(err)
					}
				}
				if cpu1, ok := cpuTime(); ok {
					b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/op")
				}
			})
		}
	}
}

// BenchmarkObserver measures the observer alone: one event, of each kind a
// Get of a hit or a miss produces, recorded into the SDK. The parallel
// variants record from every core at once.
func BenchmarkObserver(b *testing.B) {
	obs, _ := newObserver(b)
	read := packcache.ReadEvent{Prefix: "doc:", Outcome: packcache.ReadHit}
	dec := packcache.CodecEvent{Prefix: "doc:", Codec: "zstd", Decode: true, Plain: 131072, Stored: 20_000, Duration: 150 * time.Microsecond}
	load := packcache.LoadEvent{Prefix: "doc:", Keys: 1, Duration: 4 * time.Millisecond}
	redisErr := packcache.RedisEvent{Prefix: "doc:", Node: "10.0.0.1:6379", Err: io.EOF}
	reply := packcache.RedisEvent{Prefix: "doc:", Node: "10.0.0.1:6379", Err: replyError("LOADING Redis is loading the dataset in memory")}
	timeout := packcache.RedisEvent{Prefix: "doc:", Node: "10.0.0.1:6379", Err: errors.Join(packcache.ErrRedis, context.DeadlineExceeded)}
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"read", func() { obs.ObserveRead(read) }},
		{"decode", func() { obs.ObserveCodec(dec) }},
		{"load", func() { obs.ObserveLoad(load) }},
		{"get-hit", func() { obs.ObserveRead(read); obs.ObserveCodec(dec) }}, // the two events of one Get that hits
		{"redis-error=network", func() { obs.ObserveRedis(redisErr) }},
		{"redis-error=timeout", func() { obs.ObserveRedis(timeout) }},
		{"redis-error=reply", func() { obs.ObserveRedis(reply) }},
	} {
		c.f()
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.f()
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
		b.Run(c.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					c.f()
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
