// Package packcacheotel records what a packcache.Cache does as OpenTelemetry
// metrics. It is a module of its own, so that packcache itself does not
// depend on OpenTelemetry:
//
//	obs, err := packcacheotel.NewObserver(packcacheotel.WithAttributes(attribute.String("packcache.cache", "orders")))
//	if err != nil { ... }
//	c, err := packcache.New[Order](rdb, packcache.WithObserver(obs))
//
// # Instruments
//
// All instruments belong to the meter named
// "github.com/packcache/packcache/packcacheotel". Names and units follow the
// OpenTelemetry conventions (a Prometheus exporter turns packcache.reads
// into packcache_reads_total and packcache.load.duration, in seconds, into
// packcache_load_duration_seconds):
//
//	packcache.reads            counter, {read}     one per caller of Get and GetOrLoad, and per key of GetMany and GetOrLoadMany
//	                                               attributes: packcache.prefix, packcache.outcome, packcache.shared, packcache.near
//	packcache.load.duration    histogram, s        one per loader call (one per batch of GetOrLoadMany)
//	                                               attributes: packcache.prefix, packcache.outcome
//	packcache.load.keys        counter, {key}      the keys asked of those loader calls
//	                                               attributes: packcache.prefix, packcache.outcome
//	packcache.codec.bytes      counter, By         bytes of the values encoded for writes and decoded from Redis
//	                                               attributes: packcache.prefix, packcache.codec.name, packcache.codec.direction, packcache.codec.form
//	packcache.codec.duration   histogram, s        one per value encoded or decoded
//	                                               attributes: packcache.prefix, packcache.codec.name, packcache.codec.direction
//	packcache.redis.errors     counter, {error}    failed Redis operations
//	                                               attributes: packcache.prefix, server.address, server.port, error.type
//	packcache.breaker.open     gauge, {breaker}    1 while a node's circuit breaker is open, 0 while it is closed
//	                                               attributes: server.address, server.port
//	packcache.breaker.trips    counter, {trip}     times a node's circuit breaker opened
//	                                               attributes: server.address, server.port
//	packcache.invalidations.pending
//	                           gauge, {invalidation}
//	                                               invalidations of failed writes the cache holds for retry (packcache.ErrPending)
//	                                               attributes: those of WithAttributes only
//	packcache.serve.responses  counter, {response} one per response Cache.Serve writes, as packcache.Stats.Served counts it
//	                                               attributes: packcache.prefix, http.response.status_code, packcache.serve.coding
//	packcache.serve.bytes      counter, By         body bytes Serve sent (a 200's body; none for HEAD)
//	                                               attributes: packcache.prefix, http.response.status_code, packcache.serve.coding
//
// # Attributes
//
//	packcache.prefix            the key's prefix as given to packcache.WithPrefix; "" for keys under none
//	packcache.outcome           on packcache.reads: what the caller got: "hit" (a value from Redis),
//	                            "miss" (no value in Redis: loaded, or ErrMiss without a loader),
//	                            "stale" (a stale value served because its reload failed),
//	                            "not_found" (a remembered or fresh ErrNotFound), "error"
//	                            on packcache.load.*: what the loader did: "ok", "not_found" (ErrNotFound),
//	                            "do_not_cache" (a value with DoNotCache), "timeout" (ErrLoadTimeout),
//	                            "panic" (a *packcache.PanicError), "error" (any other error)
//	packcache.shared            true when the caller shared a Redis read or a load that another caller
//	                            began: reads with packcache.shared=true and packcache.outcome="miss"
//	                            are the callers that waited on another's load (coalesced waits)
//	packcache.near              true for a hit the near cache answered (packcache.WithLocalCache)
//	packcache.codec.name        the codec's name ("zstd", "lz4", "snappy", "gzip", a custom codec's
//	                            name), or "none" for a value stored uncompressed
//	packcache.codec.direction   "encode" (serialize and compress for a write) or "decode"
//	                            (decompress and deserialize a value read from Redis)
//	packcache.codec.form        "plain" (the serialized value) or "stored" (the bytes Redis holds,
//	                            header included): stored over plain is the compression ratio
//	server.address, server.port the Redis node: its address as the client names it ("FailoverClient"
//	                            for a Sentinel client), on a single node as on a Cluster; absent only
//	                            for a Cluster's shared breaker of calls whose master is unknown
//	http.response.status_code   the status Serve wrote (200, 304, 404, 412, 500, 503, ...)
//	packcache.serve.coding      the body's content coding, "zstd", "gzip" or "identity", for a 200, 304
//	                            or 412; "" for the others
//	error.type                  "timeout" (the cache's Redis budget or a network timeout),
//	                            "canceled", "network" (refused, reset, closed connections),
//	                            "pool_timeout" (no pooled connection in time), the code of a
//	                            Redis error reply ("LOADING", "CLUSTERDOWN", "ERR", ...), or "_OTHER"
//
// Constant attributes given with WithAttributes (a cache's name, say) are
// added to every measurement.
//
// # Cost
//
// Instruments are created once, in NewObserver. Each combination of
// attributes is turned into an attribute set once, the first time it is
// seen, and kept: recording an event costs a map lookup and the SDK's own
// work, and allocates nothing. BenchmarkGetHit measures it against a real
// redis-server.
//
// WARNING: give each Cache an Observer of its own. The breaker gauge keeps
// one state per node as told by the cache's breaker events; two caches
// sharing an Observer and a node would overwrite each other's state. Tell
// caches apart with WithAttributes.
package packcacheotel

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/packcache/packcache"
)

