package owed

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/internal/redistest"
)

// errDown is the fake Redis failure a fakeStore owes; any other error is
// the caller's own.
var errDown = errors.New("redis down")

// A fakeStore is a Store with no Redis: its Invalidate answers, fails or
// hangs as the test says, and it records what the Ledger asked of it.
type fakeStore struct {
	mu      sync.Mutex
	fail    bool          // Invalidate fails every key
	hang    chan struct{} // non-nil: Invalidate waits for it to close, or for its context
	probeOK bool          // Probe sends, and runs every key
	life    time.Duration // Owes: how long the old value may live; 0 forever

	calls   []call // Invalidate's, in order
	probes  int
	landed  int
	pending []pendingCall
}

type call struct {
	at          time.Time
	keys, keeps []string
}

type pendingCall struct {
	key  string
	kept bool
	n    int
}

func (f *fakeStore) Invalidate(ctx context.Context, keys, keeps []string) []error {
	f.mu.Lock()
	f.calls = append(f.calls, call{time.Now(), slices.Clone(keys), slices.Clone(keeps)})
	fail, hang := f.fail, f.hang
	f.mu.Unlock()
	errs := make([]error, len(keys))
	if hang != nil {
		select {
		case <-hang:
		case <-ctx.Done():
			fail = true
		}
	}
	if fail {
		for i := range errs {
			errs[i] = errDown
		}
	}
	return errs
}

func (f *fakeStore) Probe(ctx context.Context, keys, keeps []string, ran []bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.probeOK {
		return false
	}
	f.probes++
	for i := range ran {
		ran[i] = true
	}
	return true
}

func (f *fakeStore) Owes(key string, ttl time.Duration, err error) (time.Time, bool) {
	if !errors.Is(err, errDown) {
		return time.Time{}, false
	}
	if f.life == 0 {
		return time.Time{}, true
	}
	return time.Now().Add(f.life), true
}

func (f *fakeStore) Pending(op, key string, err error, kept bool, n int) error {
	f.mu.Lock()
	f.pending = append(f.pending, pendingCall{key, kept, n})
	f.mu.Unlock()
	return fmt.Errorf("%s: %w (kept %v)", op, err, kept) // not the key: some are megabytes
}

func (f *fakeStore) Landed() {
	f.mu.Lock()
	f.landed++
	f.mu.Unlock()
}

// sent returns the keys of each Invalidate call so far.
func (f *fakeStore) sent() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out [][]string
	for _, c := range f.calls {
		out = append(out, c.keys)
	}
	return out
}

func (f *fakeStore) callsNow() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *fakeStore) pendingNow() []pendingCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.pending)
}

func (f *fakeStore) landedNow() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.landed
}

func (f *fakeStore) set(fail bool, hang chan struct{}) {
	f.mu.Lock()
	f.fail, f.hang = fail, hang
	f.mu.Unlock()
}

func newLedger(t *testing.T, f *fakeStore) *Ledger {
	t.Helper()
	l := &Ledger{}
	l.Init(f, time.Second)
	t.Cleanup(func() { l.Close() }) // in the bubble: its goroutine ends with it
	return l
}

// fail owes keys by a deletion of them that fails on errDown.
func fail(t *testing.T, l *Ledger, keys ...string) {
	t.Helper()
	errs := l.Write(context.Background(), &Write{Op: "delete", Keys: keys}, func() []error {
		errs := make([]error, len(keys))
		for i := range errs {
			errs[i] = errDown
		}
		return errs
	})
	for i, err := range errs {
		if !errors.Is(err, errDown) || !strings.Contains(err.Error(), "kept true") {
			t.Fatalf("the failed write of %s: %v, want the Store's pending error", keys[i], err)
		}
	}
}

// TestWriteNotOwed: a write that succeeds, or fails on an error the Store
// does not owe (the caller's context), owes nothing and is returned as
// send gave it; nothing is retried.
func TestWriteNotOwed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{}
		l := newLedger(t, f)
		errs := l.Write(context.Background(), &Write{Op: "set", Keys: []string{"a", "b"}, Stored: [][]byte{[]byte("1"), []byte("2")}}, func() []error {
			return []error{nil, context.Canceled}
		})
		if errs[0] != nil || errs[1] != context.Canceled {
			t.Fatalf("Write returned %v, want [nil, context.Canceled] as sent", errs)
		}
		if l.Has("a") || l.Has("b") || l.Len() != 0 || len(f.pendingNow()) != 0 {
			t.Fatalf("a write not owed was kept: Len %d, Pending calls %v", l.Len(), f.pendingNow())
		}
		if err := l.Close(); err != nil {
			t.Fatalf("Close with nothing owed: %v", err)
		}
		if len(f.callsNow()) != 0 {
			t.Fatalf("Invalidate called %d times with nothing owed", len(f.callsNow()))
		}
	})
}

