// Package owed keeps the invalidations a cache owes Redis, and orders them
// with the cache's writes.
//
// When a Delete, or the store of a Set, fails on a Redis failure (a
// refused connection, a timeout, an open breaker; never the caller's own
// context), Redis may still hold the value the write meant to replace.
// The cache then owes Redis an invalidation of the key: a Ledger keeps it
// until it lands. What a caller can rely on:
//
//   - A goroutine of the Ledger's retries every owed key as a DEL, never
//     as a late write, so a newer write cannot be replaced by it. It
//     tries regardless of the node's circuit breaker (it is the breaker's
//     probe, in effect), one round at a time, each within the Store's
//     Redis budget; a DEL written to a stopped Redis runs when it resumes.
//   - A DEL counts as landed only when it was sent at least SettleAfter
//     after an earlier DEL of the key had been answered: a command written
//     to a stopped server before it stopped (this process's timed-out Set
//     of the key, say) runs when the server resumes, possibly after the
//     first DEL, but not after one sent once the server was seen
//     answering.
//   - A write of an owed key and the key's retry never overlap: Write
//     waits for a retry in flight to end, and no retry starts while the
//     write is under way. A write that succeeds stands: the DEL spares
//     exactly the bytes it stored (see Script), so only an older write
//     landing late is deleted.
//   - An owed key whose time is up (when Redis has expired whatever the
//     write meant to replace, as the Store says) is dropped.
//   - Until it lands, Has reports the key: the cache must not trust what
//     Redis holds for it.
//   - The owed keys are bounded by MaxBytes (key bytes plus Overhead
//     each); past the bound a failed write is not kept, and the Store is
//     told so.
//   - On a Cluster, each round also asks the Store to Probe other nodes
//     for the keys whose master has not answered, every ProbeEvery: when
//     a hung master's replica is promoted, the DEL runs there about
//     ProbeEvery later, whatever the client's map of the slots still says.
//
// Limits: another process may read the old value from Redis between the
// moment Redis answers again (a resumed server, or a promoted replica) and
// the moment the DEL runs there (about SettleAfter); and invalidations
// owed by a process that dies are lost with it.
//
// A Ledger makes no Redis call of its own: its Store does them, and
// decides what a failed write means and what its caller is told.
package owed

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// MaxBytes bounds the memory the owed invalidations take.
	MaxBytes = 32 << 20
	// Overhead is what one owed key costs besides its bytes: the map
	// entry, the string header and its state.
	Overhead = 112
	// SettleAfter is how long after a DEL was answered a second DEL must
	// be sent to count as landed.
	SettleAfter = 100 * time.Millisecond
	// ProbeEvery is how often a round whose master has not answered asks
	// other nodes again, and how soon a round that nothing answered but a
	// probe was sent for is followed by the next.
	ProbeEvery = 50 * time.Millisecond

	// roundKeys is how many keys one retry round sends.
	roundKeys = 1000
	// backoff bounds the wait between rounds that land nothing.
	backoff = 200 * time.Millisecond
)

// Script is the owed DEL: it deletes KEYS[1] unless it holds the value
// whose SHA-1, in hex, is ARGV[1] (none if empty), the latest write of
// this process, which must stand. A Store sends it with the keep the
// Ledger gives for the key.
var Script = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and (ARGV[1] == '' or redis.sha1hex(v) ~= ARGV[1]) then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// A Store is what a Ledger needs of its cache: the Redis calls of the
// retries, and the cache's meaning of a failed write. Its methods are
// called without the Ledger's lock held.
type Store interface {
	// Invalidate sends Script for each of keys, sparing keeps[i], to the
	// node the client maps the key to, within one Redis budget, and
	// returns each key's error: nil where Redis ran it. It may end early
	// when ctx is cancelled (every key ran elsewhere). It is called
	// regardless of the node's circuit breaker.
	Invalidate(ctx context.Context, keys, keeps []string) []error

	// Probe sends Script for each key i not ran[i] to nodes besides its
	// master, within a Redis budget of its own, follows the redirections
	// they answer, and sets ran[i] for each key it ran on the node that
	// owns its slot. It reports whether it sent anything: false on a
	// client that is not a Cluster.
	Probe(ctx context.Context, keys, keeps []string, ran []bool) (sent bool)

	// Owes reports whether err, the error of a write of key with ttl (a
	// Write's TTL), is a failure of Redis's after which Redis may still
	// hold what the write meant to replace, and if so until when it may:
	// zero for as long as the key has no expiry.
	Owes(key string, ttl time.Duration, err error) (until time.Time, owe bool)

	// Pending returns the error the caller of op (a Write's Op) gets for
	// its write of key, which failed with err, a failure Owes owes: kept
	// tells whether the Ledger keeps its invalidation; when not, n
	// invalidations are owed already, the most MaxBytes allows.
	Pending(op, key string, err error, kept bool, n int) error

	// Landed is told that owed keys landed or expired (Len says how many
	// are left).
	Landed()
}