// ScopeName is the name of the meter, the instrumentation scope, that
// records packcache's metrics.
const ScopeName = "github.com/packcache/packcache/packcacheotel"

// An Option configures NewObserver.
type Option func(*config) error

type config struct {
	mp    metric.MeterProvider
	attrs []attribute.KeyValue
}

// WithMeterProvider records the metrics with mp instead of the global
// provider, otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) error {
		if mp == nil {
			return errors.New("packcacheotel: WithMeterProvider: nil provider")
		}
		c.mp = mp
		return nil
	}
}

// WithAttributes adds attrs to every measurement, for example the name of
// the cache: attribute.String("packcache.cache", "orders"). Their keys must
// be valid and must not be one of the attributes the observer sets itself.
// It may be given more than once; the attributes add up.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return func(c *config) error {
		for _, kv := range attrs {
			if !kv.Valid() {
				return fmt.Errorf("packcacheotel: WithAttributes: invalid attribute %q", kv.Key)
			}
			if ownKeys[kv.Key] {
				return fmt.Errorf("packcacheotel: WithAttributes: %q is set by the observer itself", kv.Key)
			}
		}
		c.attrs = append(c.attrs, attrs...)
		return nil
	}
}

// The attribute keys the observer sets.
const (
	keyPrefix    = attribute.Key("packcache.prefix")
	keyOutcome   = attribute.Key("packcache.outcome")
	keyShared    = attribute.Key("packcache.shared")
	keyNear      = attribute.Key("packcache.near")
	keyCodec     = attribute.Key("packcache.codec.name")
	keyDirection = attribute.Key("packcache.codec.direction")
	keyForm      = attribute.Key("packcache.codec.form")
	keyAddress   = attribute.Key("server.address")
	keyPort      = attribute.Key("server.port")
	keyErrorType = attribute.Key("error.type")
	keyStatus    = attribute.Key("http.response.status_code")
	keyCoding    = attribute.Key("packcache.serve.coding")
)

var ownKeys = map[attribute.Key]bool{
	keyPrefix: true, keyOutcome: true, keyShared: true, keyNear: true, keyCodec: true, keyDirection: true,
	keyForm: true, keyAddress: true, keyPort: true, keyErrorType: true, keyStatus: true, keyCoding: true,
}

// Bucket boundaries, in seconds. Loads call databases and services: a
// millisecond to half a minute (the default load timeout). Encoding and
// decoding a value take microseconds for a kilobyte, milliseconds for
// megabytes. A metric.View can replace either.
var (
	loadBuckets  = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
	codecBuckets = []float64{5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1}
)

