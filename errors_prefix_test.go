package packcache_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
)

// TestErrorsOnePrefix walks the kinds of error the cache returns, each
// made as an application meets it against a real redis-server, and
// checks that every line of its message begins with "packcache: " and
// holds it once (issue 24: "packcache: get "channel:6": packcache: redis
// failed: ..."), while it still matches its sentinel.
func TestErrorsOnePrefix(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	redistest.RequireReal(t, s, "stops the server")
	ctx := ctxT(t)
	type made struct {
		name  string
		err   error
		match func(error) bool
	}
	var all []made
	add := func(name string, err error, match func(error) bool) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error", name)
		}
		all = append(all, made{name, err, match})
	}

	c := mustNew[Channel](t, rdb, packcache.WithMaxValueSize(4<<10))
	_, err := c.Get(ctx, "absent")
	add("miss", err, is(packcache.ErrMiss))
	for key, v := range map[string]string{"bad-json": `{"id": 12`, "bad-header": "\x07what", "bad-zstd": "\x04not a frame"} {
		if err := rdb.Set(ctx, key, v, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	_, err = c.Get(ctx, "bad-json")
	add("serialization", err, is(packcache.ErrSerialization))
	_, err = c.Get(ctx, "bad-header")
	add("unknown header", err, is(packcache.ErrUnknownHeader))
	_, err = c.Get(ctx, "bad-zstd")
	add("corrupt", err, is(packcache.ErrCorrupt))
	add("too large", c.Set(ctx, "big", makeChannel(1, 64<<10)), is(packcache.ErrTooLarge))

	inner := mustNew[Channel](t, rdb)
	boom := errors.New("boom")
	var loading *packcache.Cache[Channel]
	loading = mustNew[Channel](t, rdb, packcache.WithLoadTimeout(100*time.Millisecond), packcache.WithPrefix("nf:", packcache.Policy{NegativeTTL: time.Minute}),
		packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
			switch key {
			case "timeout":
				<-ctx.Done()
				return Channel{}, ctx.Err()
			case "reentrant":
				return loading.Get(ctx, key)
			case "panic":
				panic(boom)
			case "nested":
				return inner.Get(ctx, "absent") // another cache's error, as the loader's
			case "nf:1":
				return Channel{}, packcache.ErrNotFound
			}
			return Channel{}, boom
		})))
	_, err = loading.Get(ctx, "timeout")
	add("load timeout", err, is(packcache.ErrLoadTimeout))
	_, err = loading.Get(ctx, "reentrant")
	add("reentrant", err, is(packcache.ErrReentrantLoad))
	_, err = loading.Get(ctx, "panic")
	add("panic", err, func(err error) bool { var pe *packcache.PanicError; return errors.As(err, &pe) })
	_, err = loading.Get(ctx, "nested")
	add("another cache's error from the loader", err, is(packcache.ErrMiss))
	_, err = loading.Get(ctx, "nf:1")
	add("not found", err, is(packcache.ErrNotFound))
	_, err = loading.Get(ctx, "other")
	add("loader error", err, is(boom))
	ptr := mustNew[*Channel](t, rdb, packcache.WithLoader(packcache.LoaderFunc[*Channel](func(context.Context, string) (*Channel, error) { return nil, nil })))
	_, err = ptr.Get(ctx, "nil")
	add("nil value", err, is(packcache.ErrNilValue))

	// Redis down: a refused connection opens the breaker, so the second
	// call does not try Redis; writes are kept for retry.
	down := mustNew[Channel](t, s.Client(t, func(o *redis.Options) { o.MaxRetries = -1 }), packcache.WithCircuitBreaker(1, time.Hour))
	if err := down.Set(ctx, "x", makeChannel(2, 100)); err != nil {
		t.Fatal(err)
	}
	s.Stop(t)
	_, err = down.Get(ctx, "x")
	add("redis", err, is(packcache.ErrRedis))
	_, err = down.Get(ctx, "x")
	add("circuit open", err, func(err error) bool {
		return errors.Is(err, packcache.ErrCircuitOpen) && errors.Is(err, packcache.ErrRedis)
	})
	add("pending", down.Delete(ctx, "x"), func(err error) bool {
		return errors.Is(err, packcache.ErrPending) && errors.Is(err, packcache.ErrRedis)
	})
	_, err = down.GetMany(ctx, []string{"x", "y"})
	add("GetMany, Redis down", err, is(packcache.ErrRedis))
	add("Close with invalidations pending", down.Close(), is(packcache.ErrRedis))
	_, err = down.Get(ctx, "x")
	add("closed", err, is(packcache.ErrClosed))

	for _, m := range all {
		msg := m.err.Error()
		t.Logf("%s: %s", m.name, msg)
		if !m.match(m.err) {
			t.Errorf("%s: %q does not match its kind", m.name, msg)
		}
		for line := range strings.Lines(msg) {
			if !strings.HasPrefix(line, "packcache: ") || strings.Count(line, "packcache:") != 1 {
				t.Errorf("%s: %q", m.name, strings.TrimSpace(line))
			}
		}
	}
}
