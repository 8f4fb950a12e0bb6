package packcache

import (
	"context"
	"time"

	"github.com/packcache/packcache/codec"
)

// An Observer is told what a cache does, for metrics: the module
// github.com/packcache/packcache/packcacheotel turns these events into
// OpenTelemetry metrics. Set one with WithObserver.
//
// Its methods are called synchronously, on the callers' goroutines and the
// cache's own, often on the hot path: they must be safe for concurrent use,
// return quickly and not call the cache. Events carry the key's prefix (as
// given to WithPrefix; "" for keys under none), never the key itself, so
// that metrics stay bounded.
type Observer interface {
	// ObserveRead is called once per caller of Get and GetOrLoad, and once
	// per key of GetMany and GetOrLoadMany, with the outcome that caller
	// got.
	ObserveRead(ReadEvent)

	// ObserveLoad is called once per loader call (one per batch for
	// GetOrLoadMany), with its duration and outcome.
	ObserveLoad(LoadEvent)

	// ObserveCodec is called once per value encoded for a write and once
	// per value decoded from Redis (not per caller sharing it).
	ObserveCodec(CodecEvent)

	// ObserveRedis is called for every failed Redis operation, when a
	// node's circuit breaker opens or closes, and when the number of
	// pending invalidations changes (see RedisEvent.Pending).
	ObserveRedis(RedisEvent)
}

// A ServeObserver is an Observer that is also told of each response
// Serve writes; packcacheotel's is one. The cache finds it by a type
// assertion on the Observer given to WithObserver.
type ServeObserver interface {
	Observer

	// ObserveServe is called once for each response Serve writes, after
	// writing it.
	ObserveServe(ServeEvent)
}

// A ServeEvent is one response Serve wrote, counted as Stats.Served
// counts it.
type ServeEvent struct {
	Prefix string // the prefix of the key's policy ("" for the cache's own)
	Status int    // the status Serve chose, whatever WithServeError wrote
	Coding string // "zstd", "gzip" or "identity" for a 200, 304 or 412; "" for the others
	Bytes  int    // body bytes written: a 200's body (none for HEAD); 0 for the others
}

// A ReadOutcome is what one reader got.
type ReadOutcome uint8

const (
	ReadHit      ReadOutcome = iota // a value from Redis
	ReadMiss                        // no value in Redis: loaded, or ErrMiss without a loader
	ReadStale                       // a stale value served because its reload failed
	ReadNotFound                    // a remembered ErrNotFound
	ReadError                       // an error
)

var readOutcomeNames = [...]string{"hit", "miss", "stale", "not_found", "error"}

// String returns "hit", "miss", "stale", "not_found" or "error".
func (o ReadOutcome) String() string { return readOutcomeNames[o] }

// A ReadEvent is one reader's outcome.
type ReadEvent struct {
	Prefix  string      // the prefix of the key's policy ("" for the cache's own)
	Outcome ReadOutcome // what the reader got, as Stats counts it
	Shared  bool        // the reader shared a read or load another caller began
	Near    bool        // a hit answered by the near cache (WithLocalCache)
}

// A LoadEvent is one loader call.
type LoadEvent struct {
	Prefix   string        // the prefix of the key's policy ("" for the cache's own)
	Keys     int           // 1, or the number of keys of a GetOrLoadMany call (whose Prefix is its first key's)
	Duration time.Duration // how long the loader took to return
	Err      error         // nil, ErrNotFound, DoNotCache, ErrLoadTimeout, or the loader's error
}

// A CodecEvent is one value encoded or decoded.
type CodecEvent struct {
	Prefix   string        // the prefix of the key's policy ("" for the cache's own)
	Codec    string        // the codec's name; "none" for a value stored plain
	Decode   bool          // false: encoded for a write
	Plain    int           // bytes of the serialized value
	Stored   int           // bytes stored in Redis, header included
	Duration time.Duration // how long the encode or the decode took
}

// A RedisEvent is a failed Redis operation, a circuit breaker opening or
// closing, or a change in the number of pending invalidations.
type RedisEvent struct {
	Prefix string // "" for breaker events
	Node   string // the node's address (a Sentinel client's is "FailoverClient"); "" when unknown
	Err    error  // the failure; nil for breaker events

	// Breaker is "open" or "closed" when the event is the node's circuit
	// breaker changing state, "" for a failed operation.
	Breaker string

	// Pending is the number of invalidations the cache holds for retry
	// (see ErrPending), on an event of its own, with neither Err nor
	// Breaker, whenever it changes: when a failed write is kept for retry
	// and when invalidations land or expire. (The write's failure, if it reached
	// Redis, is an event of its own, and its error goes to the caller and
	// the error handler.) Pending is 0 on the other events.
	Pending int
}

// WithObserver makes the cache tell o what it does; see Observer.
func WithObserver(o Observer) Option {
	return nonNil("WithObserver", "observer", o == nil, func(cfg *config) { cfg.observer = o })
}

// telemetry is the cache's side of what it tells: the Observer, the
// error handler and Serve's response counts. (The counters of Stats are
// the policies', bumped where they are counted.)
type telemetry struct {
	obs     Observer // nil: none
	onError func(ctx context.Context, key string, err error)
	served  servedCounts // Serve's responses (serve.go)
}

// observeCodec tells the observer of a value encoded or decoded since
// start: stored is its stored form, plain the size of its serialized form.
func (t *telemetry) observeCodec(p *policy, stored []byte, plain int, decode bool, start time.Time) {
	name := "none"
	if len(stored) > 0 && codec.IsHeader(stored[0]) {
		if cd, ok := codec.Lookup(stored[0]); ok {
			name = cd.Name()
		} else if stored[0] == codec.HeaderGzip {
			name = "gzip"
		}
	}
	t.obs.ObserveCodec(CodecEvent{Prefix: p.prefix, Codec: name, Decode: decode, Plain: plain, Stored: len(stored), Duration: time.Since(start)})
}

// observePending tells the observer that n invalidations are pending,
// after one was kept or some landed.
func (t *telemetry) observePending(p *policy, n int) {
	if t.obs != nil {
		t.obs.ObserveRedis(RedisEvent{Prefix: p.prefix, Pending: n})
	}
}

// breakerEvents tells an Observer of the breakers opening and closing.
type breakerEvents struct{ obs Observer }

func (e breakerEvents) BreakerChanged(addr string, open bool) {
	if e.obs == nil {
		return
	}
	state := "closed"
	if open {
		state = "open"
	}
	e.obs.ObserveRedis(RedisEvent{Node: addr, Breaker: state})
}
