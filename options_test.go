package packcache_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestPrefixPolicy(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		ctx := ctxT(t)
		rdb := tg.Client
		c := mustNew[[]byte](t, rdb,
			packcache.WithCodec(codec.Zstd),
			packcache.WithPrefix("chan:", packcache.Policy{Codec: codec.LZ4, TTL: time.Minute}),
			packcache.WithPrefix("chan:big:", packcache.Policy{Codec: codec.Snappy, CompressAbove: 10_000}),
			packcache.WithPrefix("{user}:", packcache.Policy{Codec: codec.None}),
		)
		v := jsonText(5000)
		for key, want := range map[string]byte{
			"other":        codec.HeaderZstd,
			"chan:1":       codec.HeaderLZ4,
			"chan:big:1":   '"', // 5000 <= 10000: plain
			"{user}:42":    '"',
			"chan:bigger":  codec.HeaderLZ4, // under "chan:", not "chan:big:"
			"chan:big:2:x": '"',
		} {
			if err := c.Set(ctx, key, v); err != nil {
				t.Fatal(err)
			}
			if b := rawGet(t, rdb, key); b[0] != want {
				t.Errorf("%s stored with first byte %#x, want %#x", key, b[0], want)
			}
			got, err := c.Get(ctx, key)
			if err != nil || !bytes.Equal(got, v) {
				t.Errorf("%s: Get = %v", key, err)
			}
		}
		// TTLs: "chan:" has a minute; "chan:big:" sets none, so inherits the
		// cache's default hour, not its parent prefix's minute.
		for key, want := range map[string]time.Duration{"chan:1": time.Minute, "chan:big:1": time.Hour, "other": time.Hour} {
			d := rdb.PTTL(ctx, key).Val()
			if d <= want-5*time.Second || d > want {
				t.Errorf("%s: PTTL %v, want about %v", key, d, want)
			}
		}
		st := c.Stats()
		if got := st.Codecs["zstd"].Values; got != 1 {
			t.Errorf("stats: total zstd values = %d, want 1", got)
		}
		if st.Sets != 6 || st.Hits != 6 {
			t.Errorf("stats: sets %d hits %d, want 6 and 6", st.Sets, st.Hits)
		}
		if got := st.Prefixes["chan:"].Codecs["lz4"].Values; got != 2 {
			t.Errorf("stats: chan: lz4 values = %d, want 2", got)
		}
		if cs := st.Codecs["zstd"]; cs.BytesOut >= cs.BytesIn || cs.BytesIn != 5000 {
			t.Errorf("stats: zstd bytes in %d out %d", cs.BytesIn, cs.BytesOut)
		}
	})
}

