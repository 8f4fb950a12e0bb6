package packcache

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/packcache/packcache/codec"
)

var (
	// ErrMiss is returned by Get when the key holds no value and the cache
	// has no loader for it.
	ErrMiss = errors.New("packcache: cache miss")

	// ErrNotFound is how a Loader says the source has no value for a key.
	// With a NegativeTTL the cache remembers the answer, and Get returns
	// ErrNotFound without calling the loader until it expires.
	ErrNotFound = errors.New("packcache: not found")

	// ErrUnknownHeader reports a stored value whose first byte is a header
	// byte that names no codec this process knows. Its chain holds a
	// *codec.HeaderError naming the byte.
	ErrUnknownHeader = codec.ErrUnknownHeader

	// ErrCorrupt reports a stored value whose payload is truncated or not
	// valid for its codec.
	ErrCorrupt = codec.ErrCorrupt

	// ErrTooLarge reports a value larger than the cache's maximum value
	// size: on Get, a value that would decode to more (found, wherever the
	// format declares its size, before allocating for it); on Set, a
	// serialized value over the limit.
	ErrTooLarge = codec.ErrTooLarge

	// ErrSerialization reports a failure of the serializer, such as a stored
	// value of the wrong JSON type for T. The serializer's own error is in
	// the chain, for errors.As.
	ErrSerialization = errors.New("packcache: serialization failed")

	// ErrRedis reports a failure talking to Redis. The go-redis error (or
	// the context's error) is kept in the chain.
	ErrRedis = errors.New("packcache: redis failed")

	// ErrCircuitOpen reports a call that did not try Redis because recent
	// calls failed and the circuit breaker is open. It also matches
	// ErrRedis.
	ErrCircuitOpen = errors.New("packcache: redis circuit open")

	// ErrPending marks the error of a Delete, or of a Set, SetMany or
	// Delete of several keys, that failed on a Redis failure (a timeout, a
	// refused connection, an open circuit breaker; not the caller's own
	// context) after which the cache keeps the key and invalidates it once
	// Redis answers again: the caller need not retry. The error also
	// matches ErrRedis. Until the invalidation lands, this process answers
	// Gets of the key from the loader without storing (ErrMiss without
	// one), never from what Redis holds. A Set of the key that succeeds
	// meanwhile stands: the invalidation deletes whatever the key holds
	// unless it is exactly what that Set stored (an older write landing
	// late is deleted). Stats counts them (Pending, PendingKept, ...).
	//
	// WARNING: the guarantee is this process's. Another process may read
	// the value the failed write meant to replace in the moment Redis
	// answers again, before the invalidation lands (about 100 ms): on a
	// Cluster whose master hangs, that moment is the promotion of its
	// replica, which the retries try alongside the master. A process that
	// exits with invalidations pending loses them: Close tries them once
	// more and reports those it could not apply.
	ErrPending = errors.New("packcache: invalidation pending")

	// ErrTrackingRefused is returned by New when a near cache needs CLIENT
	// TRACKING (see WithLocalCache) and a server answered it with an
	// error: a command renamed or removed, as some managed services do, or
	// an ACL that forbids it. The error names the server and quotes its
	// reply. LocalCache.Untracked makes a near cache that needs no
	// tracking.
	ErrTrackingRefused = errors.New("packcache: near cache: CLIENT TRACKING refused")

	// ErrClosed is returned by every call made after Close. It matches
	// nothing else.
	ErrClosed = errors.New("packcache: cache is closed")

	// ErrLoadTimeout reports a load that did not return within
	// WithLoadTimeout. Its callers get it (as an *Error, with
	// context.DeadlineExceeded in the chain too) and nothing is stored,
	// even if the loader returns a value later. It is not a Redis failure.
	ErrLoadTimeout = errors.New("packcache: load timed out")

	// ErrReentrantLoad reports a Get, GetOrLoad or GetOrLoadMany of a key
	// made from inside that key's own load (the loader's context tells):
	// waiting for itself, it would wait until the load timeout. It is
	// returned at once instead.
	ErrReentrantLoad = errors.New("packcache: loader called the cache for the key it is loading")

	// ErrNotLoading reports a StoreWith whose context is not that of a
	// load of its key still running: it changed nothing.
	ErrNotLoading = errors.New("packcache: StoreWith outside a load of the key")

	// ErrNilValue reports a loader that returned a nil pointer and no
	// error for a Cache of a pointer type. A nil pointer would be stored as
	// JSON null and returned as nil to every later caller; a loader says
	// "no such value" with ErrNotFound instead.
	ErrNilValue = errors.New("packcache: loader returned a nil pointer without an error")

	// ErrReservedKey reports a call that names a key the cache keeps for
	// itself (see Reserved): the groups' state under "{packcache:" and the
	// dictionaries under "packcache:". The call read and wrote nothing.
	ErrReservedKey = errors.New("packcache: key reserved for the cache's own use")

	// ErrClientSideCache is returned by New for a go-redis client whose own
	// client-side cache is on (Options.ClientSideCacheConfig or
	// ClientSideCache). Its reads would be answered from go-redis's copy of
	// the bytes, outside the near cache's MaxLag, the cache's invalidations
	// and its rule that writes are never undone: a Get after another
	// process's Delete could return the deleted value. WithLocalCache is
	// the cache's own near cache, kept fresh by Redis tracking.
	ErrClientSideCache = errors.New("packcache: the redis client has go-redis's client-side cache on (Options.ClientSideCacheConfig or ClientSideCache): turn it off and use WithLocalCache")

	// DoNotCache is returned by a Loader together with a value to say the
	// value is to be returned to callers but not stored, for partial or
	// degraded results. Callers see the value and a nil error.
	//
	//lint:ignore ST1012 DoNotCache is a signal, like io.EOF, not a failure: an Err name would mislead.
	DoNotCache = errors.New("packcache: do not cache")
)

