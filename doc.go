// Package packcache is a read-through cache of typed values, typically large
// JSON documents, in Redis.
//
// Values are serialized (JSON by default) and, above a size threshold,
// compressed with LZ4, Snappy or zstd behind a one-byte header that names
// the codec, so every reader decodes every format whatever its own options
// (see FORMAT.md). Concurrent Gets of one key share one Redis read, one
// decode and, on a miss, one load. A policy per key prefix sets the codec,
// threshold, TTL and loader.
//
// # Where to start
//
// New makes a Cache of one type T over any redis.UniversalClient: a single
// node, Sentinel or Cluster. The client must set ContextTimeoutEnabled, or
// New refuses it. Get reads a key; with a Loader (WithLoader) a miss loads
// it, once per key however many callers wait, and GetOrLoad names the
// loader per call. Set and Delete write; GetMany, SetMany and GetOrLoadMany
// do the same for many keys in one pipeline per node; Serve answers an HTTP
// request with a value. Invalid options are an error from New: zero means
// the default, Off turns a setting off. The README's quick start is a
// complete service.
//
// # Guarantees
//
// Writes are never undone: once Set or Delete of a key returns, no load
// that began before it, in this process or any other, leaves its value in
// Redis, and no Get of this process that starts afterwards returns that
// load's value (see Loader for how, and what it costs).
//
// A Delete, or the store of a Set, that fails on a Redis failure returns
// an error matching ErrPending, and the cache applies the invalidation
// once Redis answers again: the caller need not retry. (Past a bound of
// 32 MiB of pending keys a failed write is not kept, and its error says so.)
//
// Every Redis call the cache makes has a time budget (WithRedisTimeout);
// failures of a node, judged by what the node did and never by a caller's
// context, open that node's circuit breaker (WithCircuitBreaker).
//
// Close is idempotent and safe to call during any call; calls made after
// it fail with ErrClosed.
//
// docs/guarantees.md in the repository says how each holds, at what cost,
// and which tests attack it.
//
// # Reading the source
//
// A miss, a GetOrLoad of a key Redis does not hold, runs through five
// files besides the loader, top to bottom: cache.go (Cache, New, Close,
// and each call's prologue), read.go (the read, shared by concurrent
// callers), roundtrip.go (every Redis call, the read's lease and the
// load's guarded store), loader.go (Loader, and the load) and write.go
// (the Serializer, the encoding, and what a write tells the rest of the
// cache).
// Coalescing is internal/singleflight; the options and policies are
// options.go. docs/CONTRIBUTING.md maps the other files.
package packcache