func TestNewRejectsInvalidOptions(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer rdb.Close()
	if c, err := packcache.New[Channel](rdb); err != nil {
		t.Fatalf("New with no options: %v", err)
	} else {
		c.Close()
	}
	bad := map[string]packcache.Option{
		"nil codec":      packcache.WithCodec(nil),
		"negative above": packcache.WithCompressAbove(-5),
		"prefix above":   packcache.WithPrefix("a:", packcache.Policy{CompressAbove: -7}),
		"prefix neg ttl": packcache.WithPrefix("a:", packcache.Policy{NegativeTTL: -2}),
		"prefix stale":   packcache.WithPrefix("a:", packcache.Policy{StaleFor: -time.Second}),
		"prefix jitter":  packcache.WithPrefix("a:", packcache.Policy{TTLJitter: 1.5}),
		"prefix deltas":  packcache.WithPrefix("a:", packcache.Policy{Deltas: -time.Second}),
		"sub-ms deltas":  packcache.WithPrefix("a:", packcache.Policy{Deltas: time.Microsecond}),
		"redis timeout":  packcache.WithRedisTimeout(-time.Second),
		"load timeout":   packcache.WithLoadTimeout(-time.Second),
		"negative ttl":   packcache.WithTTL(-5),
		"sub-ms ttl":     packcache.WithTTL(time.Microsecond),
		"max size":       packcache.WithMaxValueSize(-1),
		"jitter":         packcache.WithPrefix("", packcache.Policy{TTLJitter: 1}),
		"window":         packcache.WithShareWindow(-5),
		"breaker":        packcache.WithCircuitBreaker(-5, 0),
		"near bytes":     packcache.WithLocalCache(packcache.LocalCache{MaxBytes: -5}),
		"near tracking":  packcache.WithLocalCache(packcache.LocalCache{Tracking: 7}),
		"near untracked": packcache.WithLocalCache(packcache.LocalCache{Untracked: -time.Second}),
		"untracked keys": packcache.WithLocalCache(packcache.LocalCache{Untracked: time.Second, Tracking: packcache.TrackKeys}),
		"prefix ttl":     packcache.WithPrefix("a:", packcache.Policy{TTL: -5}),
		"loader type":    packcache.WithPrefix("a:", packcache.Policy{Loader: packcache.LoaderFunc[int](nil)}),
		"refresh>ttl":    packcache.WithPrefix("a:", packcache.Policy{TTL: time.Second, RefreshAfter: time.Minute, Loader: packcache.LoaderFunc[Channel](nil)}),
		"lock lease":     packcache.WithLock(time.Microsecond),
		"min saving":     packcache.WithPrefix("", packcache.Policy{MinSaving: -5}),
	}
	for name, o := range bad {
		if _, err := packcache.New[Channel](rdb, o); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
	// Zero is the default, for every option and field: never an error.
	zero := []packcache.Option{packcache.WithTTL(0), packcache.WithRedisTimeout(0), packcache.WithLoadTimeout(0),
		packcache.WithMaxValueSize(0), packcache.WithCompressAbove(0), packcache.WithShareWindow(0),
		packcache.WithCircuitBreaker(0, 0), packcache.WithLock(0), packcache.WithPrefix("", packcache.Policy{}),
		packcache.WithPrefix("z:", packcache.Policy{})}
	if c, err := packcache.New[Channel](rdb, zero...); err != nil {
		t.Errorf("New with zero options: %v", err)
	} else {
		c.Close()
	}
	if _, err := packcache.New[Channel](rdb, packcache.WithPrefix("a:", packcache.Policy{}), packcache.WithPrefix("a:", packcache.Policy{})); err == nil {
		t.Error("duplicate prefix accepted")
	}
	if _, err := packcache.New[Channel](nil); err == nil {
		t.Error("nil client accepted")
	}
}

// TestPolicyInheritOffAll: every Policy field follows one rule: zero
// inherits the cache's setting, Off turns it off for the prefix, and
// CompressAbove's CompressAll compresses every value.
func TestPolicyInheritOffAll(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	redistest.RequireReal(t, s, "reads TTLs in real time")
	ctx := ctxT(t)
	var loads atomic.Int64
	c := mustNew[Channel](t, rdb,
		packcache.WithTTL(time.Hour),
		packcache.WithPrefix("", packcache.Policy{TTLJitter: 0.5}),
		packcache.WithPrefix("", packcache.Policy{NegativeTTL: time.Minute}),
		packcache.WithPrefix("", packcache.Policy{StaleFor: time.Hour}),
		packcache.WithCompressAbove(4096),
		packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
			loads.Add(1)
			if strings.HasSuffix(key, ":absent") {
				return Channel{}, packcache.ErrNotFound
			}
			return Channel{ID: key, Title: string(jsonText(200))}, nil
		})),
		packcache.WithPrefix("inherit:", packcache.Policy{}),
		packcache.WithPrefix("off:", packcache.Policy{
			TTLJitter: packcache.Off, NegativeTTL: packcache.Off, StaleFor: packcache.Off,
			Loader: packcache.Off, CompressAbove: packcache.Off,
		}),
		packcache.WithPrefix("all:", packcache.Policy{CompressAbove: packcache.CompressAll, TTL: packcache.Off}),
	)
	// inherit: jitter and the stale window apply, a miss loads, not-found
	// is remembered, a 300-byte value is below the threshold.
	if _, err := c.Get(ctx, "inherit:absent"); !errors.Is(err, packcache.ErrNotFound) {
		t.Fatal(err)
	}
	if raw := rawGet(t, rdb, "inherit:absent"); string(raw) != "\x0e" {
		t.Fatalf("inherit: not-found not remembered: %q", raw)
	}
	if _, err := c.Get(ctx, "inherit:k"); err != nil {
		t.Fatal(err)
	}
	if raw := rawGet(t, rdb, "inherit:k"); raw[0] != '{' {
		t.Fatalf("inherit: a small value was not stored plain: %q", raw[:8])
	}
	// Jitter is random: one key may draw almost none (1 time in 30 it
	// takes less than a minute off), so look at 20 keys. Each must lie
	// within the bounds, and not all of them can be unjittered.
	least := 2 * time.Hour
	for i := range 20 {
		key := fmt.Sprintf("inherit:j%d", i)
		if _, err := c.Get(ctx, key); err != nil {
			t.Fatal(err)
		}
		pttl := rdb.PTTL(ctx, key).Val()
		if pttl > 2*time.Hour || pttl < time.Hour+30*time.Minute-time.Minute {
			t.Fatalf("inherit: PTTL %v, want the TTL less up to half (jitter), plus the stale hour", pttl)
		}
		least = min(least, pttl)
	}
	if least > 2*time.Hour-time.Minute {
		t.Fatalf("inherit: the least PTTL of 20 keys is %v: no jitter applied", least)
	}
	// off: no loader (a miss is a miss), no stale window, no jitter, and
	// a large value stays plain.
	if _, err := c.Get(ctx, "off:k"); !errors.Is(err, packcache.ErrMiss) {
		t.Fatalf("off: Get with NoLoader: %v, want ErrMiss", err)
	}
	big := Channel{ID: "off:big", Title: string(jsonText(10_000))}
	if err := c.Set(ctx, "off:big", big); err != nil {
		t.Fatal(err)
	}
	if raw := rawGet(t, rdb, "off:big"); raw[0] != '{' {
		t.Fatalf("off: a 10 KB value was compressed with CompressAbove Off: header %02x", raw[0])
	}
	if pttl := rdb.PTTL(ctx, "off:big").Val(); pttl < time.Hour-time.Minute || pttl > time.Hour {
		t.Fatalf("off: PTTL %v, want the TTL exactly (no jitter, no stale window)", pttl)
	}
	// all: every value compressed, and TTL Off is no expiry.
	if err := c.Set(ctx, "all:k", Channel{ID: "all:k", Title: string(jsonText(200))}); err != nil {
		t.Fatal(err)
	}
	if raw := rawGet(t, rdb, "all:k"); raw[0] != codec.HeaderZstd {
		t.Fatalf("all: a 250-byte value was not compressed with CompressAll: %q", raw[:4])
	}
	if pttl := rdb.PTTL(ctx, "all:k").Val(); pttl != -1 {
		t.Fatalf("all: PTTL %v, want no expiry", pttl)
	}
}

