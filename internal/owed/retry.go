package owed

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// retry retries the owed invalidations until Close.
func (l *Ledger) retry() {
	defer close(l.done)
	wait := time.NewTimer(0)
	defer wait.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-l.wake:
		case <-wait.C:
		}
		if l.Len() == 0 {
			continue // woken for keys already landed; wait for the next
		}
		_, next := l.retryRound(context.Background())
		wait.Reset(next)
	}
}

// retryRound sends one round of owed DELs and returns how many landed and
// how soon the next round is due.
func (l *Ledger) retryRound(ctx context.Context) (landed int, next time.Duration) {
	now := time.Now()
	var keys, keeps []string
	expired := 0
	l.mu.Lock()
	for k, s := range l.keys {
		if !s.until.IsZero() && now.After(s.until) {
			l.land(k, &l.expired)
			expired++
			continue
		}
		if s.writes > 0 || !s.answered.IsZero() && now.Sub(s.answered) < SettleAfter {
			continue // a write of it is in flight, or its confirming DEL is not due yet
		}
		s.retrying = true
		keys, keeps = append(keys, k), append(keeps, s.keep)
		if len(keys) == roundKeys {
			break
		}
	}
	round := make(chan struct{})
	l.round = round
	l.mu.Unlock()
	defer close(round)
	if expired > 0 {
		l.store.Landed()
	}
	if len(keys) == 0 {
		return 0, SettleAfter
	}
	sent := time.Now()
	// Other nodes are tried alongside (the Store's Probe): on a Cluster, a
	// promoted replica runs the DEL while the client's map still names a
	// hung master. Once every key ran elsewhere, the master's call is
	// given up (its context's end is not a failure of Redis's).
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var ran []bool
	var elsewhere bool
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Go(func() { ran, elsewhere = l.retryElsewhere(ctx, keys, keeps, done, cancel) })
	errs := l.store.Invalidate(mctx, keys, keeps)
	close(done)
	wg.Wait()
	for i, r := range ran {
		if r {
			errs[i] = nil
		}
	}
	answered := time.Now()
	settling := 0
	l.mu.Lock()
	for i, k := range keys {
		s, ok := l.keys[k]
		if !ok {
			continue
		}
		s.retrying = false
		if errs[i] != nil {
			continue
		}
		if !s.answered.IsZero() && sent.Sub(s.answered) >= SettleAfter {
			l.land(k, &l.applied)
			landed++
			continue
		}
		s.answered = answered
		settling++
	}
	l.mu.Unlock()
	switch {
	case landed+settling == 0 && elsewhere:
		next = ProbeEvery // no master answered: a replica may be promoted any moment
	case landed+settling == 0:
		next = backoff // Redis did not answer
	case len(keys) == roundKeys || settling == 0:
		next = 0 // Redis answers: the keys still waiting go at once
	default:
		next = SettleAfter
	}
	if landed > 0 {
		l.store.Landed()
	}
	return landed, next
}

// retryElsewhere has the Store probe other nodes for the owed DELs of
// keys (keeps[i] is key i's spared SHA-1), every ProbeEvery, until each
// has run on a node that owns its slot, or the master's round ends (done
// closes), or ctx ends. It reports which keys ran, and whether any probe
// was sent. Once every key has run, it calls all: the round need not
// wait for a hung master.
func (l *Ledger) retryElsewhere(ctx context.Context, keys, keeps []string, done <-chan struct{}, all context.CancelFunc) (ran []bool, sent bool) {
	ran = make([]bool, len(keys))
	tick := time.NewTicker(ProbeEvery)
	defer tick.Stop()
	for {
		if l.store.Probe(ctx, keys, keeps, ran) {
			sent = true
		} else if !sent {
			return ran, sent
		}
		if !slices.Contains(ran, false) {
			all()
			return ran, sent
		}
		select {
		case <-done:
			return ran, sent
		case <-ctx.Done():
			return ran, sent
		case <-tick.C:
		}
	}
}

// land forgets the owed key k, counting it in n. l.mu must be held.
func (l *Ledger) land(k string, n *atomic.Uint64) {
	delete(l.keys, k)
	l.bytes -= len(k) + Overhead
	l.n.Add(-1)
	n.Add(1)
}

// Close stops the retries, tries the owed invalidations once more within
// the Store's budget plus two settlings (a DEL, then the one that
// confirms it), and returns an error naming how many it could not apply,
// or nil when none is left. It returns once no round is in flight and the
// Store is no longer called. Only the first call does so; later calls
// wait for it and return its result.
func (l *Ledger) Close() error {
	l.closeOnce.Do(func() {
		close(l.stop)
		l.once.Do(func() { close(l.done) }) // the goroutine never started
		<-l.done
		ctx, cancel := context.WithTimeout(context.Background(), l.budget+2*SettleAfter)
		defer cancel()
		for l.Len() > 0 && ctx.Err() == nil {
			_, next := l.retryRound(ctx)
			if next == backoff {
				break // Redis did not answer
			}
			t := time.NewTimer(next)
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
		}
		n := l.Len()
		if n == 0 {
			return
		}
		l.mu.Lock()
		var some []string
		for k := range l.keys {
			some = append(some, strconv.Quote(k))
			if len(some) == 3 {
				break
			}
		}
		l.mu.Unlock()
		if n > len(some) {
			some = append(some, "...")
		}
		l.closeErr = fmt.Errorf("%d pending invalidations not applied (%s): Redis may hold the values their writes replaced until their TTLs end",
			n, strings.Join(some, ", "))
	})
	return l.closeErr
}