// observer is the packcache.Observer that NewObserver returns.
type observer struct {
	reads       metric.Int64Counter
	loadTime    metric.Float64Histogram
	loadKeys    metric.Int64Counter
	codecBytes  metric.Int64Counter
	codecTime   metric.Float64Histogram
	redisErrors metric.Int64Counter
	trips       metric.Int64Counter
	responses   metric.Int64Counter
	sent        metric.Int64Counter

	base     []attribute.KeyValue // the constant attributes, from WithAttributes
	prefixes table[prefixSets]    // by prefix
	nodes    table[nodeSets]      // by node address

	mu   sync.Mutex
	open map[*nodeSets]bool // the state of each node's breaker, as its last event told

	pending atomic.Int64 // the pending invalidations, as the last event told
}

// NewObserver returns a packcache.Observer that records the cache's events
// as the instruments listed in the package documentation. Pass it to
// packcache.WithObserver.
//
// The Observer is also a packcache.ServeObserver: the cache tells it of
// Serve's responses.
func NewObserver(opts ...Option) (packcache.Observer, error) {
	var cfg config
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.mp == nil {
		cfg.mp = otel.GetMeterProvider()
	}
	m := cfg.mp.Meter(ScopeName)
	o := &observer{base: cfg.attrs, open: map[*nodeSets]bool{}}
	var errs [11]error
	o.reads, errs[0] = m.Int64Counter("packcache.reads", metric.WithUnit("{read}"),
		metric.WithDescription("Reads of the cache, one per caller or per key of a batch, by what the caller got."))
	o.loadTime, errs[1] = m.Float64Histogram("packcache.load.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of loader calls."), metric.WithExplicitBucketBoundaries(loadBuckets...))
	o.loadKeys, errs[2] = m.Int64Counter("packcache.load.keys", metric.WithUnit("{key}"),
		metric.WithDescription("Keys asked of loader calls."))
	o.codecBytes, errs[3] = m.Int64Counter("packcache.codec.bytes", metric.WithUnit("By"),
		metric.WithDescription("Bytes of the values encoded and decoded, serialized (plain) and as stored in Redis (stored)."))
	o.codecTime, errs[4] = m.Float64Histogram("packcache.codec.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of encoding a value (serializing and compressing) or decoding one (decompressing and deserializing)."),
		metric.WithExplicitBucketBoundaries(codecBuckets...))
	o.redisErrors, errs[5] = m.Int64Counter("packcache.redis.errors", metric.WithUnit("{error}"),
		metric.WithDescription("Failed Redis operations."))
	o.trips, errs[6] = m.Int64Counter("packcache.breaker.trips", metric.WithUnit("{trip}"),
		metric.WithDescription("Times a Redis node's circuit breaker opened."))
	_, errs[7] = m.Int64ObservableGauge("packcache.breaker.open", metric.WithUnit("{breaker}"),
		metric.WithDescription("1 while a Redis node's circuit breaker is open, 0 while it is closed."),
		metric.WithInt64Callback(o.observeBreakers))
	_, errs[8] = m.Int64ObservableGauge("packcache.invalidations.pending", metric.WithUnit("{invalidation}"),
		metric.WithDescription("Invalidations of failed writes that the cache holds for retry (see packcache.ErrPending)."),
		metric.WithInt64Callback(func(_ context.Context, obs metric.Int64Observer) error {
			obs.Observe(o.pending.Load(), metric.WithAttributes(o.base...))
			return nil
		}))
	o.responses, errs[9] = m.Int64Counter("packcache.serve.responses", metric.WithUnit("{response}"),
		metric.WithDescription("Responses Cache.Serve wrote, by status and content coding."))
	o.sent, errs[10] = m.Int64Counter("packcache.serve.bytes", metric.WithUnit("By"),
		metric.WithDescription("Body bytes Cache.Serve sent, by status and content coding."))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("packcacheotel: creating instruments: %w", err)
	}
	// The gauge has a series per node from the start: the cache tells of
	// each node it knows, closed, with its address (a single node's as
	// the cache is made, a Cluster master's at its first call).
	return o, nil
}

