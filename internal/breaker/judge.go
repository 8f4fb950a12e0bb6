package breaker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// An Outcome is what one Redis call says about its node's health. A
// pipeline's is the worst of its commands'.
type Outcome uint8

const (
	Healthy     Outcome = iota // the node answered (a value, nil, or an error reply about the data)
	Neutral                    // says nothing of the node: the caller's own context ended
	Late                       // says nothing of the node: this process was too busy to make the call in time
	Failed                     // the node's own failure
	RefusedConn                // nothing listens at the node's address: open the breaker now
)

// Judge judges what a Redis call made for caller, under bud, to node,
// says of the node, and returns the error that tells why: err itself,
// the caller's own error (Neutral), or err with what the call's
// connections saw (a failed dial, named first; a Late call's reason).
//
// A call that ran out of its budget is judged by what the node's
// connections saw meanwhile (see conn.go), not by the clock alone. It is
// Failed if, within the call's time, a command written to the node went
// unanswered for at least half the budget: nothing came back on that
// command's connection and nothing waits unread on its socket. The
// connection is the call's own (go-redis closes it when the budget runs
// out, and the cache looks at its socket first) or another of the node's
// still open (a call that found no connection waited for those), and
// replies on the node's other connections do not excuse it: a node that
// pauses writes answers reads. Where the sockets cannot be looked into
// (see peeks), or connections made before the cache are in the pool, the
// call is also Failed if nothing came back from the node at all since it
// began while a command waited half the budget. Otherwise the node was not
// what the call waited on: this process was (a CPU, for the goroutine that
// writes the command or reads its reply, a pooled connection, a dial, the
// calls queued before it). Such a call is Late: its caller gets an error,
// but the node is not blamed for it. So a node that is stopped, hung, cut
// off or pausing writes is judged Failed, one call per budget; one that
// refuses a connection is judged RefusedConn at the first refusal.
//
// Limit: a command of the application's that blocks on the server by
// design (BLPOP, WAIT, XREAD BLOCK) on the client the cache is given looks,
// while it waits, like a node that does not answer, and makes a call that
// ran out of its budget meanwhile Failed rather than Late.
func Judge(caller context.Context, bud *Budget, node *Node, err error) (Outcome, error) {
	if err == nil || err == redis.Nil {
		return Healthy, err
	}
	if cerr := caller.Err(); cerr != nil {
		// The caller's own deadline or cancellation, not Redis's.
		return Neutral, cerr
	}
	if dl, ok := caller.Deadline(); ok && !time.Now().Before(dl) {
		// The caller's deadline has passed, and the connection's deadline,
		// which is the same, went off before its context's timer.
		return Neutral, context.DeadlineExceeded
	}
	o := judgeReply(err)
	d := bud.dialed.Load()
	if r := node.refusal.Load(); d == nil && r != nil && r.at >= bud.start.UnixNano() {
		d = r // a dial of go-redis's own, on the call's behalf
	}
	cause := err
	if d != nil && !errors.Is(err, d.err) {
		cause = &dialError{d: d, err: err, budget: bud.full}
	}
	switch {
	case o != Failed:
	case Refused(err) || d != nil && Refused(d.err):
		o = RefusedConn
	case d == nil && expired(err) && !node.unresponsive(bud):
		o, cause = Late, &lateError{err: err, budget: bud.deadline.Sub(bud.start)}
	}
	return o, cause
}

// judgeReply classifies err from a Redis call whose caller's context is
// still live: the node answered, or it failed.
func judgeReply(err error) Outcome {
	var re redis.Error
	if errors.As(err, &re) {
		// An error reply: the node is up unless the reply says it cannot
		// serve.
		if Unavailable(re) {
			return Failed
		}
		return Healthy
	}
	// Network errors, refused connections, an exhausted pool, and the
	// call's own budget running out (the caller's context is still live,
	// so a deadline error is the budget's).
	return Failed
}

// Unavailable reports whether an error reply says the node cannot serve:
// it is still loading its data set, or cut off from the cluster or its
// master.
func Unavailable(reply redis.Error) bool {
	msg := reply.Error()
	for _, p := range unavailableReplies {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

var unavailableReplies = []string{"LOADING", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN"}

// Refused reports whether err is a connection that could not be made
// because nothing can be reached at the address: a refused or reset
// connection, an unreachable network or host, or a name that does not
// resolve.
func Refused(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, syscall.EHOSTUNREACH) {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns) && dns.IsNotFound
}

// NotSent reports whether a failed call's error, as Judge returned it,
// shows that its command was never sent: a connection for it could not be
// made.
func NotSent(err error) bool {
	var de *dialError
	return errors.As(err, &de) || Refused(err)
}

// expired reports whether err is a call's budget running out: a deadline
// on the socket, the call's context, or a wait for a pooled connection.
func expired(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrPoolTimeout) ||
		errors.As(err, &ne) && ne.Timeout()
}

// A lateError is a call that ran out of its budget while its node was
// answering: see Judge.
type lateError struct {
	err    error
	budget time.Duration
}

func (e *lateError) Error() string {
	return fmt.Sprintf("%v (no reply within the Redis budget of %v, while the node answered other calls: this process was too busy to make the call in time)", e.err, e.budget)
}

func (e *lateError) Unwrap() error { return e.err }

// A dialFailure is a connection to addr that could not be made: the cause
// of its failure, which go-redis does not return when the budget runs out
// while it retries, and when it failed.
type dialFailure struct {
	addr string
	err  error
	at   int64 // unix nanoseconds
}

// A dialError is a call that failed after a connection for it could not
// be made: it names the dial's failure first.
type dialError struct {
	d      *dialFailure
	err    error
	budget time.Duration
}

func (e *dialError) Error() string {
	if errors.Is(e.err, context.Canceled) {
		return fmt.Sprintf("%v (the call ended at the refusal)", e.d.err)
	}
	if errors.Is(e.err, context.DeadlineExceeded) {
		return fmt.Sprintf("%v (then the Redis budget of %v ran out)", e.d.err, e.budget)
	}
	return fmt.Sprintf("%v (then: %v)", e.d.err, e.err)
}

func (e *dialError) Unwrap() []error {
	if errors.Is(e.err, context.Canceled) {
		// The call was ended by the refusal itself (ticks.abort): the
		// refusal is the whole story, not a cancellation.
		return []error{e.d.err}
	}
	return []error{e.d.err, e.err}
}
