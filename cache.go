package packcache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/maypok86/otter/v2"
	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/breaker"
	"github.com/packcache/packcache/internal/dictset"
	"github.com/packcache/packcache/internal/life"
	"github.com/packcache/packcache/internal/owed"
	"github.com/packcache/packcache/internal/singleflight"
)

// A Cache stores values of type T in Redis. It is safe for concurrent use.
//
// A Cache is a typed shell over a core that works in bytes: only what
// must know T (encoding, decoding, handing values out) is compiled for
// each T.
//
// WARNING: values handed to callers that coalesced are shared: callers of
// Get for one key that overlap, or that come within the share window of
// one another (see WithShareWindow), get the same T. With reference types
// ([]byte, slices, maps, pointers) they must treat it as read-only.
// WithDecodePerCaller gives each caller its own.
//
// Keys that begin with "packcache:" or "{packcache:" are the cache's own
// (the groups' state, the dictionaries: see Reserved): every call that
// names one fails with an error matching ErrReservedKey, and reads and
// writes nothing.
type Cache[T any] struct {
	core *cache
}

// New returns a Cache over rdb. Invalid options are reported here, not
// later, and so is a go-redis client whose ContextTimeoutEnabled is false:
// such a client ignores the deadlines the cache bounds each Redis call
// with (WithRedisTimeout), and a hung Redis would stall every caller for
// the client's own timeouts and retries. A client with go-redis's own
// client-side cache on (Options.ClientSideCacheConfig or ClientSideCache)
// is refused with ErrClientSideCache: WithLocalCache is the cache's.
//
// WARNING: a Cluster's or a Ring's node clients are made by its NewClient
// option; one that turns go-redis's client-side cache on for them cannot
// be seen here, and breaks the cache's guarantees as such a client would.
func New[T any](rdb redis.UniversalClient, opts ...Option) (*Cache[T], error) {
	c, err := newCache(rdb, kindOf[T](), opts)
	if err != nil {
		return nil, err
	}
	return &Cache[T]{c}, nil
}

// Get returns the value stored under key.
//
// Without a loader for key, a key that holds no value returns ErrMiss. With
// one (WithLoader, or the Loader of the key's Policy), Get reads through:
// on a miss it calls the loader, stores the value with the key's policy and
// returns it; see Loader for what else read-through does, and for the
// lease that keeps a write made during the load from being undone.
//
// Concurrent Gets of one key in one process share one Redis read, one
// decompression and one decode, and on a miss one loader call. Every
// caller, the first included, waits for the shared work or until its own
// context is done, when it returns ctx.Err() and the work goes on for the
// others: the read runs detached from the first caller's cancellation,
// bounded by the Redis budget (WithRedisTimeout), and the load likewise,
// bounded by WithLoadTimeout. A first caller whose context cannot end reads
// on its own goroutine. The value is shared among them, and with callers
// that come within the share window (see Cache and WithShareWindow). A Set
// or Delete of the key through this cache detaches the reads and loads
// under way from later callers.
//
// When Redis fails, or key's node's circuit breaker is open, a read-through
// Get answers from the loader within the Redis budget plus the load time;
// a Get without a loader returns an error matching ErrRedis (and
// ErrCircuitOpen when the breaker is open). A read-through Get that finds
// Redis unavailable joins the load of key already under way in this
// process, if no write of this process came after it began, rather than
// start another: its value is then what the source held when that load
// began, at most WithLoadTimeout earlier (with WithShareWindow(Off), it
// starts its own). Only a node that failed is
// judged to: a read that ran out of its budget because this process was
// too busy to make it in time (its goroutine waited for a CPU, a
// connection or a dial, while the node answered) is made once more and
// counts as no failure of Redis's; see WithRedisTimeout.
//
// A stored value that cannot be decoded is an error naming the key and
// matching ErrUnknownHeader, ErrCorrupt, ErrTooLarge or ErrSerialization;
// without a loader, the value is left in Redis untouched.
//
// A value written with a zstd dictionary (Policy.Dictionary) is decoded
// with it, whatever this cache's policies say: a dictionary the cache does
// not hold is fetched from Redis once, shared by concurrent Gets (they
// wait for it for up to the Redis budget, whatever their contexts) and
// verified against the id the value names. If Redis does not hold it, or
// holds something else under its key, the error matches
// codec.ErrUnknownDictionary and names the id, and the value is kept: a
// read-through Get answers from the loader and stores nothing over it, as
// when Redis fails.
//
// WARNING: a loader that calls Get for the key it is loading gets
// ErrReentrantLoad; see Loader.
func (c *Cache[T]) Get(ctx context.Context, key string) (T, error) {
	v, err := c.core.getOne(ctx, key, nil)
	return valueOf[T](v), err
}

