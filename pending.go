package packcache

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/internal/owed"
)

// Invalidations that survive an outage are kept by the cache's ledger
// (internal/owed), which every write goes through: Set, Delete, SetMany
// and a Delete of several keys each send their writes inside
// c.owed.Write. What the ledger needs of the cache is owedStore below:
// the Redis calls of its retries (through the breaker's judgement, and on
// a Cluster to the nodes failover.go's peers know), and what a failed
// write means (ErrRedis, the policy's TTL) and what its caller is told
// (ErrPending).

// owedStore is the cache as its ledger of owed invalidations uses it.
type owedStore struct{ c *cache }

// opInvalidate names the retried DEL of an owed key. Its calls are not
// refused by an open breaker: they probe it.
const opInvalidate = "invalidate"

// Invalidate sends the owed DELs through the client, one pipeline per
// node (owedCommand: what each key is sent).
func (s owedStore) Invalidate(ctx context.Context, keys, keeps []string) []error {
	return s.c.remote.roundTripMany(ctx, opInvalidate, keys, nil, true, func(ctx context.Context, pipe redis.Cmdable, i int, sha bool) redis.Cmder {
		return owedCommand(ctx, pipe, sha, keys[i], keeps[i])
	})
}

// owedCommand queues on pipe the retry of key's owed invalidation, as
// EVALSHA (sha) or EVAL: the owed DEL (owed.Script), sparing keep; or,
// for a group's record (an InvalidateGroups that failed),
// InvalidateGroups's own script, which also moves the group sequence on:
// a DEL alone would let a load that began before it store (groups.go).
// It is the one rule for every retry, through the client (Invalidate)
// and to other nodes of a Cluster (failover.go's probe).
func owedCommand(ctx context.Context, pipe redis.Cmdable, sha bool, key, keep string) *redis.Cmd {
	if isGroupKey(key) {
		all := []string{groupSeqKey, key}
		if sha {
			return invalidateScript.EvalSha(ctx, pipe, all)
		}
		return invalidateScript.Eval(ctx, pipe, all)
	}
	return runScript(ctx, pipe, owed.Script, sha, key, keep)
}

// Probe sends the owed DELs to other nodes of a Cluster (failover.go),
// within a Redis budget.
func (s owedStore) Probe(ctx context.Context, keys, keeps []string, ran []bool) bool {
	if s.c.remote.peers.cluster == nil {
		return false
	}
	bud := s.c.remote.nodes.Budget(ctx, nil)
	defer bud.End()
	return s.c.remote.peers.probe(bud, keys, keeps, ran)
}

// Owes owes a write that failed on ErrRedis (never the caller's own
// context) until the longest TTL the old value could have: its policy's
// TTL plus StaleFor, or the failed Set's TTL if longer.
func (s owedStore) Owes(key string, ttl time.Duration, err error) (until time.Time, owe bool) {
	if !errors.Is(err, ErrRedis) {
		return time.Time{}, false
	}
	if isGroupKey(key) {
		// Its members may live as long as any value: owed until it lands.
		return time.Time{}, true
	}
	p := s.c.pols.of(key)
	if p.ttl != Off && ttl != Off { // else the old value, or a late landing of this write, may never expire
		until = time.Now().Add(max(p.ttl, ttl) + p.staleFor)
	}
	return until, true
}

// Pending marks err ErrPending when the invalidation is kept, or says why
// not past the bound, and tells the observer or the error handler.
func (s owedStore) Pending(op, key string, err error, kept bool, n int) error {
	c := s.c
	if !kept {
		err = keyErr(op, key, fmt.Errorf("%w (and %d invalidations are already pending, the most this cache keeps: this one is not retried)", err, n))
		c.tel.report(context.Background(), key, err)
		return err
	}
	c.tel.observePending(c.pols.of(key), c.owed.Len())
	return &Error{Op: op, Key: key, Err: &pendingError{err}}
}

// Landed tells the observer how many invalidations are left.
func (s owedStore) Landed() { s.c.tel.observePending(s.c.pols.base, s.c.owed.Len()) }

// pendingError is a failed write whose invalidation the cache will apply.
type pendingError struct{ err error }

func (e *pendingError) Error() string {
	s := detail(e.err)
	if pe, ok := e.err.(*Error); ok {
		s = detail(pe.Err) // the outer Error names the op and key already
	}
	return s + " (pending: the cache will invalidate the key once Redis answers)"
}

func (e *pendingError) Unwrap() []error {
	if pe, ok := e.err.(*Error); ok {
		return []error{ErrPending, pe.Err}
	}
	return []error{ErrPending, e.err}
}

// closeOwed closes the ledger (its last tries of what is owed) and then
// the clients peers made for it, and returns Close's report of the
// invalidations not applied.
func closeOwed(l *owed.Ledger, p *peers) error {
	err := l.Close()
	p.close()
	if err != nil {
		return &kindError{ErrRedis, fmt.Errorf("Close: %w", err)}
	}
	return nil
}