// TestWriteOwes: a write that fails on a failure the Store owes is kept,
// its error is the Store's Pending error, and the key is retried at once.
func TestWriteOwes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{fail: true}
		l := newLedger(t, f)
		fail(t, l, "a", "b")
		if !l.Has("a") || !l.Has("b") || l.Has("c") || l.Len() != 2 {
			t.Fatalf("Has a %v, b %v, c %v, Len %d; want true, true, false, 2", l.Has("a"), l.Has("b"), l.Has("c"), l.Len())
		}
		if want := []pendingCall{{"a", true, 0}, {"b", true, 0}}; !slices.Equal(f.pendingNow(), want) {
			t.Fatalf("Pending calls %v, want %v", f.pendingNow(), want)
		}
		synctest.Wait()
		// At once: in the rounds sent before any time passes. (The
		// retrier wakes when a is owed, and may send a round before b is:
		// then b goes in the next, at the same instant.)
		has := func(k string) func([]string) bool {
			return func(keys []string) bool { return slices.Contains(keys, k) }
		}
		if got := f.sent(); !slices.ContainsFunc(got, has("a")) || !slices.ContainsFunc(got, has("b")) {
			t.Fatalf("Invalidate calls %v right after the failure, want a and b retried at once", got)
		}
		if s := l.Stats(); s != (Stats{Owed: 2, Kept: 2}) {
			t.Fatalf("Stats %+v", s)
		}
		// A key owed already is not kept twice.
		fail(t, l, "a")
		if s := l.Stats(); s != (Stats{Owed: 2, Kept: 2}) {
			t.Fatalf("Stats after a second failure of a: %+v", s)
		}
		l.Close()
	})
}

// TestWriteBound: past MaxBytes a failed write is not kept: the Store is
// told so with the number owed, and Dropped counts it.
func TestWriteBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{fail: true}
		l := newLedger(t, f)
		big := strings.Repeat("k", 8<<20)
		fits := MaxBytes / (len(big) + 1 + Overhead)
		for i := range fits {
			fail(t, l, fmt.Sprint(i, big))
		}
		over := fmt.Sprint("over", big)
		errs := l.Write(context.Background(), &Write{Op: "delete", Keys: []string{over}}, func() []error { return []error{errDown} })
		if !strings.Contains(errs[0].Error(), "kept false") {
			t.Fatalf("the write past the bound: %.80v, want not kept", errs[0])
		}
		if last := f.pendingNow()[len(f.pendingNow())-1]; last != (pendingCall{over, false, fits}) {
			t.Fatalf("Pending told %v, %d; want not kept, %d owed", last.kept, last.n, fits)
		}
		if s := l.Stats(); s.Owed != fits || s.Dropped != 1 || l.Has(over) {
			t.Fatalf("Stats %+v, Has(over) %v; want %d owed, 1 dropped", s, l.Has(over), fits)
		}
		f.set(false, nil) // Close lands them, and names none
		l.Close()
	})
}

// TestWriteWaitsForRetry: a write of a key whose retry is in flight is not
// sent until the retry has ended.
func TestWriteWaitsForRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{fail: true}
		l := newLedger(t, f)
		hang := make(chan struct{})
		f.set(false, hang)
		fail(t, l, "k")
		synctest.Wait() // the retry of k is in Invalidate, hung
		var sent bool
		done := make(chan struct{})
		go func() {
			defer close(done)
			l.Write(context.Background(), &Write{Op: "set", Keys: []string{"k"}, Stored: [][]byte{[]byte("v")}}, func() []error {
				sent = true
				return []error{nil}
			})
		}()
		synctest.Wait()
		if sent {
			t.Fatal("the write was sent while the retry of its key was in flight")
		}
		close(hang)
		<-done
		if !sent {
			t.Fatal("the write was not sent once the retry ended")
		}
		l.Close()
	})
}

// TestNoRetryDuringWrite: while a write of an owed key is under way, no
// retry of the key starts; other owed keys are retried meanwhile.
func TestNoRetryDuringWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{fail: true}
		l := newLedger(t, f)
		fail(t, l, "k", "other")
		synctest.Wait()
		before := len(f.sent())
		release := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			l.Write(context.Background(), &Write{Op: "set", Keys: []string{"k"}}, func() []error {
				<-release
				return []error{errDown}
			})
		}()
		synctest.Wait()
		time.Sleep(10 * backoff) // the fake clock: rounds every backoff
		for _, keys := range f.sent()[before:] {
			if slices.Contains(keys, "k") {
				t.Fatalf("k was retried while a write of it was under way: %v", f.sent())
			}
		}
		if n := len(f.sent()) - before; n < 9 {
			t.Fatalf("%d rounds in 10 backoffs retried the other key, want about 10", n)
		}
		// Counted before the write ends: the failure wakes the retrier,
		// which may send its round before <-done returns. Then half a
		// backoff more than the next round needs, so that the round is
		// not due at the very instant of this goroutine's wake-up, whose
		// order with it synctest leaves open (CI failed so: the next
		// round was due at that instant, and none was counted).
		n := len(f.sent())
		close(release)
		<-done
		time.Sleep(backoff + backoff/2)
		if got := f.sent(); !slices.ContainsFunc(got[n:], func(keys []string) bool { return slices.Contains(keys, "k") }) {
			t.Fatalf("k not retried once its write failed: %v", got[n:])
		}
		l.Close()
	})
}