// GetOrLoad is Get with fn as the loader for this call, whatever loader
// the cache has.
//
// WARNING: concurrent calls for one key share one load, of whichever fn
// came first: the fn of a caller that joined another's load is not called.
func (c *Cache[T]) GetOrLoad(ctx context.Context, key string, fn func(ctx context.Context) (T, error)) (T, error) {
	if fn == nil {
		var zero T
		return zero, errors.New("packcache: GetOrLoad with nil function")
	}
	v, err := c.core.getOne(ctx, key, func(ctx context.Context, _ string) (any, error) {
		v, err := fn(ctx)
		return &v, err
	})
	return valueOf[T](v), err
}

// getOne is Get, and with fn GetOrLoad, in the core: the caller's value,
// as a *T, or an error. It is their prologue (the cache's life, the key's
// policy), beside them so that a read begins in one file; the read itself
// is get (read.go).
func (c *cache) getOne(ctx context.Context, key string, fn loadOne) (any, error) {
	if err := checkKeys(opGet, key); err != nil {
		return nil, err
	}
	if err := c.life.begin(opGet, key); err != nil {
		return nil, err
	}
	defer c.life.Exit()
	p := c.pols.of(key)
	if fn == nil {
		fn = p.loader
	}
	var r result
	err := c.get(ctx, key, p, fn, &r)
	return c.form.value(key, &r, err)
}

// GetMany returns the values stored under keys, in one round trip per
// Redis node. Each key is judged as Get without a loader judges it: keys
// that hold no value, a value past its TTL kept only for StaleFor, a lease
// or a remembered ErrNotFound are absent from the map. Values that cannot
// be decoded, and keys Redis failed on (or whose node's breaker is open),
// are left out of the map and reported in the error, which joins one
// *Error per key; the map holds every value that could be read.
func (c *Cache[T]) GetMany(ctx context.Context, keys []string) (map[string]T, error) {
	m, err := c.core.getMany(ctx, keys, nil)
	return valuesOf[T](m), err
}

// GetOrLoadMany returns the values for keys, reading those Redis holds in
// one round trip per node and loading the others with one call of fn,
// which gets only the keys it must load. Each key is judged and acted on
// as a read-through Get would: a miss, a value past its TTL, an
// undecodable value and a Redis failure load (the last without storing,
// unless WithStrictRedis makes it an error); another process's lease loads
// without storing, or with WithLock is waited for; a value due for refresh
// is returned and refreshed in the background. Keys this process is
// already loading from the same state (by a Get or another GetOrLoadMany)
// are waited for instead of passed to fn. Loaded values are stored with
// their keys' policies, under the same leases and digests as Get's loads,
// so a write during the load is never undone. Keys fn leaves out of its
// map are not found: absent from the result and, with a NegativeTTL,
// remembered as such.
//
// fn runs on a goroutine of the cache's, under a context with the caller's
// values, bounded by WithLoadTimeout; a panic in it becomes a *PanicError
// for its keys. The error joins one *Error per key that failed; the map
// holds every value that could be had. If ctx ends first, the map holds
// what had arrived and the error is ctx.Err().
func (c *Cache[T]) GetOrLoadMany(ctx context.Context, keys []string, fn func(ctx context.Context, missing []string) (map[string]T, error)) (map[string]T, error) {
	if fn == nil {
		return nil, errors.New("packcache: GetOrLoadMany with nil function")
	}
	m, err := c.core.getMany(ctx, keys, manyLoader(func(ctx context.Context, keys []string) (map[string]any, error) {
		vs, err := fn(ctx, keys)
		return pointersTo(vs), err
	}))
	return valuesOf[T](m), err
}

// Set stores value under key with the key's policy: serialized, compressed
// when above the policy's threshold and when that saves at least its
// minimum, with its TTL.
//
// Once Set returns, no load of key that began before it, in any process,
// stores its value over this one, and no Get of this process that starts
// afterwards returns an older value: Set overwrites the lease of a load in
// progress (see Loader) and detaches this process's reads and loads of
// the key from later callers. If Set fails, Redis may or may not hold the
// value; later Gets in this process read afresh either way.
func (c *Cache[T]) Set(ctx context.Context, key string, value T, opts ...SetOption) error {
	return c.core.setOne(ctx, key, &value, opts)
}

