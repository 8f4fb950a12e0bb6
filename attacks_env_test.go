package packcache_test

import (
	"strings"
	"testing"
	"time"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

func TestAdv2EnvTypos(t *testing.T) {
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

func TestAdv2EnvTTLConflictNamesVariable(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Universal(t)
	t.Setenv("PACKCACHE_PREFIX_CHANNEL_TTL", "1m")
	_, err := packcache.New[Channel](rdb, packcache.WithEnv(""), packcache.WithPrefix("channel:", packcache.Policy{TTL: 10 * time.Minute, RefreshAfter: 5 * time.Minute}))
	if err == nil || !strings.Contains(err.Error(), "PACKCACHE_PREFIX_CHANNEL_TTL") {
		t.Errorf("New error does not name the variable: %v", err)
	}
}