// A Write is a write of some keys that Ledger.Write orders with their
// owed invalidations.
type Write struct {
	Op     string        // what the write is, for the Store's Pending
	Keys   []string      // the keys written
	Stored [][]byte      // each key's bytes as written; nil for a deletion
	TTL    time.Duration // the TTL the write asked for, for the Store's Owes
}

// A Ledger keeps the invalidations a cache owes Redis. Its zero value
// owes nothing; Init gives it its Store before the first Write. A Ledger
// must not be copied.
type Ledger struct {
	n      atomic.Int64 // len(keys), read without the lock on every Has
	store  Store
	budget time.Duration // the Store's Redis budget, for Close

	mu    sync.Mutex
	keys  map[string]*key
	bytes int
	round chan struct{} // closed when the retry round in flight ends

	wake chan struct{} // buffered: a key was added
	stop chan struct{} // closed by Close
	done chan struct{} // closed when the retrying goroutine has ended
	once sync.Once     // starts the goroutine

	closeOnce sync.Once
	closeErr  error // Close's report

	kept, applied, expired, dropped atomic.Uint64
}

// A key is the state of one owed invalidation.
type key struct {
	until    time.Time // when Redis has expired the old value anyway; zero: never
	answered time.Time // when a DEL of it was last answered; zero: never
	keep     string    // the SHA-1 of this process's latest write of it, if one succeeded since; "" none
	writes   int       // writes of it in flight: no retry of it starts meanwhile
	retrying bool      // a retry of it is in flight: writes of it wait
}

// Init readies l to owe invalidations with s, whose Redis calls take at
// most budget each. It must be called once, before any other method but
// Has and Len.
func (l *Ledger) Init(s Store, budget time.Duration) {
	l.store, l.budget = s, budget
	l.keys = map[string]*key{}
	l.wake = make(chan struct{}, 1)
	l.stop = make(chan struct{})
	l.done = make(chan struct{})
}

// Has reports whether an invalidation of k is owed. It costs one atomic
// load when none is (it inlines: every read of the cache asks).
func (l *Ledger) Has(k string) bool { return l.n.Load() != 0 && l.has(k) }

func (l *Ledger) has(k string) bool {
	l.mu.Lock()
	_, ok := l.keys[k]
	l.mu.Unlock()
	return ok
}

// Len returns how many invalidations are owed.
func (l *Ledger) Len() int { return int(l.n.Load()) }

// Stats are a Ledger's counts. Every key kept is, at any moment, exactly
// one of owed, applied or expired: Kept = Owed + Applied + Expired.
type Stats struct {
	Owed    int    // owed now
	Kept    uint64 // failed writes whose invalidation was kept
	Applied uint64 // invalidations that landed
	Expired uint64 // invalidations dropped once Redis had expired the value anyway
	Dropped uint64 // failed writes not kept: MaxBytes was reached
}

// Stats returns l's counts, taken together.
func (l *Ledger) Stats() Stats {
	l.mu.Lock() // the counts change under it: their identity holds
	s := Stats{Owed: l.Len(), Kept: l.kept.Load(), Applied: l.applied.Load(), Expired: l.expired.Load()}
	l.mu.Unlock()
	s.Dropped = l.dropped.Load()
	return s
}