// TestWriteSparesStored: the retry of a key written successfully since it
// was owed spares exactly the bytes that write stored (nothing for a
// deletion), and a failure after it spares nothing again.
func TestWriteSparesStored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{fail: true}
		l := newLedger(t, f)
		fail(t, l, "set", "del")
		synctest.Wait()
		l.Write(context.Background(), &Write{Op: "set", Keys: []string{"set"}, Stored: [][]byte{[]byte("v2")}}, func() []error { return []error{nil} })
		l.Write(context.Background(), &Write{Op: "delete", Keys: []string{"del"}}, func() []error { return []error{nil} })
		n := len(f.callsNow())
		time.Sleep(SettleAfter + backoff)
		sum := sha1.Sum([]byte("v2"))
		keeps := map[string]string{}
		for _, c := range f.callsNow()[n:] {
			for i, k := range c.keys {
				keeps[k] = c.keeps[i]
			}
		}
		if want := map[string]string{"set": hex.EncodeToString(sum[:]), "del": ""}; !maps.Equal(keeps, want) {
			t.Fatalf("retries spared %v, want %v", keeps, want)
		}
		fail(t, l, "set")
		l.mu.Lock()
		keep, answered := l.keys["set"].keep, l.keys["set"].answered
		l.mu.Unlock()
		if keep != "" || !answered.IsZero() {
			t.Fatalf("after a newer failure the key spares %q, answered %v; want nothing, never", keep, answered)
		}
		l.Close()
	})
}

// TestWriteCancelledWhileWaiting: a write whose context ends while it
// waits for a retry is sent at once (it fails on its context), and holds
// nothing.
func TestWriteCancelledWhileWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{}
		l := newLedger(t, f)
		hang := make(chan struct{})
		f.set(true, hang)
		fail(t, l, "k")
		synctest.Wait()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			l.Write(ctx, &Write{Op: "set", Keys: []string{"k"}}, func() []error { return []error{context.Canceled} })
		}()
		synctest.Wait()
		cancel()
		<-done
		l.mu.Lock()
		writes := l.keys["k"].writes
		l.mu.Unlock()
		if writes != 0 {
			t.Fatalf("a cancelled write left %d writes held", writes)
		}
		close(hang)
		l.Close()
	})
}

// TestScript: against a real Redis, Script deletes a key unless it holds
// the bytes whose SHA-1 it is given, and a Ledger over a real client lands
// its invalidations so: the write that succeeded stands, a late landing
// of an older one is deleted.
func TestScript(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rdb := s.Client(t)
	ctx := context.Background()
	st := &redisStore{rdb: rdb}
	l := &Ledger{}
	l.Init(st, time.Second)
	for _, k := range []string{"stands", "late", "deleted"} {
		rdb.Set(ctx, k, "old", 0)
	}
	// Each write fails: Redis may hold what it meant to replace.
	l.Write(ctx, &Write{Op: "set", Keys: []string{"stands", "late"}, Stored: [][]byte{[]byte("v1"), []byte("v1")}}, func() []error {
		return []error{errDown, errDown}
	})
	l.Write(ctx, &Write{Op: "delete", Keys: []string{"deleted"}}, func() []error { return []error{errDown} })
	// Then a write of two of them succeeds.
	l.Write(ctx, &Write{Op: "set", Keys: []string{"stands", "late"}, Stored: [][]byte{[]byte("v2"), []byte("v2")}}, func() []error {
		return []error{rdb.Set(ctx, "stands", "v2", 0).Err(), rdb.Set(ctx, "late", "v2", 0).Err()}
	})
	rdb.Set(ctx, "late", "v1", 0) // the failed write lands late
	if err := l.Close(); err != nil {
		t.Fatalf("Close with Redis answering: %v", err)
	}
	if got := rdb.Get(ctx, "stands").Val(); got != "v2" {
		t.Errorf("the write that succeeded: Redis holds %q, want v2", got)
	}
	for _, k := range []string{"late", "deleted"} {
		if n := rdb.Exists(ctx, k).Val(); n != 0 {
			t.Errorf("%s: Redis still holds %q", k, rdb.Get(ctx, k).Val())
		}
	}
	if s := l.Stats(); s.Applied != 3 || s.Owed != 0 {
		t.Errorf("Stats %+v, want 3 applied", s)
	}
}

// redisStore is a Store over a client of one node.
type redisStore struct {
	fakeStore
	rdb *redis.Client
}

func (s *redisStore) Invalidate(ctx context.Context, keys, keeps []string) []error {
	errs := make([]error, len(keys))
	for i, k := range keys {
		errs[i] = Script.Run(ctx, s.rdb, []string{k}, keeps[i]).Err()
		if errors.Is(errs[i], redis.Nil) {
			errs[i] = nil
		}
	}
	return errs
}