// SetMany stores items, each with its key's policy, in one round trip per
// Redis node. The error joins one *Error per key that failed; the others
// are stored. Each stored key has Set's guarantee: no load begun before it
// stores over it.
func (c *Cache[T]) SetMany(ctx context.Context, items map[string]T, opts ...SetOption) error {
	return c.core.setMany(ctx, pointersTo(items), opts)
}

// Delete removes keys. Keys that do not exist are not an error. On Redis
// Cluster the keys may live in different slots.
//
// Once Delete returns, no load of these keys that began before it, in any
// process, stores its value, and no Get of this process that starts
// afterwards returns a value read or loaded before it; see Set.
func (c *Cache[T]) Delete(ctx context.Context, keys ...string) error {
	return c.core.remove(ctx, keys...)
}

// InvalidateGroups invalidates every value stored in any of groups (see
// InGroups) before the call began, in one round trip whatever the
// groups' sizes: no key is read, listed or scanned. Values stored in the
// groups afterwards are served as usual.
//
// Once it returns, no Get, GetMany, GetOrLoad, GetOrLoadMany or Serve
// that starts afterwards, in any process, returns a value that was
// stored in one of the groups before the call began: the near caches of
// this process drop those values at once, another process's within its
// LocalCache.MaxLag, and a read from Redis checks the value's groups (a
// grouped value costs such a read one more command, an MGET on the node
// that holds the groups' records: docs/groups.md). A value so
// invalidated is a miss: a read-through Get loads the key again and
// stores over it, unless it changed meanwhile. A load that began before
// the call stores nothing that a later Get serves, even when its loader
// names its groups only afterwards (StoreWith), and no call of this
// process that starts afterwards joins it.
//
// It fails like Delete: on a Redis failure the error matches ErrPending
// (and ErrRedis) and the cache retries the invalidation until it lands;
// meanwhile this process treats the groups' values as it treats a key
// whose invalidation is owed. An error that does not match ErrPending
// means the invalidation may not have been applied.
//
// Redis keeps, per group, one small key from the first write into the
// group until the last value written into it since would have expired
// (forever, once a value without expiry was), and one counter for all
// groups; InvalidateGroups deletes the group's key. Group names share
// one namespace per Redis database, across caches and applications.
//
// Unlike after a Delete, a Get of another process does not share a read
// or a load of its own whose check of the value's groups began before
// the Get did: it reads again (a grouped value is shared only by the
// calls that join it before its groups are checked, and a read of one is
// not held for the share window). Its near cache may serve the value for
// up to its MaxLag.
//
// WARNING: a value stored by a Set that runs concurrently with the call
// may be invalidated with the others.
func (c *Cache[T]) InvalidateGroups(ctx context.Context, groups ...string) error {
	return c.core.invalidateGroups(ctx, groups)
}

