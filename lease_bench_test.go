package packcache_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// BenchmarkHitWithLease sets a read-through hit, whose read is SET key
// lease PX ms NX GET (so that a miss places its lease in the same round
// trip), beside a loader-less hit, whose read is a plain GET, on the same
// stored value, with the subjects' rounds interleaved in one run so that
// the machine's noise falls on both. Each b.N iteration is one round: 200
// calls of each subject in turn, each round starting with the next. It reports each subject's median µs per
// call over the rounds, and the ratios:
//
//   - get, lease: Cache[json.RawMessage].Get (WithShareWindow(Off): every
//     Get reads Redis) without a loader and with one;
//   - redis-get, redis-setget: the bare go-redis commands.
//
// Run it as
//
//	go test -run=NONE -bench=HitWithLease -benchtime=30x .
func BenchmarkHitWithLease(b *testing.B) {
	s := redistest.Start(b)
	rdb := s.Universal(b)
	ctx := context.Background()
	for _, size := range []int{1100, 128 << 10} {
		b.Run(fmt.Sprintf("size=%s", human(size)), func(b *testing.B) {
			_, raw := benchChannel(b, size)
			plain := mustNew[json.RawMessage](b, rdb, packcache.WithShareWindow(packcache.Off))
			lease := mustNew[json.RawMessage](b, rdb, packcache.WithShareWindow(packcache.Off), packcache.WithLoader(packcache.LoaderFunc[json.RawMessage](func(ctx context.Context, key string) (json.RawMessage, error) {
				return nil, fmt.Errorf("a hit called the loader for %s", key)
			})))
			key := "hitlease:" + human(size)
			if err := plain.Set(ctx, key, raw); err != nil {
				b.Fatal(err)
			}
			token := "\x0cbench-lease-tok"
			subjects := []struct {
				name string
				f    func() error
			}{
				{"get", func() error { _, err := plain.Get(ctx, key); return err }},
				{"lease", func() error { _, err := lease.Get(ctx, key); return err }},
				{"redis-get", func() error { return rdb.Get(ctx, key).Err() }},
				{"redis-setget", func() error {
					return rdb.SetArgs(ctx, key, token, redis.SetArgs{Mode: "NX", Get: true, TTL: 3 * time.Second}).Err()
				}},
			}
			for _, sj := range subjects { // warm: connections, buffers
				for range 50 {
					if err := sj.f(); err != nil {
						b.Fatalf("%s: %v", sj.name, err)
					}
				}
			}
			const per = 200
			us := make([][]float64, len(subjects))
			round := 0
			for b.Loop() {
				round++
				for n := range subjects {
					// Each round starts with another subject, so that
					// none always follows the same one.
					i := (n + round) % len(subjects)
					sj := subjects[i]
					t0 := time.Now()
					for range per {
						if err := sj.f(); err != nil {
							b.Fatalf("%s: %v", sj.name, err)
						}
					}
					us[i] = append(us[i], float64(time.Since(t0).Nanoseconds())/1e3/per)
				}
			}
			med := make([]float64, len(us))
			for i, sj := range subjects {
				med[i] = median(us[i])
				b.ReportMetric(med[i], sj.name+"-µs")
			}
			b.ReportMetric(med[1]/med[0], "lease/get")
			b.ReportMetric(med[3]/med[2], "setget/get")
			if st := lease.Stats(); st.Loads != 0 || st.Stores != 0 {
				b.Fatalf("the hits loaded (%d) or stored (%d)", st.Loads, st.Stores)
			}
		})
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func human(n int) string {
	if n >= 1<<10 {
		return fmt.Sprintf("%.1fKB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}

// BenchmarkMissWithLease sets a read-through miss (GetOrLoad of an absent
// key, Cache[[]byte], WithShareWindow(Off), the loader returning at once)
// beside the same by hand with a lease in two round trips: SET key lease
// NX GET PX, zstd-compress, and a script that stores only over that
// lease. Rounds interleaved as in BenchmarkHitWithLease; packbench's miss
// suite measures the same with more subjects.
//
//	go test -run=NONE -bench=MissWithLease -benchtime=30x .
func BenchmarkMissWithLease(b *testing.B) {
	s := redistest.Start(b)
	rdb := s.Universal(b)
	ctx := context.Background()
	store := redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1`)
	for _, size := range []int{1100, 128 << 10} {
		b.Run(fmt.Sprintf("size=%s", human(size)), func(b *testing.B) {
			_, doc := benchChannel(b, size)
			c := mustNew[[]byte](b, rdb, packcache.WithShareWindow(packcache.Off))
			var seq int
			next := func(who string) string { seq++; return fmt.Sprintf("miss:%s:%s:%d", who, human(size), seq) }
			subjects := []struct {
				name string
				f    func() error
			}{
				{"packcache", func() error {
					_, err := c.GetOrLoad(ctx, next("pc"), func(context.Context) ([]byte, error) { return doc, nil })
					return err
				}},
				{"hand", func() error {
					k := next("hand")
					lease := fmt.Sprintf("\x0chand%012d", seq)
					if err := rdb.SetArgs(ctx, k, lease, redis.SetArgs{Mode: "NX", Get: true, TTL: 3 * time.Second}).Err(); err != redis.Nil {
						return fmt.Errorf("SET NX GET of an absent key: %v", err)
					}
					stored, err := codec.AppendValue(nil, codec.Zstd, doc)
					if err != nil {
						return err
					}
					return store.Run(ctx, rdb, []string{k}, lease, stored, time.Hour.Milliseconds()).Err()
				}},
			}
			for _, sj := range subjects {
				for range 50 {
					if err := sj.f(); err != nil {
						b.Fatalf("%s: %v", sj.name, err)
					}
				}
			}
			per := 200
			if size > 10<<10 {
				per = 20
			}
			us := make([][]float64, len(subjects))
			round := 0
			for b.Loop() {
				round++
				for n := range subjects {
					i := (n + round) % len(subjects)
					t0 := time.Now()
					for range per {
						if err := subjects[i].f(); err != nil {
							b.Fatalf("%s: %v", subjects[i].name, err)
						}
					}
					us[i] = append(us[i], float64(time.Since(t0).Nanoseconds())/1e3/float64(per))
				}
			}
			for i, sj := range subjects {
				b.ReportMetric(median(us[i]), sj.name+"-µs")
			}
			b.ReportMetric(median(us[0])/median(us[1]), "packcache/hand")
			rdb.FlushDB(ctx) // the server is the benchmark's own
		})
	}
}
