package owed

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// The retrier's tests run in a synctest bubble: its clock is fake, and
// moves only when every goroutine waits, so the spacing of the rounds is
// exact and no test waits on the wall clock.

// TestRetryLandsAfterSettle: with Redis answering, an owed key is sent
// twice: at once, and again SettleAfter after the first was answered;
// only the second lands it, and the Store is told once.
func TestRetryLandsAfterSettle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{fail: true}
		l := newLedger(t, f)
		start := time.Now()
		f.set(false, nil)
		fail(t, l, "k")
		time.Sleep(time.Second)
		if len(f.callsNow()) != 2 {
			t.Fatalf("%d DELs sent, want 2: %v", len(f.callsNow()), f.sent())
		}
		if at := f.callsNow()[0].at.Sub(start); at != 0 {
			t.Errorf("first DEL %v after the failure, want at once", at)
		}
		if gap := f.callsNow()[1].at.Sub(f.callsNow()[0].at); gap != SettleAfter {
			t.Errorf("second DEL %v after the first, want SettleAfter (%v)", gap, SettleAfter)
		}
		if s := l.Stats(); s != (Stats{Kept: 1, Applied: 1}) || l.Has("k") || f.landedNow() != 1 {
			t.Fatalf("Stats %+v, Has %v, Landed told %d times; want 1 kept and applied, once", s, l.Has("k"), f.landedNow())
		}
		l.Close()
	})
}

// TestRetryBacksOff: with Redis not answering, the rounds follow one
// another every backoff, and a key is never landed.
func TestRetryBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{fail: true}
		l := newLedger(t, f)
		fail(t, l, "k")
		time.Sleep(10*backoff + backoff/2)
		if gaps := gaps(f); !slices.Equal(gaps, slices.Repeat([]time.Duration{backoff}, 10)) {
			t.Fatalf("rounds after the first followed one another by %v, want 10 of %v", gaps, backoff)
		}
		if l.Len() != 1 || f.landedNow() != 0 {
			t.Fatalf("Len %d, Landed %d with Redis down", l.Len(), f.landedNow())
		}
		l.Close()
	})
}

// TestRetryExpires: a key whose old value Redis has expired anyway is
// dropped, counted Expired, and the Store told.
func TestRetryExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{fail: true, life: 3 * backoff}
		l := newLedger(t, f)
		fail(t, l, "k")
		time.Sleep(2 * backoff)
		if !l.Has("k") {
			t.Fatal("dropped before its time was up")
		}
		time.Sleep(3 * backoff) // the first round after its time is up drops it
		synctest.Wait()
		if s := l.Stats(); s != (Stats{Kept: 1, Expired: 1}) || f.landedNow() != 1 {
			t.Fatalf("Stats %+v, Landed %d; want 1 kept and expired, told once", s, f.landedNow())
		}
		l.Close()
	})
}

// TestRetryFollowsProbe: with the master hung, a round whose keys all ran
// elsewhere (a promoted replica) ends without waiting for the master, and
// the key lands SettleAfter later; with the probes running nothing, the
// next round follows ProbeEvery after one that nothing answered.
func TestRetryFollowsProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{fail: true}
		l := newLedger(t, f)
		hang := make(chan struct{}) // never closed: the master answers nothing
		f.set(false, hang)
		f.mu.Lock()
		f.probeOK = true
		f.mu.Unlock()
		start := time.Now()
		fail(t, l, "k")
		synctest.Wait()
		time.Sleep(SettleAfter)
		synctest.Wait()
		if s := l.Stats(); s.Applied != 1 || time.Since(start) != SettleAfter {
			t.Fatalf("Stats %+v %v after the failure; want it applied SettleAfter later, the master hung", s, time.Since(start))
		}
		l.Close()
	})
	synctest.Test(t, func(t *testing.T) {
		f := &probeNothing{}
		f.fail = true
		l := &Ledger{}
		l.Init(f, time.Second)
		fail(t, l, "k")
		time.Sleep(4*ProbeEvery + ProbeEvery/2)
		if gaps := gaps(&f.fakeStore); !slices.Equal(gaps, slices.Repeat([]time.Duration{ProbeEvery}, 4)) {
			t.Fatalf("with probes sent and nothing answering, rounds followed one another by %v, want 4 of %v", gaps, ProbeEvery)
		}
		l.Close()
	})
}

// probeNothing sends its probes, which run nothing.
type probeNothing struct{ fakeStore }

func (p *probeNothing) Probe(_ context.Context, _, _ []string, _ []bool) bool { return true }

// TestCloseLands: Close with Redis answering applies what is owed (the
// DEL and the one that confirms it) and reports nothing.
func TestCloseLands(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{fail: true}
		l := newLedger(t, f)
		fail(t, l, "a", "b")
		synctest.Wait()
		f.set(false, nil)
		if err := l.Close(); err != nil {
			t.Fatalf("Close with Redis answering: %v", err)
		}
		if s := l.Stats(); s != (Stats{Kept: 2, Applied: 2}) {
			t.Fatalf("Stats after Close %+v", s)
		}
	})
}

// TestCloseReports: Close with Redis down tries once more, then reports
// how many it could not apply, naming some; it calls the Store no more
// once it returns, and a second Close returns the same report.
func TestCloseReports(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{fail: true}
		l := newLedger(t, f)
		fail(t, l, "a", "b", "c", "d")
		synctest.Wait()
		n := len(f.sent())
		err := l.Close()
		if err == nil || !strings.HasPrefix(err.Error(), "4 pending invalidations not applied (") || !strings.Contains(err.Error(), ", ...)") {
			t.Fatalf("Close with Redis down: %v", err)
		}
		if got := len(f.sent()) - n; got != 1 {
			t.Fatalf("Close tried %d rounds with Redis down, want 1", got)
		}
		n = len(f.sent())
		time.Sleep(10 * backoff)
		if len(f.sent()) != n {
			t.Fatal("the Store was called after Close returned")
		}
		if again := l.Close(); !errors.Is(again, err) {
			t.Fatalf("second Close: %v, want the first's", again)
		}
	})
}

// TestCloseNothingOwed: Close of a Ledger that owed nothing returns nil
// without calling the Store.
func TestCloseNothingOwed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{}
		l := newLedger(t, f)
		if err := l.Close(); err != nil || len(f.callsNow()) != 0 {
			t.Fatalf("Close: %v, %d calls", err, len(f.callsNow()))
		}
	})
}

// gaps returns the time between each round f saw and the one before,
// leaving out the rounds at the very start: the retrier's first wake-up
// and its first timer may each start one.
func gaps(f *fakeStore) []time.Duration {
	calls := f.callsNow()
	var out []time.Duration
	for i := 1; i < len(calls); i++ {
		if gap := calls[i].at.Sub(calls[i-1].at); gap > 0 || len(out) > 0 {
			out = append(out, gap)
		}
	}
	return out
}