// Serve writes the value of key as the response to r: read through as Get
// reads it (the loader, coalescing, the near cache, StaleFor and
// RefreshAfter all apply, and the read counts in Stats as a Get), under
// r's context.
//
// The body is chosen by the request's Accept-Encoding, whose q-values are
// honoured (a coding at q=0 is refused; among those accepted the highest q
// wins, and on a tie the first of zstd, gzip and identity that the value
// has: browsers accept zstd and gzip alike, and get a stored frame as it
// is, with no body made to compare it with):
//
//   - zstd: a value stored with zstd (header 0x04) is sent as the stored
//     frame, byte for byte, with Content-Encoding: zstd: no decompression,
//     no encoding. Browsers refuse frames whose window exceeds 8 MiB
//     (RFC 9659); such a value, a value written with a dictionary (0x05),
//     and a value stored otherwise (LZ4, Snappy, plain) is served as the
//     serialized value below, never re-encoded as zstd.
//   - gzip: the serialized value gzipped, when it is at least 1 KiB and
//     gzip makes it smaller.
//   - identity: the serialized value as it is. A request without
//     Accept-Encoding gets it, as does one that accepts nothing Serve has
//     unless it refuses identity too (identity;q=0 or *;q=0), which gets
//     406 Not Acceptable.
//
// The serialized value is the stored payload: a plain value as Redis holds
// it, a compressed one decompressed. A value with no stored form to pass
// on (one just loaded, or loaded while Redis fails) is serialized again
// and, when it is at least 1 KiB, compressed for the client: with zstd
// (a frame browsers take) or gzip, as it accepts, zstd on a tie; the next
// request, which reads what the load stored, gets the stored frame.
//
// A Cache of json.RawMessage holds whatever bytes Redis holds: a value
// that is not JSON (written by redis-cli SET, say) is a 500 whose error,
// told to the error handler, matches ErrSerialization; it is never sent as
// application/json. (For other types the serializer reads the value, and
// a value it cannot read is such an error already.)
//
// Every 200 has Content-Type, Content-Length, Vary: Accept-Encoding
// (added to the application's own Vary), and a strong ETag: a hash of
// the body's bytes, marked with its content coding, so that each coding
// of a value has its own. Content-Type is application/json for the JSON
// serializers and for a Cache of json.RawMessage; a Serializer with a
// method ContentType() string names its own; others, and a Cache of
// []byte, get application/octet-stream. A Content-Type the application
// set on w before calling Serve is kept, as are its other headers (such
// as Cache-Control). Conditional requests are answered as net/http's
// ServeContent answers them, against the ETag of the body the request
// would get and the Last-Modified the application set on w, if any
// (RFC 9110, section 13.2.2): an If-Match that lists neither that ETag
// (strong comparison) nor "*", or, without If-Match, an
// If-Unmodified-Since before Last-Modified, is 412 Precondition Failed,
// whatever If-None-Match says; then an If-None-Match that matches the ETag
// (weak comparison), or, without If-None-Match, an If-Modified-Since not
// before Last-Modified, is 304 Not Modified. Both are without a body.
// Without a Last-Modified the dates are ignored, as the RFC asks. HEAD
// gets the headers of GET and no body. Other methods get 405 with Allow:
// GET, HEAD.
//
// Errors are statuses: ErrNotFound and ErrMiss are 404 Not Found;
// ErrClosed, and a failure of Redis (ErrRedis, ErrCircuitOpen) that the
// cache could not answer from a loader, are 503 Service Unavailable, as
// is a read cut short by the end of r's context (the client went away, or
// the server's deadline passed); every other error is 500 Internal Server
// Error. Errors of a 500, and Redis failures other than an open circuit,
// go to the error handler (WithErrorHandler). The body of an error is its
// status text, which names neither the key nor the error, unless
// WithServeError writes it.
//
// With a near cache (WithLocalCache), a hot key costs Serve no Redis read
// and no decompression per request: from the first Serve of a key of a
// near cache on, that near cache keeps with each value it holds the value
// as stored, and the bodies Serve makes from it, each made once (the
// decompressed value and its gzipped form, as clients ask for them) and
// weighed in its bound: an entry weighs what it did for Get (its key, its
// serialized length and an overhead) plus the stored value and the bodies
// made. An entry made before that first Serve is replaced on its next
// Serve by a read of Redis. Invalidation and the TTL rule these as they
// rule the entry: they are the entry.
//
// With Policy.Deltas, Serve speaks RFC 9842 (Compression Dictionary
// Transport) for the prefix's keys. Every response about a body offers
// it as a dictionary for the request's path (Use-As-Dictionary, with the
// body's ETag as its id), adds Available-Dictionary to Vary, and, unless
// the application set Cache-Control on w, sends Cache-Control: max-age
// of Deltas, since a browser keeps a dictionary only while its response
// is fresh (a client then asks for a newer version with a revalidating
// fetch, cache: 'no-cache'). The version sent is kept in Redis for Deltas
// (the last 4 versions of a key at most; FORMAT.md section 10), written
// in the background the first time this process sends it and again
// every half Deltas while it sends it, never by a request's own round
// trip. A request whose Accept-Encoding names dcz and whose
// Available-Dictionary names a version of the key Redis still keeps, by
// any process of the fleet, gets the value as dcz: a zstd frame made
// with that version as its dictionary, in a body that begins with the
// dcz magic and the version's SHA-256, with an ETag of its own, and
// conditional requests answered against that ETag (a client holding the
// value itself, revalidating the dcz body it got, gets 304 where that
// delta is kept). The delta against
// each version is made once, by the first request that names it (one
// Redis call), and kept: with a near cache in the entry (and weighed in
// its bound), so that a hot key costs one encode per version its clients
// hold; without one, in a set of this process's of at most 128 deltas of
// up to 64 KiB. A request naming a version that is not kept costs a Redis
// call each time. Anything else (no dcz, an Available-Dictionary malformed or of
// a version not kept or past Deltas, the value itself, a delta no
// smaller than the body the request would get) gets that body, as above:
// a delta is never the cause of an error. A failure to read the versions
// goes to the error handler (but for an open circuit).
//
// WARNING: for a key that holds a value written by another writer with a
// zstd frame whose content is not what the serializer would read (say, a
// document in another format), Serve passes the frame on all the same:
// the stored frame is what it sends.
func (c *Cache[T]) Serve(w http.ResponseWriter, r *http.Request, key string) {
	c.core.serve(w, r, key)
}

