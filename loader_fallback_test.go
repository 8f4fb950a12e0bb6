package packcache

// A table test of fallBack (loader.go), without Redis: what a caller gets
// when the load its read led to has ended.

import (
	"context"
	"errors"
	"testing"
)

// TestFallBack: a load that failed, for a caller whose read found a value
// past its TTL within StaleFor, gives that value, marked stale, and
// reports the load's error to the handler, unless the source said the key
// is gone (ErrNotFound) or the caller's context has ended; in every other
// case the caller gets the load's own outcome, and nothing is reported.
func TestFallBack(t *testing.T) {
	t.Parallel()
	c, errs := unitCache(t)
	old := &unitDoc{ID: "old"}
	loaded := result{val: &unitDoc{ID: "loaded"}, from: fromLoader}
	failed := keyErr("load", "k", errors.New("database down"))
	notFound := keyErr("load", "k", ErrNotFound)
	live := context.Background()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name  string
		ctx   context.Context
		from  verdict // what the caller's read found
		r     result  // the load's outcome
		err   error
		stale bool // the caller gets the stale value
	}{
		{"stale, load worked", live, vStale, loaded, nil, false},
		{"stale, load failed", live, vStale, result{}, failed, true},
		{"stale, load timed out", live, vStale, result{}, keyErr("load", "k", context.DeadlineExceeded), true},
		{"stale, not found at the source", live, vStale, result{}, notFound, false},
		{"stale, the caller gave up", ended, vStale, result{}, failed, false},
		{"absent, load failed", live, vMiss, result{}, failed, false},
		{"another's lease, load failed", live, vLease, result{}, failed, false},
		{"undecodable, load failed", live, vUndecodable, result{}, failed, false},
		{"Redis down, load failed", live, vUnavailable, result{}, failed, false},
		{"invalidated group, load failed", live, vInvalid, result{}, failed, false},
		{"owed, load failed", live, vOwed, result{}, failed, false},
		{"value due for refresh, load failed", live, vHit, result{}, failed, false},
	} {
		errs.Store(0)
		j := judgement{v: tc.from}
		if tc.from == vStale || tc.from == vHit {
			j.r = result{val: old}
		}
		r, err := c.fallBack(tc.ctx, "k", j, tc.r, tc.err)
		switch {
		case tc.stale:
			if err != nil || r.val != old || !r.stale {
				t.Errorf("%s: %v, %v (stale %v); want the stale value, marked stale", tc.name, r.val, err, r.stale)
			}
			if n := errs.Load(); n != 1 {
				t.Errorf("%s: the load's error reported %d times, want 1", tc.name, n)
			}
		default:
			if err != tc.err || r.val != tc.r.val || r.stale {
				t.Errorf("%s: %v, %v (stale %v); want the load's outcome %v, %v", tc.name, r.val, err, r.stale, tc.r.val, tc.err)
			}
			if n := errs.Load(); n != 0 {
				t.Errorf("%s: %d errors reported, want none (the caller gets the error)", tc.name, n)
			}
		}
	}
}
