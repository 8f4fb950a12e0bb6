package packcache_test

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// TestLoadTimeoutAndClose: a shared load runs detached from its callers,
// so it needs bounds of its own. WithLoadTimeout ends it with
// ErrLoadTimeout; Close waits for it, and ends it only if it outlives the
// load timeout.
func TestLoadTimeoutAndClose(t *testing.T) {
	_, rdb := single(t)
	ctx := ctxT(t)
	hang := packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
		<-ctx.Done()
		return Channel{}, ctx.Err()
	})
	c := mustNew[Channel](t, rdb, packcache.WithLoader(hang), packcache.WithLoadTimeout(100*time.Millisecond))
	start := time.Now()
	if _, err := c.Get(ctx, "k"); !errors.Is(err, packcache.ErrLoadTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get with a hanging loader: %v, want ErrLoadTimeout", err)
	}
	if d := time.Since(start); d < 90*time.Millisecond || d > 2*time.Second {
		t.Fatalf("load timed out after %v, want about 100ms", d)
	}

	// The caller leaves; the load goes on; Close waits for it up to the
	// load timeout, then ends it.
	c2, err := packcache.New[Channel](rdb, packcache.WithLoader(hang), packcache.WithLoadTimeout(300*time.Millisecond), packcache.WithRedisTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := c2.Get(short, "k2"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("caller with a short deadline: %v", err)
	}
	closed := make(chan error)
	start = time.Now()
	go func() { closed <- c2.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
		if d := time.Since(start); d < 200*time.Millisecond {
			t.Fatalf("Close returned after %v, before the load under way ended", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
}

// TestCircuitOpenWithoutLoader: with the breaker open, a Get without a
// loader fails at once with ErrCircuitOpen (which is also ErrRedis)
// rather than waiting on a Redis that is down.
func TestCircuitOpenWithoutLoader(t *testing.T) {
	s := redistest.Start(t)
	// No retries, so the two calls that open the breaker fail fast.
	rdb := s.Client(t, func(o *redis.Options) { o.MaxRetries, o.DialerRetries = -1, 1 })
	ctx := ctxT(t)
	c := mustNew[Channel](t, rdb, packcache.WithCircuitBreaker(2, time.Minute))
	s.Stop(t)
	// A refused connection opens the breaker at once, whatever its
	// threshold: nothing listens there.
	if _, err := c.Get(ctx, "k"); !errors.Is(err, packcache.ErrRedis) || errors.Is(err, packcache.ErrCircuitOpen) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Get before the breaker opens: %v, want ErrRedis naming the refused connection", err)
	}
	before := c.Stats().RedisErrors
	start := time.Now()
	_, err := c.Get(ctx, "k")
	if !errors.Is(err, packcache.ErrCircuitOpen) || !errors.Is(err, packcache.ErrRedis) {
		t.Fatalf("Get with the breaker open: %v", err)
	}
	if d := time.Since(start); d > 50*time.Millisecond || c.Stats().RedisErrors != before {
		t.Fatalf("open breaker still tried Redis (%v, %d more errors)", d, c.Stats().RedisErrors-before)
	}
	if _, err := c.GetMany(ctx, []string{"a", "b"}); !errors.Is(err, packcache.ErrCircuitOpen) {
		t.Fatalf("GetMany with the breaker open: %v", err)
	}
}

// snappyTest is a user codec: Snappy blocks under a user header byte.
type snappyTest struct{}

func (snappyTest) ID() byte     { return 0x1d }
func (snappyTest) Name() string { return "snappy-test" }
func (snappyTest) Encode(dst, src []byte) ([]byte, error) {
	return append(dst, snappy.Encode(nil, src)...), nil
}
func (snappyTest) Decode(dst, src []byte, limit int) ([]byte, error) {
	n, err := snappy.DecodedLen(src)
	if err != nil {
		return dst, codec.ErrCorrupt
	}
	if n > limit {
		return dst, codec.ErrTooLarge
	}
	out, err := snappy.Decode(nil, src)
	if err != nil {
		return dst, codec.ErrCorrupt
	}
	return append(dst, out...), nil
}

var registerOnce sync.Once

// TestUserCodec: a registered codec is written under its own header byte,
// read back by any cache in the process, and counted under its name.
func TestUserCodec(t *testing.T) {
	registerOnce.Do(func() {
		if err := codec.Register(snappyTest{}); err != nil {
			t.Fatal(err)
		}
	})
	_, rdb := single(t)
	ctx := ctxT(t)
	w := mustNew[Channel](t, rdb, packcache.WithCodec(snappyTest{}))
	want := makeChannel(4, 20_000)
	if err := w.Set(ctx, "custom", want); err != nil {
		t.Fatal(err)
	}
	if b := rawGet(t, rdb, "custom"); b[0] != 0x1d {
		t.Fatalf("stored with header %#x, want the user codec's 0x1d", b[0])
	}
	r := mustNew[Channel](t, rdb) // a reader configured for zstd
	if got, err := r.Get(ctx, "custom"); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("reader with other options: %v", err)
	}
	if n := w.Stats().Codecs["snappy-test"].Values; n != 1 {
		t.Fatalf("stats count %d values under snappy-test", n)
	}
}