// Stats returns a snapshot of the cache's counters.
func (c *Cache[T]) Stats() Stats { return c.core.stats() }

// Close closes the cache. Calls made after Close begins fail with an error
// matching ErrClosed. Close waits for the calls under way and the cache's
// background work (shared reads, loads, refreshes) to end; they are
// bounded by the load timeout and the Redis budget, and Close waits no
// longer than their sum. Work still running then (a loader that ignores
// its context) has its context cancelled, and Close returns an error
// saying so. Calls under way are not cancelled before that bound: a server
// should stop taking requests and let those in progress finish (for
// net/http, Shutdown the http.Server) before it closes the cache, or those
// requests fail with ErrClosed.
//
// Invalidations still pending (see ErrPending) are tried once more, for
// at most the Redis budget plus the time one needs to settle (about 100
// ms); those that could not be applied are reported in Close's error,
// which matches ErrRedis and names how many there were. Redis may still
// hold the values their writes meant to replace, until their TTLs end.
//
// A goroutine that ran a load or a shared read stays parked for up to
// 100 ms after it, for the next one; Close ends those at once. A leak
// check (goleak) on a cache that was not closed may see them for that
// long.
//
// Close does not close the Redis client. It is idempotent and safe to call
// concurrently with any call, and with itself.
func (c *Cache[T]) Close() error { return c.core.close() }

// A kind is what the core knows of the cache's T. Values pass through
// the core as an any holding a *T, so that a value decoded once is handed
// to each caller without another allocation.
type kind struct {
	t   reflect.Type
	raw bool // T is []byte or json.RawMessage: stored as is

	new       func() any                  // a new *T
	fromBytes func(b []byte) any          // raw T: b as a *T
	bytes     func(v any) []byte          // raw T: the bytes a *T holds
	isNil     func(v any) bool            // pointer T: whether a *T holds nil; nil for other T
	loader    func(l any) (loadOne, bool) // a Loader[T] as the core's loader
}

// A loadOne is a loader of one key, as the core calls it: it returns a
// *T.
type loadOne func(ctx context.Context, key string) (any, error)

func kindOf[T any]() kind {
	t := reflect.TypeFor[T]()
	k := kind{
		t:   t,
		raw: t == reflect.TypeFor[[]byte]() || t == reflect.TypeFor[json.RawMessage](),
		new: func() any { return new(T) },
		fromBytes: func(b []byte) any {
			v := new(T)
			*(*[]byte)(unsafe.Pointer(v)) = b
			return v
		},
		bytes: func(v any) []byte {
			if p, _ := v.(*T); p != nil {
				return *(*[]byte)(unsafe.Pointer(p))
			}
			return nil
		},
		loader: func(l any) (loadOne, bool) {
			ld, ok := l.(Loader[T])
			if !ok {
				return nil, false
			}
			return func(ctx context.Context, key string) (any, error) {
				v, err := ld.Load(ctx, key)
				return &v, err
			}, true
		},
	}
	if t.Kind() == reflect.Pointer {
		k.isNil = func(v any) bool { return *(*unsafe.Pointer)(unsafe.Pointer(v.(*T))) == nil }
	}
	return k
}

// valueOf is the T a *T from the core holds, or T's zero value for none.
func valueOf[T any](v any) T {
	if p, _ := v.(*T); p != nil {
		return *p
	}
	var zero T
	return zero
}

// valuesOf is a map of *T from the core as a map of T.
func valuesOf[T any](m map[string]any) map[string]T {
	return mapValues(m, valueOf[T])
}

// pointersTo is a map of T as the core takes it: a map of *T.
func pointersTo[T any](m map[string]T) map[string]any {
	return mapValues(m, func(v T) any { return &v })
}

// mapValues is m with f applied to each value; nil if m is nil.
func mapValues[V, W any](m map[string]V, f func(V) W) map[string]W {
	if m == nil {
		return nil
	}
	out := make(map[string]W, len(m))
	for k, v := range m {
		out[k] = f(v)
	}
	return out
}

// tombstone is the whole stored value that remembers a loader's
// ErrNotFound. See FORMAT.md.
const tombstone = codec.HeaderTombstone

