package packcache

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Invalidations that survive an outage. When a Delete, or the store of a
// Set, fails on a Redis failure (a refused connection, a timeout, an open
// breaker; never the caller's own context), Redis may still hold the value
// the write meant to replace. The cache then owes Redis an invalidation of
// the key, and keeps it here until it lands:
//
//   - A goroutine of the cache's retries every owed key as a DEL, never as
//     a late write, so a newer write cannot be replaced by it. It tries
//     regardless of the node's circuit breaker (it is the breaker's probe,
//     in effect), one round at a time, each within the Redis budget; a DEL
//     written to a stopped Redis runs when it resumes.
//   - A DEL counts as landed only when it was sent at least settleAfter
//     after an earlier DEL of the key had been answered: a command written
//     to a stopped server before it stopped (this process's timed-out Set
//     of the key, say) runs when the server resumes, possibly after the
//     first DEL, but not after one sent once the server was seen answering.
//   - An owed key whose longest TTL (its policy's TTL plus StaleFor, or
//     the failed Set's TTL if longer) has passed since the failure is
//     dropped: Redis has expired whatever the write meant to replace.
//   - Until it lands, this process does not trust what Redis holds for the
//     key: the near cache and the share window drop it at once, and a Get
//     of it answers from the loader without storing (or ErrMiss without a
//     loader), never from Redis.
//   - The owed keys are bounded by maxOwedBytes (key bytes plus
//     owedOverhead each, about 130 bytes for a 16-byte key); past the
//     bound a failed write is not kept, and its error says so.
//   - On a Cluster, each round also sends the DELs to a few other nodes
//     and follows their MOVED replies (failover.go): when a hung master's
//     replica is promoted, the DEL is sent to it about failoverProbe
//     (50 ms) later and runs there, whatever the client's map still says.
//
// Limits: another process may read the old value from Redis between the
// moment Redis answers again (a resumed server, or a promoted replica)
// and the moment the DEL runs there (about settleAfter); and
// invalidations owed by a process that dies are lost with it.
type owed struct {
	n     atomic.Int64 // len(keys), read without the lock on every Get
	mu    sync.Mutex
	keys  map[string]*owedKey
	bytes int
	wake  chan struct{} // buffered: a key was added
	round chan struct{} // closed when the retry round in flight ends
	stop  chan struct{} // closed by Close
	done  chan struct{} // closed when the retrying goroutine has ended
	once  sync.Once     // starts the goroutine

	closeOnce sync.Once
	closeErr  error // Close's report

	kept, applied, expired, dropped atomic.Uint64
}

type owedKey struct {
	until    time.Time // when Redis has expired the old value anyway; zero: never
	answered time.Time // when a DEL of it was last answered; zero: never
	keep     string    // the SHA-1 of this process's latest stored write of it, if it succeeded since; "" none
	writes   int       // writes of it in flight: no retry of it starts meanwhile
	retrying bool      // a retry of it is in flight: writes of it wait
}

