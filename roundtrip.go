package packcache

import (
	"context"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/internal/breaker"
)

// Every Redis call the cache makes goes through roundTrip (one key) or
// roundTripMany (a pipeline of keys, one round trip per node). They own,
// in one place, the rules of a call:
//
//   - the budget: the call's context ends WithRedisTimeout after it
//     begins, unless the caller's own deadline comes first;
//   - the breaker of the key's node: a node whose breaker is open is not
//     tried, and the call fails with ErrCircuitOpen;
//   - the NOSCRIPT retry of a pipelined script;
//   - the judgement of a failure: the caller's context ending is the
//     caller's own, never Redis's (it is returned as it is, not counted and
//     not told to the breaker); a refused connection opens the node's
//     breaker at once; anything else the node did wrong is one failure;
//   - the error: an *Error matching ErrRedis that names the key and the
//     cause (the refused dial, not only the budget running out);
//   - the counters and the observer.

// The operations Redis calls are made for, as errors name them. Reads
// ("get") begin work; the others finish it, and are given a turn at a
// node before reads (see breaker.Node.Enter).
const (
	opGet    = "get"
	opSet    = "set"
	opDelete = "delete"
	opLease  = "lease"
)

// roundTrip makes one Redis call, f, for key under ctx: op names it in
// errors ("get", "set", "delete", "lease"). f gets the budgeted context.
// The error is nil, redis.Nil, an *Error holding ctx's own error when ctx
// ended first (the call is then no failure of Redis's, and is not
// counted), or an *Error matching ErrRedis (and ErrCircuitOpen when key's
// node's breaker is open and it was not tried).
//
// The call first waits, under ctx alone, for one of the node's slots (see
// breaker.Node.Enter); its budget begins once it has one. A repeatable call (a
// read, or a write whose second copy changes nothing: SET, DEL; never a
// script whose reply tells what it did) that ran out of its budget while
// the node answered other calls (judged late: see judgeCall) is made
// again, each time with a budget of its own, for up to the load timeout
// or until ctx ends.
func (c *cache) roundTrip(ctx context.Context, op, key string, p *policy, repeatable bool, f func(context.Context) error) error {
	b := c.nodes.Find(ctx, key)
	slot, err := b.Enter(ctx, c.life.ctx.Done(), op != opGet)
	if err != nil {
		if err == breaker.ErrClosing {
			err = ErrClosed
		}
		return keyErr(op, key, err)
	}
	defer slot.Leave()
	var first time.Time
	for {
		if op != opInvalidate && !b.Allow() {
			return circuitOpen(op, key, b)
		}
		bud := c.nodes.Budget(ctx, b)
		if first.IsZero() {
			first = bud.Start()
		}
		o, err := judgeCall(ctx, bud, b, op, key, f(bud))
		bud.End()
		b.Feed(o)
		if o == breaker.Late && repeatable && c.life.ctx.Err() == nil && time.Since(first) < c.loadTimeout {
			// Redis is fine and the call can be made again: failing it
			// would send a read's surge, which this process cannot keep
			// up with, to the database, and make a write pending. The
			// caller waits under its own context.
			continue
		}
		if o == breaker.Failed || o == breaker.RefusedConn {
			c.redisFailed(p, b, err)
		}
		return err
	}
}

// roundTripMany makes one pipeline of Redis calls, one round trip per node:
// queue adds key i's commands to pipe and returns the one whose error
// tells how key i fared (sha: as EVALSHA, else as EVAL, for scripts; it is
// called again with sha false for keys a node answered NOSCRIPT). Keys
// whose node's breaker is open are not sent. Each node's breaker is told
// once what the pipeline says of it. It returns each key's error, judged
// as roundTrip judges it.
//
// single says that queue sends one command per key: then a batch of one
// key is sent to the client as it is, through roundTrip, since a pipeline
// of one command costs allocations and saves no round trip. (A load of one
// key is a batch of one: its lease and its store are such commands.)
func (c *cache) roundTripMany(ctx context.Context, op string, keys []string, single bool, queue func(ctx context.Context, pipe redis.Cmdable, i int, sha bool) redis.Cmder) []error {
	errs := make([]error, len(keys))
	switch {
	case len(keys) == 0:
		return errs
	case len(keys) == 1 && single:
		// A "set" (a plain SET, a store over a lease that also reports its
		// own bytes found in place, a dictionary's publication) or a
		// "delete" changes nothing when made twice: made again if late.
		repeatable := op == opSet || op == opDelete
		errs[0] = c.roundTrip(ctx, op, keys[0], c.policy(keys[0]), repeatable, func(ctx context.Context) error {
			cmd := queue(ctx, c.rdb, 0, true)
			if isNoScript(cmd.Err()) {
				cmd = queue(ctx, c.rdb, 0, false)
			}
			return cmd.Err()
		})
		return errs
	}
	bud := c.nodes.Budget(ctx, nil)
	defer bud.End()
	nb := c.nodes.Batch(bud, keys)
	pipe := c.rdb.Pipeline()
	cmds := make([]redis.Cmder, len(keys))
	for i, k := range keys {
		if op != opInvalidate && !nb.Allowed(i) {
			errs[i] = circuitOpen(op, k, nb.Of(i))
			continue
		}
		cmds[i] = queue(bud, pipe, i, true)
	}
	if pipe.Len() > 0 {
		_, _ = pipe.Exec(bud) // each command carries its own error
		again := false
		for i, cmd := range cmds {
			if cmd != nil && isNoScript(cmd.Err()) {
				cmds[i] = queue(bud, pipe, i, false)
				again = true
			}
		}
		if again {
			_, _ = pipe.Exec(bud)
		}
	}
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		o, err := judgeCall(ctx, bud, nb.Of(i), op, keys[i], cmd.Err())
		nb.Saw(i, o)
		if o == breaker.Failed || o == breaker.RefusedConn {
			c.redisFailed(c.policy(keys[i]), nb.Of(i), err)
		}
		errs[i] = err
	}
	nb.Feed()
	return errs
}

// isNoScript reports a node's answer that it has not seen a script yet.
func isNoScript(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }

// judgeCall judges a call to node under bud (see breaker.Judge) and makes
// the error its caller gets: nil or redis.Nil as they are; the caller's
// own context's error, keyed; or an *Error matching ErrRedis that names
// the key and the cause.
func judgeCall(caller context.Context, bud *breaker.Budget, node *breaker.Node, op, key string, err error) (breaker.Outcome, error) {
	o, cause := breaker.Judge(caller, bud, node, err)
	switch {
	case err == nil || err == redis.Nil:
		return o, err
	case o == breaker.Neutral:
		return o, keyErr(op, key, cause)
	}
	return o, keyErr(op, key, redisErr(cause))
}

// circuitOpen is the error of a call that did not try key's node because
// its breaker, b, is open: it names the refused connection that opened
// it, if one did.
func circuitOpen(op, key string, b *breaker.Node) error {
	if cause := b.OpenCause(); cause != nil {
		return keyErr(op, key, &kindError{ErrRedis, &kindError{ErrCircuitOpen, cause}})
	}
	return keyErr(op, key, &kindError{ErrRedis, ErrCircuitOpen})
}