// cache is the byte-level core behind a Cache[T]: everything but the
// value's type, which kind describes. Values pass through it as an any
// holding a *T (nil: none).
type cache struct {
	// The parts, each a type that holds what its methods need, wired
	// together by newCache (docs/CONTRIBUTING.md maps them).
	remote remote      // Redis: the client, its nodes, and every call made to them (roundtrip.go)
	form   form        // how values are stored: serializer, codecs, size limit (write.go)
	pols   policies    // the base policy and the prefixes' (cache.go)
	tel    telemetry   // the observer, the error handler, Serve's counts (observer.go)
	groups groupState  // groups in use, and their records (groups.go)
	life   lifetime    // calls and goroutines under way, and the load timeout (cache.go, internal/life)
	owed   owed.Ledger // invalidations owed after a write failed on Redis, retried (internal/owed, pending.go)
	vers   versions    // the versions Serve sent, for Policy.Deltas (versions.go)

	coalesce   bool // WithCoalescing
	strict     bool // WithStrictRedis
	lockWait   time.Duration
	serveError ServeErrorFunc

	// Coalescing, where concurrent callers share work, is
	// internal/singleflight: the reads of Get, GetOrLoad and Serve are
	// shared by a Group, their work being flight.Run (read.go), and run
	// on goroutines it registers with the cache's life; the loads are shared by a
	// Registry, among the reads that found the same state of a key
	// (loader.go). (The dictionary set's fetches are a Group too:
	// internal/dictset.)
	lookups singleflight.Group[result, flight] // Gets without a loader: read and decode
	reads   singleflight.Group[result, flight] // Gets with a loader: read, decode, and load on a miss
	loads   singleflight.Registry[result]      // loads, shared by the reads that found the same state

	// The near caches (WithLocalCache), and the marks that keep a read
	// begun before a write out of them. (Their invalidation stream is
	// remote's tracker.)
	nears     []*near
	marks     marks
	nearOnce  sync.Once
	nearClock *otter.CoarseClock // otter's clock for the near caches' expiry (see newNear)
}

// policy is a Policy resolved: every field set, in the form the cache
// uses, with its counters.
type policy struct {
	prefix       string
	codec        codec.Codec
	compress     bool // whether values above threshold are compressed
	threshold    int  // values longer than this are compressed
	minSaving    int  // bytes compression must save, at least 1
	ttl          time.Duration
	jitter       float64       // 0: none
	loader       loadOne       // nil: none
	negativeTTL  time.Duration // 0: not remembered
	refreshAfter time.Duration // 0: no refresh
	staleFor     time.Duration // 0: no stale window
	deltas       time.Duration // 0: no versions kept, no deltas (versions.go)
	near         *near         // nil: no near cache
	stats        *counters

	// The policy's zstd dictionary, if any, and the dictionary set's way
	// to Redis for keys under the policy (dict.go).
	dict      *dictset.Writer // nil: no dictionary; else codec is its codec
	undict    codec.Codec     // with dict: the zstd codec of its level, for when it cannot be published
	dictRedis dictRedis
}

const (
	fromRedis  source = iota
	fromLoader        // a load
	fromNear          // the near cache
)

// newCache is New for a T that k describes.
func newCache(rdb redis.UniversalClient, k kind, opts []Option) (*cache, error) {
	if rdb == nil {
		return nil, errors.New("packcache: nil redis client")
	}
	if err := checkClient(rdb); err != nil {
		return nil, err
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("packcache: %w", err)
		}
	}
	if err := cfg.applyEnv(); err != nil {
		return nil, fmt.Errorf("packcache: %w", err)
	}
	c := &cache{
		remote: remote{
			rdb:          rdb,
			redisTimeout: cfg.redisTimeout,
			nodes:        breaker.New(rdb, cfg.breaker, breakerEvents{cfg.observer}, cfg.redisTimeout),
		},
		coalesce:   cfg.coalesce,
		strict:     cfg.strict,
		lockWait:   cfg.lockWait,
		serveError: cfg.serveError,
		tel:        telemetry{obs: cfg.observer, onError: cfg.errorHandler},
	}
	c.form = form{ser: cfg.serializer, text: cfg.serializer.Text(), kind: k, maxSize: cfg.maxValueSize, perCaller: cfg.perCaller, tel: &c.tel}
	c.remote.life, c.remote.tel, c.remote.pols = &c.life, &c.tel, &c.pols
	c.groups.remote, c.groups.pols, c.groups.owed = &c.remote, &c.pols, &c.owed
	for _, g := range []*singleflight.Group[result, flight]{&c.lookups, &c.reads} {
		g.Init(cfg.shareWindow, &c.life.Life, panicError)
	}
	c.loads.SetWindow(cfg.shareWindow) // for loads begun with Redis unreachable
	c.life.init(cfg.loadTimeout)
	c.remote.leases.init(c.remote.nodes, c.remote.redisTimeout)
	c.owed.Init(owedStore{c}, c.remote.redisTimeout)
	var err error
	if c.pols.base, err = resolve(c, "", cfg.base); err != nil {
		return nil, cfg.envErr("", err)
	}
	for _, prefix := range cfg.sortedPrefixes() {
		p, err := resolve(c, prefix, cfg.prefixPolicy(prefix))
		if err != nil {
			return nil, cfg.envErr(prefix, err)
		}
		c.pols.prefixes = append(c.pols.prefixes, p)
	}
	// Both before the near cache's tracker loads a Cluster's slot map,
	// which makes its node clients: they are watched as they are made.
	c.remote.peers.watch(rdb)
	c.remote.nodes.Watch(rdb)
	if err := c.startNear(rdb, cfg); err != nil {
		c.remote.nodes.Close()
		return nil, err
	}
	return c, nil
}

