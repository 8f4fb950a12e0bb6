package packcache

import (
	"context"

	"github.com/packcache/packcache/internal/singleflight"
)

// Coalescing, where concurrent callers share work, is internal/singleflight:
// the reads of Get, GetOrLoad and Serve are shared by a
// singleflight.Group (c.lookups, c.reads), their work being flight.Run
// (read.go); the loads are shared by a singleflight.Registry (c.loads),
// among the reads that found the same state of a key (loader.go); the
// dictionary set's fetches are a Group too (internal/dictset). What the
// cache adds is below: the error a panic in shared work becomes, and the
// cache's life as the Groups' goroutines' register.

// A call is one unit of shared work: a read's or a load's.
type call[V any] = singleflight.Call[V]

// errGoexit is what callers get when a loader calls runtime.Goexit.
var errGoexit = singleflight.ErrGoexit

// unprovenToken is the token of loads that begin with Redis unreachable.
const unprovenToken = singleflight.Unproven

// owedToken is the token of loads of a key whose invalidation is owed.
const owedToken = "owed"

// wait returns c's result once it is final, or ctx's error if ctx ends
// first.
func wait[V any](ctx context.Context, c *call[V]) (V, error) { return singleflight.Wait(ctx, c) }

// protect calls fn, turning a panic into a *PanicError for every caller
// that shares the work.
func protect[V, A, B any](ctx context.Context, a A, b B, fn func(context.Context, A, B) (V, error)) (V, error) {
	return singleflight.Protect(ctx, a, b, fn, panicError)
}

// panicError is the error of shared work that panicked.
func panicError(value any, stack []byte) error { return &PanicError{Value: value, Stack: stack} }

// spawns is the cache's life as a Group's goroutines register with it.
type spawns struct{ l *life }

func (s spawns) TrySpawn() bool { return s.l.trySpawn() }
func (s spawns) Exit()          { s.l.exit() }