// hold orders a write of key with the retries of its owed invalidation:
// it waits (under ctx) for a retry in flight to end and keeps new ones
// from starting until the write calls wrote. It reports whether it held
// the key (only an owed key is held).
func (o *owed) hold(ctx context.Context, key string) bool {
	if !o.has(key) {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for {
		k, ok := o.keys[key]
		if !ok {
			return false
		}
		if !k.retrying {
			k.writes++
			return true
		}
		round := o.round
		o.mu.Unlock()
		select {
		case <-round:
		case <-ctx.Done():
		}
		o.mu.Lock()
		if ctx.Err() != nil {
			return false // the write fails on its context anyway
		}
	}
}

// holdMany is hold for the keys of a batch write.
func (o *owed) holdMany(ctx context.Context, keys []string) []bool {
	held := make([]bool, len(keys))
	if o.n.Load() == 0 {
		return held
	}
	for i, k := range keys {
		held[i] = o.hold(ctx, k)
	}
	return held
}

// wrote ends a write of key that hold held. If it succeeded, the owed
// invalidation must not undo it: its DEL spares a value with exactly the
// bytes stored (nil for a Delete: none), and a late landing of an older
// write, which is not those bytes, is deleted.
func (o *owed) wrote(key string, stored []byte, ok bool) {
	keep := ""
	if ok && stored != nil {
		keep = digest(string(stored))
	}
	o.mu.Lock()
	if k, found := o.keys[key]; found {
		k.writes--
		if ok {
			k.keep = keep
			// Its reply is Redis answering: writes sent before that which
			// land late do so in the moments after, so a DEL sent
			// settleAfter after the first answer follows them. A later
			// answer does not move that moment (a key written more often
			// than settleAfter would never land).
			if k.answered.IsZero() {
				k.answered = time.Now()
			}
		}
	}
	o.mu.Unlock()
}

// owedScript deletes KEYS[1] unless it holds the value whose SHA-1 is
// ARGV[1] (none if empty): this process's latest write, which must stand.
var owedScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and (ARGV[1] == '' or redis.sha1hex(v) ~= ARGV[1]) then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

const (
	// maxOwedBytes bounds the memory the owed invalidations take.
	maxOwedBytes = 32 << 20
	// owedOverhead is what one owed key costs besides its bytes: the map
	// entry, the string header and the owedKey.
	owedOverhead = 112
	// settleAfter is how long after a DEL was answered a second DEL must
	// be sent to count as landed.
	settleAfter = 100 * time.Millisecond
	// owedRound is how many keys one retry round sends.
	owedRound = 1000
	// owedBackoff bounds the wait between rounds that land nothing.
	owedBackoff = 200 * time.Millisecond
)

func (o *owed) init() {
	o.keys = map[string]*owedKey{}
	o.wake = make(chan struct{}, 1)
	o.stop = make(chan struct{})
	o.done = make(chan struct{})
}

// has reports whether key's invalidation is owed. It costs one atomic load
// when nothing is owed.
func (o *owed) has(key string) bool {
	if o.n.Load() == 0 {
		return false
	}
	o.mu.Lock()
	_, ok := o.keys[key]
	o.mu.Unlock()
	return ok
}

// count returns how many invalidations are owed.
func (o *owed) count() int { return int(o.n.Load()) }

// owe records that the write op of key failed with err, a Redis failure,
// and returns the error the caller gets: err marked ErrPending when the
// invalidation is kept, or err saying why not past the bound.
func (c *Cache[T]) owe(op, key string, p *policy[T], ttl time.Duration, err error) error {
	if err == nil || !errors.Is(err, ErrRedis) {
		return err
	}
	var until time.Time // zero: the old value, or a late landing of this write, may never expire
	if p.ttl != Off && ttl != Off {
		until = time.Now().Add(max(p.ttl, ttl) + p.staleFor)
	}
	o := &c.owed
	o.mu.Lock()
	k, ok := o.keys[key]
	switch {
	case ok:
		k.answered, k.keep = time.Time{}, "" // a newer write failed: settle anew, spare nothing
		if !until.IsZero() && !k.until.IsZero() && until.After(k.until) {
			k.until = until
		}
	case o.bytes+len(key)+owedOverhead > maxOwedBytes:
		o.mu.Unlock()
		o.dropped.Add(1)
		err = keyErr(op, key, fmt.Errorf("%w (and %d invalidations are already pending, the most this cache keeps: this one is not retried)", err, o.n.Load()))
		c.report(context.Background(), key, err)
		return err
	default:
		o.keys[key] = &owedKey{until: until}
		o.bytes += len(key) + owedOverhead
		o.n.Add(1)
		o.kept.Add(1)
	}
	o.mu.Unlock()
	o.once.Do(func() { go c.retryOwed() })
	select {
	case o.wake <- struct{}{}:
	default:
	}
	c.observePending(p)
	return &Error{Op: op, Key: key, Err: &pendingError{err}}
}

// pendingError is a failed write whose invalidation the cache will apply.
type pendingError struct{ err error }

func (e *pendingError) Error() string {
	s := e.err.Error()
	if pe, ok := e.err.(*Error); ok {
		s = pe.Err.Error() // the outer Error names the op and key already
	}
	return s + " (pending: the cache will invalidate the key once Redis answers)"
}

func (e *pendingError) Unwrap() []error {
	if pe, ok := e.err.(*Error); ok {
		return []error{ErrPending, pe.Err}
	}
	return []error{ErrPending, e.err}
}

// retryOwed retries the owed invalidations until Close.
func (c *Cache[T]) retryOwed() {
	o := &c.owed
	defer close(o.done)
	wait := time.NewTimer(0)
	defer wait.Stop()
	for {
		select {
		case <-o.stop:
			return
		case <-o.wake:
		case <-wait.C:
		}
		if o.count() == 0 {
			continue // woken for keys already landed; wait for the next
		}
		_, next := c.retryRound(context.Background())
		wait.Reset(next)
	}
}

// retryRound sends one round of owed DELs and returns how many landed and
// how soon the next round is due.
func (c *Cache[T]) retryRound(ctx context.Context) (landed int, next time.Duration) {
	o := &c.owed
	now := time.Now()
	var keys, keeps []string
	expired := 0
	o.mu.Lock()
	for k, s := range o.keys {
		if !s.until.IsZero() && now.After(s.until) {
			c.landOwed(k, &o.expired)
			expired++
			continue
		}
		if s.writes > 0 || !s.answered.IsZero() && now.Sub(s.answered) < settleAfter {
			continue // a write of it is in flight, or its confirming DEL is not due yet
		}
		s.retrying = true
		keys, keeps = append(keys, k), append(keeps, s.keep)
		if len(keys) == owedRound {
			break
		}
	}
	round := make(chan struct{})
	o.round = round
	o.mu.Unlock()
	defer close(round)
	if expired > 0 {
		c.observePending(c.base)
	}
	if len(keys) == 0 {
		return 0, settleAfter
	}
	sent := time.Now()
	// On a Cluster, other nodes are tried alongside (failover.go): a
	// promoted replica runs the DEL while the client's map still names a
	// hung master. Once every key ran elsewhere, the master's call is
	// given up (its context's end is not a failure of Redis's).
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var ran []bool
	var elsewhere bool
	var wg sync.WaitGroup
	done := make(chan struct{})
	if c.peers.cluster != nil {
		wg.Go(func() { ran, elsewhere = c.retryElsewhere(ctx, keys, keeps, done, cancel) })
	}
	errs := c.roundTripMany(mctx, opInvalidate, keys, true, func(ctx context.Context, pipe redis.Cmdable, i int, sha bool) redis.Cmder {
		return runScript(ctx, pipe, owedScript, sha, keys[i], keeps[i])
	})
	close(done)
	wg.Wait()
	for i, r := range ran {
		if r {
			errs[i] = nil
		}
	}
	answered := time.Now()
	settling := 0
	o.mu.Lock()
	for i, k := range keys {
		s, ok := o.keys[k]
		if !ok {
			continue
		}
		s.retrying = false
		if errs[i] != nil {
			continue
		}
		if !s.answered.IsZero() && sent.Sub(s.answered) >= settleAfter {
			c.landOwed(k, &o.applied)
			landed++
			continue
		}
		s.answered = answered
		settling++
	}
	o.mu.Unlock()
	switch {
	case landed+settling == 0 && elsewhere:
		next = failoverProbe // no master answered: a replica may be promoted any moment
	case landed+settling == 0:
		next = owedBackoff // Redis did not answer
	case len(keys) == owedRound || settling == 0:
		next = 0 // Redis answers: the keys still waiting go at once
	default:
		next = settleAfter
	}
	if landed > 0 {
		c.observePending(c.base)
	}
	return landed, next
}

// landOwed forgets the owed key k, counting it in n. o.mu must be held.
func (c *Cache[T]) landOwed(k string, n *atomic.Uint64) {
	o := &c.owed
	delete(o.keys, k)
	o.bytes -= len(k) + owedOverhead
	o.n.Add(-1)
	n.Add(1)
}

// opInvalidate names the retried DEL of an owed key. Its calls are not
// refused by an open breaker: they probe it.
const opInvalidate = "invalidate"

// closeOwed stops the retrying goroutine, tries the owed invalidations
// once more within the Redis budget (plus one settling), and returns an
// error naming how many it could not apply. Only the first call does so.
func (c *Cache[T]) closeOwed() error {
	o := &c.owed
	o.closeOnce.Do(func() {
		close(o.stop)
		o.once.Do(func() { close(o.done) }) // the goroutine never started
		<-o.done
		ctx, cancel := context.WithTimeout(context.Background(), c.redisTimeout+2*settleAfter)
		defer cancel()
		for o.count() > 0 && ctx.Err() == nil {
			_, next := c.retryRound(ctx)
			if next == owedBackoff {
				break // Redis did not answer
			}
			t := time.NewTimer(next)
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
		}
		c.peers.close()
		n := o.count()
		if n == 0 {
			return
		}
		o.mu.Lock()
		var some []string
		for k := range o.keys {
			some = append(some, strconv.Quote(k))
			if len(some) == 3 {
				break
			}
		}
		o.mu.Unlock()
		if n > len(some) {
			some = append(some, "...")
		}
		o.closeErr = fmt.Errorf("packcache: Close: %d pending invalidations not applied (%s): Redis may hold the values their writes replaced until their TTLs end: %w",
			n, strings.Join(some, ", "), ErrRedis)
	})
	return o.closeErr
}