// checkClient refuses a go-redis client that ignores context deadlines,
// and one whose own client-side cache is on. A client is known by its
// Options method, so that a type embedding one of go-redis's is checked
// as that client is.
func checkClient(rdb redis.UniversalClient) error {
	var on bool
	switch c := rdb.(type) {
	case interface{ Options() *redis.Options }:
		o := c.Options()
		on = o.ContextTimeoutEnabled
		if o.ClientSideCacheConfig != nil || !isNil(o.ClientSideCache) {
			return ErrClientSideCache
		}
	case interface{ Options() *redis.ClusterOptions }:
		on = c.Options().ContextTimeoutEnabled
	case interface{ Options() *redis.RingOptions }:
		on = c.Options().ContextTimeoutEnabled
	default:
		return nil // a client of another kind: its deadlines are its own
	}
	if !on {
		return errors.New("packcache: the redis client ignores context deadlines: set ContextTimeoutEnabled: true in its options, so that the cache's Redis time budget (WithRedisTimeout) bounds each call")
	}
	return nil
}

// isNil reports whether v is nil, or holds a nil pointer.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	r := reflect.ValueOf(v)
	return r.Kind() == reflect.Pointer && r.IsNil()
}

// resolve turns a merged Policy into c's form of it. Its dictionary, if
// any, joins c.dicts.
func resolve(c *cache, prefix string, p Policy) (*policy, error) {
	rp := &policy{
		stats:     &counters{},
		prefix:    prefix,
		codec:     p.Codec,
		compress:  p.CompressAbove != Off && p.Codec.ID() != codec.HeaderNone,
		threshold: max(p.CompressAbove, 0),
		minSaving: max(p.MinSaving, 1),
		ttl:       p.TTL,
		jitter:    max(p.TTLJitter, 0),
	}
	switch p.CompressAbove {
	case CompressAll:
		rp.threshold = 0
	case 0:
		rp.threshold = defaultCompressAbove
		if p.Dictionary != nil {
			rp.threshold = codec.DictionaryCompressAbove
		}
	}
	if p.Dictionary != nil {
		d, dc, err := c.form.dicts.Writer(p.Dictionary, p.Codec)
		if err != nil {
			return nil, fmt.Errorf("packcache: prefix %q: %w", prefix, err)
		}
		if rp.compress {
			rp.dict, rp.codec, rp.undict = d, dc, p.Codec
		}
	}
	rp.dictRedis = dictRedis{c, rp}
	rp.negativeTTL, rp.refreshAfter, rp.staleFor = max(p.NegativeTTL, 0), max(p.RefreshAfter, 0), max(p.StaleFor, 0)
	rp.deltas = max(p.Deltas, 0)
	if p.Loader != nil && p.Loader != any(Off) {
		l, ok := c.form.kind.loader(p.Loader)
		if !ok {
			return nil, fmt.Errorf("packcache: loader for prefix %q is a %T, not a Loader[%s]", prefix, p.Loader, c.form.kind.t)
		}
		rp.loader = l
	}
	if rp.refreshAfter > 0 && rp.ttl != Off && rp.refreshAfter >= rp.ttl {
		return nil, fmt.Errorf("packcache: prefix %q: RefreshAfter %v is not shorter than TTL %v", prefix, rp.refreshAfter, rp.ttl)
	}
	return rp, nil
}

// The keys the cache keeps for itself. Every key the cache writes other
// than the caller's own begins with one of reservedPrefixes: the groups'
// sequence and records ({packcache:g}, groups.go), the dictionaries
// (packcache:dict:, codec.DictionaryKey), and whatever a later release
// keeps beside them. A call that names such a key is refused before it
// reads or writes anything (checkKeys), so that no Set, SetMany, Delete
// or load can change the cache's own state, and no Get can hand it out as
// a value.
var reservedPrefixes = [...]string{"packcache:", "{packcache:"}

