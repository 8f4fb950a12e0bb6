package packcache_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
)

// groupHitRounds is how many rounds of the four cases one
// BenchmarkGroupedHit runs.
const groupHitRounds = 5

// BenchmarkGroupedHit sets the cost of a hit of a key stored in a group
// (InGroups) beside one stored in none, with and without a near cache:
// one goroutine, one key, WithShareWindow(Off) so that every Get that
// misses the near cache reads Redis. It reports, besides ns/op, cmds/op:
// the commands Redis ran per Get (INFO commandstats), which are its round
// trips, since a Get sends its commands in one pipeline or one at a time.
//
// The four cases run in turn, groupHitRounds rounds, so that the
// machine's noise falls on all alike (the sub-benchmarks
// round=N/near=X/grouped=Y); for more, run the binary again rather than
// -count, which repeats a sub-benchmark in place:
//
//	go test -c -o packcache.test .
//	for i in 1 2 3; do ./packcache.test -test.run=NONE -test.bench='^BenchmarkGroupedHit$' -test.benchtime=20000x; done
func BenchmarkGroupedHit(b *testing.B) {
	redistest.RequireServer(b, "INFO commandstats and CLIENT TRACKING")
	s := redistest.Start(b)
	rdb := s.Universal(b)
	ctx := context.Background()
	doc := nearHitDoc{ID: "ch-1", Title: "Course announcements"}
	for i := range 8 {
		doc.Messages = append(doc.Messages, nearHitMsg{
			ID: int64(i), Author: fmt.Sprintf("student%04d", i),
			Text: strings.Repeat("lecture notes ", 1+i%8), Sent: time.Unix(int64(1_790_000_000+37*i), 0),
		})
	}
	caches := map[bool]*packcache.Cache[nearHitDoc]{}
	for _, near := range []bool{false, true} {
		opts := []packcache.Option{packcache.WithRedisTimeout(time.Minute), packcache.WithShareWindow(packcache.Off)}
		if near {
			opts = append(opts, packcache.WithLocalCache(packcache.LocalCache{MaxBytes: 16 << 20, TTL: time.Hour, MaxLag: time.Minute}))
		}
		c, err := packcache.New[nearHitDoc](rdb, opts...)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		caches[near] = c
		for _, grouped := range []bool{false, true} {
			var so []packcache.SetOption
			if grouped {
				so = append(so, packcache.InGroups("user:42", "tenant:7"))
			}
			if err := c.Set(ctx, groupHitKey(near, grouped), doc, so...); err != nil {
				b.Fatal(err)
			}
		}
	}
	for round := range groupHitRounds {
		for _, near := range []bool{false, true} {
			for _, grouped := range []bool{false, true} {
				c, key := caches[near], groupHitKey(near, grouped)
				if near {
					for !isNearHit(ctx, c, key) {
					}
				}
				b.Run(fmt.Sprintf("round=%d/near=%v/grouped=%v", round, near, grouped), func(b *testing.B) {
					b.ReportAllocs()
					before := commandCalls(b, rdb)
					for b.Loop() {
						if _, err := c.Get(ctx, key); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(commandCalls(b, rdb)-before-1)/float64(b.N), "cmds/op")
				})
			}
		}
	}
}

func groupHitKey(near, grouped bool) string {
	return fmt.Sprintf("grouphit:near=%v:grouped=%v", near, grouped)
}

// isNearHit reports whether a Get of key is answered by c's near cache.
func isNearHit(ctx context.Context, c *packcache.Cache[nearHitDoc], key string) bool {
	before := c.Stats().NearHits
	c.Get(ctx, key)
	return c.Stats().NearHits > before
}

// commandCalls is the number of commands Redis has run, from INFO
// commandstats (the INFO that asks counts itself, once it has run).
func commandCalls(b *testing.B, rdb redis.UniversalClient) int64 {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\r\n") {
		if !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		_, rest, _ := strings.Cut(line, "calls=")
		v, _, _ := strings.Cut(rest, ",")
		c, _ := strconv.ParseInt(v, 10, 64)
		n += c
	}
	return n
}
