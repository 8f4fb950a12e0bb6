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

// TestNearTrackingTraffic: what the invalidation stream costs a process
// that holds 10 keys while another process writes 10,000 other keys of
// the same prefix, one write at a time: under TrackKeys it receives at
// most 100 invalidation messages (Redis tracks the 10 keys it read, and
// nothing else), under TrackPrefixes one per write, at least 10,000. The
// counts are of the messages the process's invalidation connection
// received, after a fence (a write of a held key, whose invalidation comes
// after every earlier one); Redis's own counters are logged beside them:
// the tracking table's keys (INFO stats tracking_total_keys) and, where the
// server counts them (Valkey), the bytes sent to the invalidation
// connection (CLIENT LIST tot-net-out). docs/near-cache.md quotes the log.
func TestNearTrackingTraffic(t *testing.T) {
	t.Parallel()
	redistest.RequireServer(t, "the near cache needs CLIENT TRACKING")
	const held, written = 10, 10_000
	eachTracking(t, func(t *testing.T, tk packcache.Tracking) {
		t.Parallel()
		s := redistest.Start(t)
		redistest.RequireReal(t, s, "counts the server's tracking")
		ctx := ctxT(t)
		rdb := s.Client(t)
		writer := s.Client(t)
		// Held keys written before the near cache tracks anything.
		for i := range held {
			if err := writer.Set(ctx, fmt.Sprintf("doc:held:%d", i), fmt.Sprintf(`{"id":"h%d"}`, i), 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		// A minute's MaxLag: no heartbeat closes the gate while a busy
		// machine runs the writes.
		c := mustNew[Channel](t, rdb, packcache.WithLocalCache(packcache.LocalCache{MaxBytes: 16 << 20, TTL: time.Hour, MaxLag: time.Minute, Tracking: tk}))
		for i := range held {
			waitNear(t, c, fmt.Sprintf("doc:held:%d", i))
		}
		msgs0, keys0 := packcache.NearReceived(c)
		net0 := listenerNetOut(t, writer)
		for i := range written {
			if err := writer.Set(ctx, fmt.Sprintf("doc:other:%d", i), `{"id":"o"}`, 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		// The fence: once its invalidation has arrived, so has every
		// invalidation Redis sent before it.
		writer.Set(ctx, "doc:held:0", `{"id":"fence"}`, 0)
		waitFor(t, time.Minute, "the fence's invalidation", func() bool {
			v, err := c.Get(ctx, "doc:held:0")
			return err == nil && v.ID == "fence"
		})
		msgs1, keys1 := packcache.NearReceived(c)
		msgs, keys := msgs1-msgs0, keys1-keys0
		net := listenerNetOut(t, writer)
		tracked := infoField(t, writer, "stats", "tracking_total_keys")
		items := infoField(t, writer, "stats", "tracking_total_items")
		netNote := "tot-net-out not counted by this server"
		if net0 >= 0 && net >= 0 {
			netNote = fmt.Sprintf("the server sent its invalidation connection %d bytes", net-net0)
		}
		name := map[packcache.Tracking]string{packcache.TrackKeys: "TrackKeys", packcache.TrackPrefixes: "TrackPrefixes"}[tk]
		t.Logf("%s: %d held keys, %d writes of other keys + 1 fence: received %d messages naming %d keys; Redis tracks %d keys (%d items); %s",
			name, held, written, msgs, keys, tracked, items, netNote)
		switch tk {
		case packcache.TrackKeys:
			if msgs > 100 {
				t.Fatalf("TrackKeys: %d messages for writes of keys the process does not hold; want at most 100", msgs)
			}
			if tracked > held+1 {
				t.Fatalf("TrackKeys: Redis tracks %d keys; the process read %d", tracked, held)
			}
		default:
			if keys < written || msgs < written {
				t.Fatalf("TrackPrefixes: %d messages naming %d keys for %d writes; want one per write", msgs, keys, written)
			}
		}
	})
}

// listenerNetOut returns the bytes the server has sent the near cache's
// invalidation connection (CLIENT LIST tot-net-out), or -1 where the
// server does not count them.
func listenerNetOut(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	list, err := c.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(list, "\n") {
		if !strings.Contains(line, "name=packcache-invalidation ") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "tot-net-out="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
	}
	return -1
}

// infoField returns a numeric field of an INFO section.
func infoField(t *testing.T, c *redis.Client, section, field string) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	t.Fatalf("no %s in INFO %s", field, section)
	return 0
}

// TestNearKilledReader: under TrackKeys, Redis remembers a key by the
// connection that read it, and forgets it when that connection closes. With
// the near cache's reading connections killed (CLIENT KILL, as an operator
// or the server's timeout setting would), another process's write of a
// held key is told to nobody: the near cache must still not serve the old
// value to a Get begun more than MaxLag after the write returned (the
// heartbeat proves the readers alive, and fails), and serves again after.
func TestNearKilledReader(t *testing.T) {
	t.Parallel()
	redistest.RequireServer(t, "the near cache needs CLIENT TRACKING")
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "kills connections")
	ctx := ctxT(t)
	other := s.Client(t)
	const lag = 200 * time.Millisecond
	c := mustNew[Channel](t, s.Client(t), advNear(packcache.TrackKeys, lag)...)
	for round := range 3 {
		key := fmt.Sprintf("kr:%d", round)
		other.Set(ctx, key, `{"id":"old"}`, 0)
		waitNear(t, c, key)
		killed := 0
		list, _ := other.ClientList(ctx).Result()
		for _, line := range strings.Split(list, "\n") {
			if !strings.Contains(line, "name=packcache-tracked-read ") {
				continue
			}
			id, _, _ := strings.Cut(strings.TrimPrefix(line, "id="), " ")
			if err := other.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err != nil {
				t.Fatal(err)
			}
			killed++
		}
		if killed == 0 {
			t.Fatal("no tracked-read connection to kill")
		}
		if n := infoField(t, other, "stats", "tracking_total_items"); n != 0 {
			t.Logf("round %d: Redis still counts %d tracked items after the kill (it forgets them lazily)", round, n)
		}
		other.Set(ctx, key, `{"id":"new"}`, 0)
		written := time.Now()
		waitFor(t, time.Minute, "the write seen", func() bool {
			began := time.Now()
			v, err := c.Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if v.ID == "old" && began.After(written.Add(lag)) {
				t.Fatalf("round %d: a Get begun %v after the write returned got the old value; MaxLag is %v", round, began.Sub(written), lag)
			}
			return v.ID == "new"
		})
		waitNear(t, c, key) // and it serves again
	}
}