// Reserved reports whether key is one the cache keeps for itself: it
// begins with "packcache:" or "{packcache:". Every call that names such a
// key (Get, GetOrLoad, GetMany, GetOrLoadMany, Set, SetMany, Delete,
// Serve) fails as a whole, before it reads or writes anything, with an
// error naming the key and matching ErrReservedKey; Serve answers it with
// 404 Not Found.
func Reserved(key string) bool {
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// checkKeys refuses a call of op naming a key the cache keeps for itself:
// an *Error naming the first such key, matching ErrReservedKey.
func checkKeys(op string, keys ...string) error {
	for _, k := range keys {
		if Reserved(k) {
			return keyErr(op, k, ErrReservedKey)
		}
	}
	return nil
}

// lifetime is the cache's life (internal/life: the calls and goroutines
// under way, which Close waits for) and what ends background work that
// outlives Close's wait.
type lifetime struct {
	life.Life
	loadTimeout time.Duration   // bounds every load, and how long a late Redis call is made again
	ctx         context.Context // ends background work that outlives Close's wait
	cancel      context.CancelFunc
}

func (l *lifetime) init(loadTimeout time.Duration) {
	l.Init()
	l.loadTimeout = loadTimeout
	l.ctx, l.cancel = context.WithCancel(context.Background())
}

// begin registers a call of op on key (a batch call's first key) with the
// cache's life, or returns the error every call made once the cache is
// closed returns: an *Error naming op and key, matching ErrClosed.
func (l *lifetime) begin(op, key string) error {
	if !l.Enter() {
		return keyErr(op, key, ErrClosed)
	}
	return nil
}

// close is Close.
func (c *cache) close() error {
	idle := c.life.Close()
	defer c.closeNear()
	defer c.remote.nodes.Close()
	t := time.NewTimer(c.life.loadTimeout + 2*c.remote.redisTimeout)
	defer t.Stop()
	select {
	case <-idle:
		return closeOwed(&c.owed, &c.remote.peers)
	case <-t.C:
	}
	c.life.cancel()
	t.Reset(c.remote.redisTimeout)
	select {
	case <-idle:
		return closeOwed(&c.owed, &c.remote.peers)
	case <-t.C:
		return errors.Join(fmt.Errorf("packcache: Close: %d calls or loads still running %v after Close began (a loader ignoring its context?)",
			c.life.Running(), c.life.loadTimeout+3*c.remote.redisTimeout), closeOwed(&c.owed, &c.remote.peers))
	}
}

// stats is Stats.
func (c *cache) stats() Stats {
	s := Stats{Prefixes: make(map[string]Counters, len(c.pols.prefixes)+1)}
	s.Counters.Codecs = map[string]CodecStats{}
	for _, p := range append([]*policy{c.pols.base}, c.pols.prefixes...) {
		snap := p.stats.snapshot()
		s.Prefixes[p.prefix] = snap
		s.Counters.add(snap)
	}
	for _, n := range c.nears {
		s.NearBytes += n.entries.WeightedSize()
	}
	s.NearServing = len(c.nears) > 0 && c.nears[0].gate.Open()
	o := c.owed.Stats()
	s.Pending, s.PendingKept, s.PendingApplied, s.PendingExpired, s.PendingDropped = o.Owed, o.Kept, o.Applied, o.Expired, o.Dropped
	c.remote.nodes.Each(func(b *breaker.Node) {
		open, since := b.State()
		s.Breakers = append(s.Breakers, BreakerState{Addr: b.Addr(), Open: open, Since: since})
	})
	s.Served = c.tel.served.snapshot()
	return s
}

// closeNear stops the near caches' goroutines, once.
func (c *cache) closeNear() {
	c.nearOnce.Do(func() {
		if c.remote.tracker != nil {
			c.remote.tracker.Close()
		}
		for _, n := range c.nears {
			n.entries.StopAllGoroutines()
		}
		if c.nearClock != nil {
			c.nearClock.Stop()
		}
		c.changed(flushed)
	})
}

// policies are a cache's policies: the base policy, and those of its
// prefixes, longest first.
type policies struct {
	base     *policy
	prefixes []*policy
}

// of is key's policy: that of its longest prefix with one, else the base.
func (ps *policies) of(key string) *policy {
	for _, p := range ps.prefixes {
		if strings.HasPrefix(key, p.prefix) {
			return p
		}
	}
	return ps.base
}

// report gives err, a failure no caller gets, to the error handler.
func (t *telemetry) report(ctx context.Context, key string, err error) {
	if t.onError != nil {
		t.onError(ctx, key, err)
	}
}