// TestZeroMeansDefault: every option and Policy field follows one rule:
// zero is the default (in a Policy, the cache's setting), Off turns it
// off. Here: a zero TTL is an hour, a zero threshold is 1024 bytes, in
// WithTTL, WithCompressAbove and a prefix's Policy alike; Off is no expiry
// and no compression.
func TestZeroMeansDefault(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[json.RawMessage](t, rdb, packcache.WithTTL(0), packcache.WithCompressAbove(0),
		packcache.WithPrefix("p:", packcache.Policy{TTL: 0, CompressAbove: 0}),
		packcache.WithPrefix("off:", packcache.Policy{TTL: packcache.Off, CompressAbove: packcache.Off}))
	small, large := json.RawMessage(jsonText(1000)), json.RawMessage(jsonText(2000))
	for _, prefix := range []string{"", "p:", "off:"} {
		for _, v := range []json.RawMessage{small, large} {
			key := fmt.Sprintf("%szero:%d", prefix, len(v))
			if err := c.Set(ctx, key, v); err != nil {
				t.Fatal(err)
			}
			stored := rawGet(t, rdb, key)
			compressed := stored[0] == codec.HeaderZstd
			if want := len(v) > 1024 && prefix != "off:"; compressed != want {
				t.Errorf("%s: compressed %v, want %v", key, compressed, want)
			}
			d := rdb.PTTL(ctx, key).Val()
			if prefix == "off:" {
				if d != -1 {
					t.Errorf("%s: PTTL %v, want no expiry", key, d)
				}
			} else if d < time.Hour-time.Minute || d > time.Hour {
				t.Errorf("%s: PTTL %v, want the default hour", key, d)
			}
		}
	}
}

// TestOptionsReusable: one set of Options given to two caches means the
// same to both. (An option that rewrote its own argument, Off into zero,
// made the second cache read WithShareWindow(Off) as the default window:
// packbench's hit-path rows were shared reads.)
func TestOptionsReusable(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	opts := []packcache.Option{packcache.WithShareWindow(packcache.Off), packcache.WithCircuitBreaker(0, 0),
		packcache.WithRedisTimeout(0), packcache.WithLoadTimeout(0), packcache.WithMaxValueSize(0), packcache.WithLock(0),
		packcache.WithLocalCache(packcache.LocalCache{MaxBytes: packcache.Off})}
	for i := range 3 {
		c := mustNew[Channel](t, rdb, opts...)
		key := fmt.Sprintf("reuse:%d", i)
		if err := c.Set(ctx, key, Channel{ID: key}); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if _, err := c.Get(ctx, key); err != nil {
				t.Fatal(err)
			}
		}
		if n := c.Stats().CoalescedWaits; n != 0 {
			t.Fatalf("cache %d of the same options: %d sequential Gets shared a read, with WithShareWindow(Off)", i, n)
		}
	}
}