// ObserveServe counts one response of Cache.Serve.
func (o *observer) ObserveServe(e packcache.ServeEvent) {
	s := o.prefix(e.Prefix).served(e.Status, e.Coding)
	o.responses.Add(context.Background(), 1, s...)
	if e.Bytes > 0 {
		o.sent.Add(context.Background(), int64(e.Bytes), s...)
	}
}

// ObserveRead counts one reader's outcome.
func (o *observer) ObserveRead(e packcache.ReadEvent) {
	if int(e.Outcome) >= numReadOutcomes {
		return // an outcome newer than this module
	}
	p := o.prefix(e.Prefix)
	o.reads.Add(context.Background(), 1, p.reads[e.Outcome][b2i(e.Shared)][b2i(e.Near)]...)
}

// ObserveLoad records one loader call.
func (o *observer) ObserveLoad(e packcache.LoadEvent) {
	p := o.prefix(e.Prefix)
	s := &p.loads[loadOutcome(e.Err)]
	o.loadTime.Record(context.Background(), e.Duration.Seconds(), s.record...)
	o.loadKeys.Add(context.Background(), int64(e.Keys), s.add...)
}

// ObserveCodec records one value encoded or decoded.
func (o *observer) ObserveCodec(e packcache.CodecEvent) {
	c := o.prefix(e.Prefix).codec(e.Codec)
	d := b2i(e.Decode)
	o.codecBytes.Add(context.Background(), int64(e.Plain), c.bytes[d][formPlain]...)
	o.codecBytes.Add(context.Background(), int64(e.Stored), c.bytes[d][formStored]...)
	o.codecTime.Record(context.Background(), e.Duration.Seconds(), c.time[d]...)
}

// ObserveRedis counts a failed Redis operation, or records a breaker
// opening or closing, or how many invalidations are pending.
func (o *observer) ObserveRedis(e packcache.RedisEvent) {
	if e.Breaker == "" && e.Err == nil {
		o.pending.Store(int64(e.Pending))
		return
	}
	n := o.node(e.Node)
	if e.Breaker != "" {
		open := e.Breaker == "open"
		o.mu.Lock()
		o.open[n] = open
		o.mu.Unlock()
		if open {
			o.trips.Add(context.Background(), 1, n.add...)
		}
		return
	}
	if e.Err == nil {
		return
	}
	o.redisErrors.Add(context.Background(), 1, o.prefix(e.Prefix).redisError(n, redisErrorType(e.Err))...)
}

// observeBreakers reports the state of every breaker heard of.
func (o *observer) observeBreakers(_ context.Context, obs metric.Int64Observer) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	for n, open := range o.open {
		obs.Observe(int64(b2i(open)), n.observe...)
	}
	return nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// loadOutcome names what a loader call's error says.
func loadOutcome(err error) loadOutcomeIndex {
	switch {
	case err == nil:
		return loadOK
	case errors.Is(err, packcache.ErrNotFound):
		return loadNotFound
	case errors.Is(err, packcache.DoNotCache):
		return loadDoNotCache
	case errors.Is(err, packcache.ErrLoadTimeout):
		return loadTimeout
	case isPanic(err):
		return loadPanic
	}
	return loadError
}

// isPanic reports whether err holds a *packcache.PanicError. It is a
// function of its own because the target of errors.As escapes: declared in
// loadOutcome, it would cost every load an allocation.
func isPanic(err error) bool {
	var pe *packcache.PanicError
	return errors.As(err, &pe)
}

type loadOutcomeIndex uint8

const (
	loadOK loadOutcomeIndex = iota
	loadNotFound
	loadDoNotCache
	loadTimeout
	loadPanic
	loadError
	numLoadOutcomes
)

var loadOutcomeNames = [numLoadOutcomes]string{"ok", "not_found", "do_not_cache", "timeout", "panic", "error"}

// numReadOutcomes is the number of packcache.ReadOutcome values this module
// knows, ReadHit through ReadError.
const numReadOutcomes = int(packcache.ReadError) + 1