// Write runs send, which sends w's writes and returns each key's error,
// ordered with the retries of the keys' owed invalidations, and returns
// the errors its caller gets.
//
// Before send, Write waits (under ctx) for a retry in flight of an owed
// key of w to end, and keeps new ones from starting until send returns.
// A key written successfully that is owed keeps its invalidation, which
// from then on spares the bytes stored (none for a deletion) and counts
// the write's reply as Redis answering. Each key whose write failed on a
// failure the Store owes is owed from then on, and its error is what the
// Store's Pending makes of it; other errors are returned as send gave
// them.
func (l *Ledger) Write(ctx context.Context, w *Write, send func() []error) []error {
	var held []bool
	if l.n.Load() > 0 {
		held = make([]bool, len(w.Keys))
		for i, k := range w.Keys {
			held[i] = l.hold(ctx, k)
		}
	}
	errs := send()
	for i, err := range errs {
		if held != nil && held[i] {
			var stored []byte
			if w.Stored != nil {
				stored = w.Stored[i]
			}
			l.wrote(w.Keys[i], stored, err == nil)
		}
		if err == nil {
			continue
		}
		if until, ok := l.store.Owes(w.Keys[i], w.TTL, err); ok {
			kept, n := l.owe(w.Keys[i], until)
			errs[i] = l.store.Pending(w.Op, w.Keys[i], err, kept, n)
		}
	}
	return errs
}

// hold orders a write of k with the retries of its owed invalidation: it
// waits (under ctx) for a retry in flight to end and keeps new ones from
// starting until the write calls wrote. It reports whether it held the
// key (only an owed key is held).
func (l *Ledger) hold(ctx context.Context, k string) bool {
	if !l.Has(k) {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		s, ok := l.keys[k]
		if !ok {
			return false
		}
		if !s.retrying {
			s.writes++
			return true
		}
		round := l.round
		l.mu.Unlock()
		select {
		case <-round:
		case <-ctx.Done():
		}
		l.mu.Lock()
		if ctx.Err() != nil {
			return false // the write fails on its context anyway
		}
	}
}

// wrote ends a write of k that hold held. If it succeeded, the owed
// invalidation must not undo it: its DEL spares a value with exactly the
// bytes stored (nil for a deletion: none), and a late landing of an older
// write, which is not those bytes, is deleted.
func (l *Ledger) wrote(k string, stored []byte, ok bool) {
	keep := ""
	if ok && stored != nil {
		sum := sha1.Sum(stored)
		keep = hex.EncodeToString(sum[:])
	}
	l.mu.Lock()
	if s, found := l.keys[k]; found {
		s.writes--
		if ok {
			s.keep = keep
			// Its reply is Redis answering: writes sent before that which
			// land late do so in the moments after, so a DEL sent
			// SettleAfter after the first answer follows them. A later
			// answer does not move that moment (a key written more often
			// than SettleAfter would never land).
			if s.answered.IsZero() {
				s.answered = time.Now()
			}
		}
	}
	l.mu.Unlock()
}

// owe records that a write of k failed on a Redis failure, after which
// Redis may hold the old value until until (zero: never), and starts the
// retries. It reports whether it kept the key, and, when not, how many
// keys are owed.
func (l *Ledger) owe(k string, until time.Time) (kept bool, n int) {
	l.mu.Lock()
	s, ok := l.keys[k]
	switch {
	case ok:
		s.answered, s.keep = time.Time{}, "" // a newer write failed: settle anew, spare nothing
		if !until.IsZero() && !s.until.IsZero() && until.After(s.until) {
			s.until = until
		}
	case l.bytes+len(k)+Overhead > MaxBytes:
		l.mu.Unlock()
		l.dropped.Add(1)
		return false, l.Len()
	default:
		l.keys[k] = &key{until: until}
		l.bytes += len(k) + Overhead
		l.n.Add(1)
		l.kept.Add(1)
	}
	l.mu.Unlock()
	l.once.Do(func() { go l.retry() })
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return true, 0
}
