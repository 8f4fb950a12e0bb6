package packcache_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
)

// Own write then Get must never return an older value (hot slot vs forget).
func TestAdv2HotSlotAfterSet(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Universal(t)
	ctx := ctxT(t)
	for _, name := range []string{"plain", "near"} {
		t.Run(name, func(t *testing.T) {
			opts := []packcache.Option{packcache.WithShareWindow(50 * time.Millisecond)}
			if name == "near" {
				opts = append(opts, packcache.WithLocalCache(packcache.LocalCache{MaxBytes: 1 << 20, TTL: time.Minute}))
			}
			c := mustNew[Channel](t, rdb, opts...)
			key := "hot:" + name
			var stop atomic.Bool
			done := make(chan struct{})
			for range 3 {
				go func() {
					for !stop.Load() {
						c.Get(ctx, key)
					}
					done <- struct{}{}
				}()
			}
			bad := 0
			deadline := time.Now().Add(3 * time.Second)
			i := 0
			for ; time.Now().Before(deadline); i++ {
				want := string(rune('a'+i%26)) + string(rune('a'+(i/26)%26)) + string(rune('a'+(i/676)%26))
				if err := c.Set(ctx, key, Channel{ID: want}); err != nil {
					t.Fatal(err)
				}
				v, err := c.Get(ctx, key)
				if err == nil && v.ID != want {
					bad++
					if bad <= 3 {
						t.Errorf("iteration %d: Get right after Set(%q) returned %q", i, want, v.ID)
					}
				}
			}
			stop.Store(true)
			for range 3 {
				<-done
			}
			t.Logf("%d iterations, %d stale", i, bad)
		})
	}
}
