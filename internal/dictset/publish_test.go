package dictset

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// writer returns the Writer of a new set for d.
func writer(t testing.TB, d *codec.Dictionary) *Writer {
	t.Helper()
	var s Set
	w, _, err := s.Writer(d.Bytes(), codec.Zstd)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestPublished: the first write with a dictionary stores it under its
// key with no expiry, once; a key that held something else, or had an
// expiry, is put right; later writes do not publish again.
func TestPublished(t *testing.T) {
	t.Parallel()
	srv, r := newClient(t)
	redistest.RequireReal(t, srv, "counts commands with INFO commandstats")
	ctx := context.Background()
	d := trained(t, 31)
	key := codec.DictionaryKey(d.ID())
	for _, before := range []string{"", "junk", "expiring"} {
		t.Run("key "+cmpOr(before, "absent"), func(t *testing.T) {
			r.rdb.Del(ctx, key)
			switch before {
			case "junk":
				r.rdb.Set(ctx, key, "not a dictionary", 0)
			case "expiring":
				r.rdb.Set(ctx, key, d.Bytes(), time.Hour)
			}
			w := writer(t, d)
			srv.ResetStats(t)
			publish := func() {
				t.Helper()
				if ok, err := w.Published(ctx, r); !ok || err != nil {
					t.Fatalf("Published: %v, %v", ok, err)
				}
			}
			for range 50 {
				publish()
			}
			scripts := func() int64 { return srv.CommandCount(t, "evalsha") + srv.CommandCount(t, "eval") }
			if n := scripts(); n < 1 || n > 2 { // EVALSHA, and EVAL if the script is new to the server
				t.Errorf("50 writes ran %d scripts, want the one publication", n)
			}
			if got, _ := r.rdb.Get(ctx, key).Bytes(); !bytes.Equal(got, d.Bytes()) {
				t.Errorf("%s holds %d bytes, not the dictionary", key, len(got))
			}
			if ttl := r.rdb.PTTL(ctx, key).Val(); ttl != -1 {
				t.Errorf("%s has a TTL of %v, want none", key, ttl)
			}
			srv.ResetStats(t)
			for range 50 {
				publish()
			}
			if n := scripts(); n != 0 {
				t.Errorf("50 more writes ran %d scripts, want none", n)
			}
		})
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// TestPublishedConcurrently: writes that come while the first publishes
// wait for it, and none publishes again.
func TestPublishedConcurrently(t *testing.T) {
	t.Parallel()
	_, r := newClient(t)
	w := writer(t, trained(t, 33))
	var wg sync.WaitGroup
	oks := make([]bool, 50)
	errs := make([]error, len(oks))
	for i := range oks {
		wg.Go(func() { oks[i], errs[i] = w.Published(context.Background(), r) })
	}
	wg.Wait()
	for i := range oks {
		if !oks[i] || errs[i] != nil {
			t.Fatalf("write %d: %v, %v; want published", i, oks[i], errs[i])
		}
	}
	if n := r.scripts.Load(); n != 1 {
		t.Errorf("50 concurrent writes published %d times, want 1", n)
	}
}

// TestPublishFails: a writer that cannot publish its dictionary is told
// to store without it and given the error, naming the key; for a second
// its writes do not try again (and are stored without it); then one
// publishes it.
func TestPublishFails(t *testing.T) {
	t.Parallel()
	srv, admin := newClient(t)
	redistest.RequireReal(t, srv, "ACL key permissions")
	ctx := context.Background()
	// A user that may write p:* but not the dictionary's key.
	if err := admin.rdb.Do(ctx, "ACL", "SETUSER", "writer", "on", ">pw", "+@all", "%R~*", "%W~p:*").Err(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "writer", Password: "pw", ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	r := &client{rdb: rdb}
	d := trained(t, 41)
	key := codec.DictionaryKey(d.ID())
	w := writer(t, d)

	ok, err := w.Published(ctx, r)
	if ok || err == nil || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "stored without it") || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("Published without permission: %v, %v; want false and the failure, naming %s", ok, err, key)
	}
	for range 20 {
		if ok, err := w.Published(ctx, r); ok || err != nil {
			t.Fatalf("Published within the second after a failure: %v, %v; want false, nothing to report", ok, err)
		}
	}
	if n := r.scripts.Load(); n != 1 {
		t.Errorf("21 writes tried to publish %d times, want 1: a failure is waited out", n)
	}

	if err := admin.rdb.Do(ctx, "ACL", "SETUSER", "writer", "allkeys").Err(); err != nil {
		t.Fatal(err)
	}
	w.failed.Add(-int64(retryAfter)) // the second has passed
	if ok, err := w.Published(ctx, r); !ok || err != nil {
		t.Fatalf("Published once allowed: %v, %v", ok, err)
	}
	if got, _ := admin.rdb.Get(ctx, key).Bytes(); !bytes.Equal(got, d.Bytes()) {
		t.Fatalf("%s holds %d bytes, not the dictionary", key, len(got))
	}
}

// TestPublishCancelled: a publication the caller's context ended is not a
// Redis failure: the next write tries again at once.
func TestPublishCancelled(t *testing.T) {
	t.Parallel()
	_, r := newClient(t)
	w := writer(t, trained(t, 43))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if ok, err := w.Published(ctx, r); ok || !errors.Is(err, context.Canceled) {
		t.Fatalf("Published under a cancelled context: %v, %v", ok, err)
	}
	if ok, err := w.Published(context.Background(), r); !ok || err != nil {
		t.Fatalf("Published after: %v, %v; want published", ok, err)
	}
}

// TestRepublished: a minute after its publication a write publishes the
// dictionary again, putting back a key deleted meanwhile; if that fails,
// the writes still use the dictionary (readers that fetched it keep it)
// and the error says it was a publication again.
func TestRepublished(t *testing.T) {
	t.Parallel()
	_, r := newClient(t)
	ctx := context.Background()
	d := trained(t, 45)
	key := codec.DictionaryKey(d.ID())
	w := writer(t, d)
	if ok, err := w.Published(ctx, r); !ok || err != nil {
		t.Fatal(ok, err)
	}
	r.rdb.Del(ctx, key)
	w.published.Add(-int64(republishEvery)) // a minute has passed
	if ok, err := w.Published(ctx, r); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if n := r.rdb.Exists(ctx, key).Val(); n != 1 || r.scripts.Load() != 2 {
		t.Fatalf("after a minute: %s exists %d, %d publications; want it back, and 2", key, n, r.scripts.Load())
	}

	w.published.Add(-int64(republishEvery))
	f := &stub{err: errors.New("READONLY You can't write against a read only replica.")}
	if ok, err := w.Published(ctx, f); !ok || err == nil || !strings.Contains(err.Error(), "again") {
		t.Fatalf("a publication again that failed: %v, %v; want true and the failure", ok, err)
	}
	if ok, err := w.Published(ctx, f); !ok || err != nil {
		t.Fatalf("within the second after: %v, %v; want true, nothing to report", ok, err)
	}
}

// TestLost: a write that found Redis without the dictionary has it
// published again at once, with no expiry; before the first publication
// Lost publishes nothing; a publication again that Redis failed is
// waited out for a second, the writes using the dictionary meanwhile,
// and then the next write publishes it.
func TestLost(t *testing.T) {
	t.Parallel()
	_, r := newClient(t)
	ctx := context.Background()
	d := trained(t, 47)
	key := codec.DictionaryKey(d.ID())
	w := writer(t, d)
	if w.Key() != key {
		t.Fatalf("Key() = %q, want %q", w.Key(), key)
	}
	if err := w.Lost(ctx, r); err != nil || r.scripts.Load() != 0 || r.rdb.Exists(ctx, key).Val() != 0 {
		t.Fatalf("Lost before the first publication: %v, %d publications; want nothing done", err, r.scripts.Load())
	}
	if ok, err := w.Published(ctx, r); !ok || err != nil {
		t.Fatal(ok, err)
	}
	for i := range 3 {
		r.rdb.Del(ctx, key)
		if err := w.Lost(ctx, r); err != nil {
			t.Fatalf("Lost %d: %v", i, err)
		}
		if got, _ := r.rdb.Get(ctx, key).Bytes(); !bytes.Equal(got, d.Bytes()) || r.rdb.PTTL(ctx, key).Val() != -1 {
			t.Fatalf("after Lost %d: %s holds %d bytes (TTL %v), want the dictionary with no expiry", i, key, len(got), r.rdb.PTTL(ctx, key).Val())
		}
		if n := r.scripts.Load(); n != int64(2+i) {
			t.Fatalf("after Lost %d: %d publications, want %d", i, n, 2+i)
		}
	}
	if ok, err := w.Published(ctx, r); !ok || err != nil || r.scripts.Load() != 4 {
		t.Fatalf("a write after Lost put it back: %v, %v, %d publications; want true and none more", ok, err, r.scripts.Load())
	}

	r.rdb.Del(ctx, key)
	f := &stub{err: errors.New("READONLY You can't write against a read only replica.")}
	if err := w.Lost(ctx, f); err == nil || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "again") {
		t.Fatalf("Lost while Redis fails: %v; want the failure, naming %s", err, key)
	}
	for range 5 {
		if err := w.Lost(ctx, r); err != nil {
			t.Fatal(err)
		}
		if ok, err := w.Published(ctx, r); !ok || err != nil {
			t.Fatalf("within the second after the failure: %v, %v; want true, nothing to report", ok, err)
		}
	}
	if n := r.scripts.Load(); n != 4 {
		t.Errorf("within the second after the failure: %d publications, want none more", n-4)
	}
	w.failed.Add(-int64(retryAfter)) // the second has passed
	if ok, err := w.Published(ctx, r); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if n := r.rdb.Exists(ctx, key).Val(); n != 1 || r.scripts.Load() != 5 {
		t.Fatalf("the next write after the second: %s exists %d, %d publications; want it back, 5", key, n, r.scripts.Load())
	}
}

// TestCheckedEverySecond: a writer whose writes never learn that Redis
// lost the dictionary (SetMany, loads, another node's keys) asks Redis
// once a second, with a one-byte GETRANGE, whether it holds it, and
// publishes it again on the write that finds it missing; within the
// second, writes ask nothing.
func TestCheckedEverySecond(t *testing.T) {
	t.Parallel()
	_, r := newClient(t)
	ctx := context.Background()
	d := trained(t, 3)
	w := writer(t, d)
	if ok, err := w.Published(ctx, r); !ok || err != nil {
		t.Fatal(ok, err)
	}
	r.rdb.Del(ctx, w.Key())
	for range 20 {
		if ok, err := w.Published(ctx, r); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if n, m := r.getRanges.Load(), r.scripts.Load(); n != 0 || m != 1 {
		t.Fatalf("within the second of the publication: %d checks, %d publications; want 0 and 1", n, m)
	}
	w.checked.Add(-int64(checkEvery)) // the second has passed
	for range 20 {
		if ok, err := w.Published(ctx, r); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if n, m := r.getRanges.Load(), r.scripts.Load(); n != 1 || m != 2 {
		t.Fatalf("after the second: %d checks, %d publications; want 1 and 2", n, m)
	}
	if got, _ := r.rdb.Get(ctx, w.Key()).Bytes(); !bytes.Equal(got, d.Bytes()) {
		t.Fatalf("the check did not put the dictionary back: %d bytes", len(got))
	}
	w.checked.Add(-int64(checkEvery))
	if ok, err := w.Published(ctx, r); !ok || err != nil || r.getRanges.Load() != 2 || r.scripts.Load() != 2 {
		t.Fatalf("a check that finds it held: %v, %v, %d checks, %d publications; want 2 and 2", ok, err, r.getRanges.Load(), r.scripts.Load())
	}
}
