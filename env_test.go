package packcache_test

import (
	"strings"
	"testing"
	"time"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// TestEnvOverrides: the operator's variables override the code's codec,
// level, threshold and TTL, for the base policy and for declared
// prefixes; what they do not set keeps the code's setting.
func TestEnvOverrides(t *testing.T) {
	s, rdb := single(t)
	redistest.RequireReal(t, s, "reads TTLs in real time")
	ctx := ctxT(t)
	t.Setenv("PACKCACHE_CODEC", "lz4")
	t.Setenv("PACKCACHE_TTL", "90m")
	t.Setenv("PACKCACHE_PREFIX_CHANNEL_CODEC", "zstd")
	t.Setenv("PACKCACHE_PREFIX_CHANNEL_LEVEL", "19")
	t.Setenv("PACKCACHE_PREFIX_REPORT_MONTHLY_COMPRESS_ABOVE", "off")
	t.Setenv("PACKCACHE_PREFIX_REPORT_MONTHLY_TTL", "none")
	c := mustNew[Channel](t, rdb, packcache.WithEnv(""), packcache.WithCodec(codec.Snappy), packcache.WithTTL(time.Hour),
		packcache.WithPrefix("channel:", packcache.Policy{Codec: codec.LZ4, TTL: time.Minute}),
		packcache.WithPrefix("report:monthly:", packcache.Policy{}),
		packcache.WithPrefix("plain:", packcache.Policy{TTL: 2 * time.Minute}))
	big := makeChannel(1, 16<<10)
	for _, k := range []string{"base:1", "channel:1", "report:monthly:1", "plain:1"} {
		if err := c.Set(ctx, k, big); err != nil {
			t.Fatal(err)
		}
	}
	check := func(key string, header byte, ttlMin, ttlMax time.Duration) {
		t.Helper()
		if raw := rawGet(t, rdb, key); raw[0] != header {
			t.Errorf("%s: header %#02x, want %#02x", key, raw[0], header)
		}
		if pttl := rdb.PTTL(ctx, key).Val(); pttl < ttlMin || pttl > ttlMax {
			t.Errorf("%s: PTTL %v, want %v..%v", key, pttl, ttlMin, ttlMax)
		}
	}
	check("base:1", codec.HeaderLZ4, 89*time.Minute, 90*time.Minute)
	check("channel:1", codec.HeaderZstd, 59*time.Second, time.Minute) // the code's TTL for the prefix stays
	check("report:monthly:1", '{', -1, -1)                            // plain, no expiry
	check("plain:1", codec.HeaderLZ4, 119*time.Second, 2*time.Minute) // base codec from the environment
	// zstd level 19 is the best-compression encoder: smaller than the fastest.
	fast := mustNew[Channel](t, rdb, packcache.WithCodec(codec.Zstd))
	fast.Set(ctx, "fast:1", big)
	if a, b := len(rawGet(t, rdb, "channel:1")), len(rawGet(t, rdb, "fast:1")); a >= b {
		t.Errorf("PACKCACHE_PREFIX_CHANNEL_LEVEL=19 stored %d bytes, the fastest level %d", a, b)
	}
}

// TestEnvBadValues: a bad value fails New and names the variable.
func TestEnvBadValues(t *testing.T) {
	_, rdb := single(t)
	cases := map[string][2]string{
		"unknown codec":      {"PACKCACHE_CODEC", "brotli"},
		"zstd level":         {"PACKCACHE_LEVEL", "23"},
		"lz4 level":          {"PACKCACHE_PREFIX_CHANNEL_LEVEL", "12"},
		"level not a number": {"PACKCACHE_LEVEL", "fast"},
		"threshold":          {"PACKCACHE_COMPRESS_ABOVE", "-3"},
		"threshold word":     {"PACKCACHE_PREFIX_CHANNEL_COMPRESS_ABOVE", "1k"},
		"ttl":                {"PACKCACHE_TTL", "10"},
		"ttl too short":      {"PACKCACHE_TTL", "10us"},
		"undeclared prefix":  {"PACKCACHE_PREFIX_CHANEL_TTL", "1m"},
	}
	for name, kv := range cases {
		t.Run(name, func(t *testing.T) {
			t.Setenv(kv[0], kv[1])
			_, err := packcache.New[Channel](rdb, packcache.WithEnv(""),
				packcache.WithPrefix("channel:", packcache.Policy{Codec: codec.LZ4}))
			if err == nil || !strings.Contains(err.Error(), kv[0]) {
				t.Fatalf("%s=%s: New = %v, want an error naming %s", kv[0], kv[1], err, kv[0])
			}
		})
	}
	t.Run("level for snappy", func(t *testing.T) {
		t.Setenv("PACKCACHE_LEVEL", "3")
		if _, err := packcache.New[Channel](rdb, packcache.WithEnv(""), packcache.WithCodec(codec.Snappy)); err == nil || !strings.Contains(err.Error(), "PACKCACHE_LEVEL") {
			t.Fatalf("New = %v", err)
		}
	})
	t.Run("colliding prefixes", func(t *testing.T) {
		if _, err := packcache.New[Channel](rdb, packcache.WithEnv("APP"),
			packcache.WithPrefix("a:b", packcache.Policy{}), packcache.WithPrefix("a-b", packcache.Policy{})); err == nil || !strings.Contains(err.Error(), "APP_PREFIX_A_B") {
			t.Fatalf("New = %v", err)
		}
	})
	t.Run("without WithEnv nothing is read", func(t *testing.T) {
		t.Setenv("PACKCACHE_CODEC", "brotli")
		if _, err := packcache.New[Channel](rdb); err != nil {
			t.Fatal(err)
		}
	})
}

func TestEnvTypos(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Universal(t)
	for _, kv := range [][2]string{
		{"PACKCACHE_PREFIX_CHANNEL_CODECS", "lz4"},        // field typo, declared prefix
		{"PACKCACHE_PREFIX_CHANNEL_COMPRESSABOVE", "100"}, // field typo
		{"PACKCACHE_COMPRES_ABOVE", "100"},                // base field typo
		{"PACKCACHE_TLL", "10m"},                          // base field typo
	} {
		t.Run(kv[0], func(t *testing.T) {
			t.Setenv(kv[0], kv[1])
			c, err := packcache.New[Channel](rdb, packcache.WithEnv(""), packcache.WithPrefix("channel:", packcache.Policy{Codec: codec.Zstd}))
			if err == nil {
				c.Close()
				t.Errorf("%s=%s accepted by New without error (ignored silently?)", kv[0], kv[1])
			} else {
				t.Logf("error: %v", err)
			}
		})
	}
}

// TestEnvNotTypos: variables of the same namespace that are no typo of a
// WithEnv name, such as an application's own PACKCACHE_TLS, do not fail New.
func TestEnvNotTypos(t *testing.T) {
	_, rdb := single(t)
	for _, k := range []string{"PACKCACHE_TLS", "PACKCACHE_URL", "PACKCACHE_MODE", "PACKCACHE_ADDR", "PACKCACHE_DEBUG"} {
		t.Run(k, func(t *testing.T) {
			t.Setenv(k, "1")
			c, err := packcache.New[Channel](rdb, packcache.WithEnv(""))
			if err != nil {
				t.Fatalf("%s set: New: %v", k, err)
			}
			c.Close()
		})
	}
}

func TestEnvTTLConflictNamesVariable(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Universal(t)
	t.Setenv("PACKCACHE_PREFIX_CHANNEL_TTL", "1m")
	_, err := packcache.New[Channel](rdb, packcache.WithEnv(""), packcache.WithPrefix("channel:", packcache.Policy{TTL: 10 * time.Minute, RefreshAfter: 5 * time.Minute}))
	if err == nil || !strings.Contains(err.Error(), "PACKCACHE_PREFIX_CHANNEL_TTL") {
		t.Errorf("New error does not name the variable: %v", err)
	}
}
