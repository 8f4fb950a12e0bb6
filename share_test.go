package packcache_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
)

// delayGets delays the reply of every GET by delay, as a slow network or
// a descheduled client would: the read is done in Redis, its caller hears
// of it later.
type delayGets struct{ delay time.Duration }

func (h delayGets) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h delayGets) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h delayGets) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "get" {
			time.Sleep(h.delay)
		}
		return err
	}
}

// TestShareWindowBoundWithSlowReplies: the share window's promise holds
// when replies are slow: a Get never returns a value from a read begun
// more than one window before it, so a write by another process is seen by
// every Get that starts more than one window after the write returned,
// however long the replies take.
func TestShareWindowBoundWithSlowReplies(t *testing.T) {
	s := redistest.Start(t)
	const delay = 300 * time.Millisecond
	const window = (10 * time.Millisecond)
	slow := s.Client(t)
	slow.AddHook(delayGets{delay})
	ctx := ctxT(t)
	c := mustNew[Channel](t, slow)
	other := mustNew[Channel](t, s.Client(t)) // another process, with a fast link
	if err := other.Set(ctx, "w", Channel{ID: "v1"}); err != nil {
		t.Fatal(err)
	}
	type obs struct {
		start time.Time
		id    string
	}
	var (
		mu   sync.Mutex
		seen []obs
		stop atomic.Bool
		wg   sync.WaitGroup
	)
	for range 16 {
		wg.Go(func() {
			for !stop.Load() {
				start := time.Now()
				v, err := c.Get(ctx, "w")
				if err != nil {
					t.Errorf("Get: %v", err)
					return
				}
				mu.Lock()
				seen = append(seen, obs{start, v.ID})
				mu.Unlock()
				time.Sleep(time.Duration(start.UnixNano()%7) * time.Millisecond) // spread the arrivals
			}
		})
	}
	time.Sleep(2 * delay)
	if err := other.Set(ctx, "w", Channel{ID: "v2"}); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	time.Sleep(3 * delay)
	stop.Store(true)
	wg.Wait()
	var latestOld time.Duration = -1
	var oldAfter, newAfter int
	for _, o := range seen {
		d := o.start.Sub(written)
		if d < 0 {
			continue
		}
		if o.id == "v1" {
			oldAfter++
			latestOld = max(latestOld, d)
		} else {
			newAfter++
		}
	}
	t.Logf("replies delayed %v, window %v: %d Gets begun after the write saw the old value, the latest %v after it; %d saw the new one",
		delay, window, oldAfter, max(latestOld, 0), newAfter)
	if newAfter == 0 {
		t.Fatal("no Get saw the write")
	}
	if latestOld > window+2*time.Millisecond {
		t.Fatalf("a Get begun %v after another process's write returned got the old value; the window is %v", latestOld, window)
	}
}

// Own write then Get must never return an older value (hot slot vs forget).
func TestHotSlotAfterSet(t *testing.T) {
	t.Parallel()
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