// An Error records a failed operation on a key. Every error the cache
// returns for a key, other than ErrMiss, ErrNotFound and context errors from
// a waiting caller, is an *Error.
type Error struct {
	Op  string // "get", "set", "delete", "load", "lease"
	Key string // the key, as the caller gave it
	Err error  // the cause, which errors.Is and errors.As see through
}

func (e *Error) Error() string {
	return prefix + e.Op + " " + strconv.Quote(e.Key) + ": " + detail(e.Err)
}

// prefix begins the message of every error the package makes, once.
const prefix = "packcache: "

// detail is err's message less a leading prefix: how every error here
// that shows another's message shows it (*Error, kindError, the pending
// and Close errors), so that a message begins with "packcache: " and holds
// it once however its errors nest (a sentinel, whose own text has the
// prefix since it may be returned alone, inside an *Error; a
// *PanicError; another cache's error returned by a loader), while
// errors.Is still finds every sentinel in the chain.
func detail(err error) string { return strings.TrimPrefix(err.Error(), prefix) }

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// A PanicError is the error every caller sharing a load gets when the loader
// panics, or when the serializer panics on the loaded value. The process
// does not crash and no caller hangs. Its message is one line, safe to show
// a client; the stack stays in the Stack field, for logs.
type PanicError struct {
	Value any    // the value passed to panic
	Stack []byte // the loader goroutine's stack at the panic
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("packcache: loader panicked: %v", e.Value)
}

// Unwrap returns the panic value if it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// panicError is the error of shared work that panicked.
func panicError(value any, stack []byte) error { return &PanicError{Value: value, Stack: stack} }

// kindError puts a sentinel in front of a cause: errors.Is matches the
// sentinel, errors.As still reaches the cause.
type kindError struct {
	kind error
	err  error
}

func (e *kindError) Error() string   { return e.kind.Error() + ": " + detail(e.err) }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

func redisErr(err error) error         { return &kindError{ErrRedis, err} }
func serializationErr(err error) error { return &kindError{ErrSerialization, err} }

func keyErr(op, key string, err error) error { return &Error{Op: op, Key: key, Err: err} }
