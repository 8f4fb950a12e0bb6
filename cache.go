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
// A Cache works over any redis.UniversalClient: a single node, Sentinel or
// Cluster.
package packcache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
)

// tombstone is the whole stored value that remembers a loader's
// ErrNotFound. See FORMAT.md.
const tombstone = codec.HeaderTombstone

// A Cache stores values of type T in Redis. It is safe for concurrent use.
//
// WARNING: values handed to callers that coalesced are shared: callers of
// Get for one key that overlap, or that come within the share window after
// one another (see WithShareWindow), get the same T. With reference types
// ([]byte, slices, maps, pointers) they must treat it as read-only.
// WithDecodePerCaller gives each caller its own.
type Cache[T any] struct {
	rdb        redis.UniversalClient
	ser        Serializer
	raw        bool // T is []byte or json.RawMessage: stored as is
	maxSize    int
	timeout    time.Duration
	coalesce   bool
	perCaller  bool
	strict     bool
	onError    func(ctx context.Context, key string, err error)
	lockLease  time.Duration
	base       *policy[T]
	prefixes   []*policy[T] // longest prefix first
	breaker    breaker
	lookups    group[result[T], flight[T]] // Gets without a loader: read and decode
	reads      group[result[T], flight[T]] // Gets with a loader: read, decode, and load on a miss
	loads      group[result[T], flight[T]] // loads, shared by reads and GetOrLoadMany
	refreshing group[struct{}, flight[T]]

	// The generic functions shared work runs, made into values once: a
	// generic function named inside generic code is a closure over its
	// type dictionary, allocated each time it is named.
	lookupFn     func(context.Context, flight[T], *result[T]) error
	loadFlightFn func(context.Context, flight[T], *result[T]) error
	callLoaderFn func(context.Context, loaderCall[T], *T) error
	wg           sync.WaitGroup
	closed       context.Context
	close        context.CancelFunc
}

// policy is a Policy with every field resolved, plus its counters.
type policy[T any] struct {
	Policy
	prefix string
	loader Loader[T]
	stats  counters
}

// expired reports whether a value with left to live (-1: unknown) is past
// its TTL and only kept for StaleFor.
func (p *policy[T]) expired(left time.Duration) bool {
	return p.StaleFor > 0 && left >= 0 && left <= p.StaleFor
}

// flight holds what one piece of shared work needs, passed by value so
// that no closure is allocated for it.
type flight[T any] struct {
	c       *Cache[T]
	key     string
	p       *policy[T]
	ld      Loader[T]
	stale   *result[T] // for a load: the expired value to fall back on
	redisUp bool       // for a load: whether to store its value
}

// result is what shared work hands its callers.
type result[T any] struct {
	val   T
	data  []byte // the serialized value, when each caller decodes its own
	from  source
	stale bool
}

type source uint8

const (
	fromRedis source = iota
	fromLoader
)

// New returns a Cache over rdb. Invalid options are reported here, not
// later.
func New[T any](rdb redis.UniversalClient, opts ...Option) (*Cache[T], error) {
	if rdb == nil {
		return nil, errors.New("packcache: nil redis client")
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
	c := &Cache[T]{
		rdb:       rdb,
		ser:       cfg.serializer,
		raw:       isRaw[T](),
		maxSize:   cfg.maxValueSize,
		timeout:   cfg.loadTimeout,
		coalesce:  cfg.coalesce,
		perCaller: cfg.perCaller,
		strict:    cfg.strict,
		onError:   cfg.errorHandler,
		lockLease: cfg.lock,
		breaker:   breaker{cfg: cfg.breaker},
	}
	c.lookupFn, c.loadFlightFn, c.callLoaderFn = lookup[T], loadFlight[T], callLoader[T]
	c.lookups.wg, c.reads.wg, c.loads.wg, c.refreshing.wg = &c.wg, &c.wg, &c.wg, &c.wg
	if w := cfg.shareWindow; w > 0 {
		hold := func(r result[T], err error, took time.Duration) time.Duration {
			if (err != nil && err != ErrNotFound) || r.stale {
				return 0
			}
			// A value that took long to make (a load) stays shared for as
			// long as it took, up to a second: the stragglers of the surge
			// that waited for it are still arriving.
			return max(w, min(took, time.Second))
		}
		c.lookups.hold, c.reads.hold = hold, hold
		c.lookups.slide, c.reads.slide = w, w
		c.lookups.slideCap, c.reads.slideCap = 10*w, 10*w
	}
	c.closed, c.close = context.WithCancel(context.Background())
	var err error
	if c.base, err = resolve[T]("", cfg.base); err != nil {
		return nil, err
	}
	for _, prefix := range cfg.sortedPrefixes() {
		p, err := resolve[T](prefix, cfg.prefixes[prefix].merge(cfg.base))
		if err != nil {
			return nil, err
		}
		c.prefixes = append(c.prefixes, p)
	}
	return c, nil
}

func resolve[T any](prefix string, p Policy) (*policy[T], error) {
	rp := &policy[T]{Policy: p, prefix: prefix}
	if p.Loader != nil {
		l, ok := p.Loader.(Loader[T])
		if !ok {
			return nil, fmt.Errorf("packcache: loader for prefix %q is a %T, not a Loader[%s]", prefix, p.Loader, reflect.TypeFor[T]())
		}
		rp.loader = l
	}
	if p.RefreshAfter > 0 && p.TTL != NoExpiration && p.RefreshAfter >= p.TTL {
		return nil, fmt.Errorf("packcache: prefix %q: RefreshAfter %v is not shorter than TTL %v", prefix, p.RefreshAfter, p.TTL)
	}
	return rp, nil
}

func isRaw[T any]() bool {
	t := reflect.TypeFor[T]()
	return t == reflect.TypeFor[[]byte]() || t == reflect.TypeFor[json.RawMessage]()
}

// Close stops background refreshes and waits for the work the cache
// started (shared loads, refreshes) to end. It does not close the Redis
// client. The cache remains usable, but starts no background refresh.
func (c *Cache[T]) Close() error {
	c.close()
	c.wg.Wait()
	return nil
}

func (c *Cache[T]) policy(key string) *policy[T] {
	for _, p := range c.prefixes {
		if strings.HasPrefix(key, p.prefix) {
			return p
		}
	}
	return c.base
}

// Get returns the value stored under key.
//
// Without a loader for key, a key that holds no value returns ErrMiss. With
// one (WithLoader, or the Loader of the key's Policy), Get reads through:
// on a miss it calls the loader, stores the value with the key's policy and
// returns it; see Loader for what else read-through does.
//
// Concurrent Gets of one key in one process share one Redis read, one
// decompression and one decode, and on a miss one loader call. Every
// caller, the first included, waits for the shared work or until its own
// context is done, when it returns ctx.Err() and the work goes on for the
// others: the read runs detached from the first caller's cancellation
// (bounded by the Redis client's timeouts), the load likewise (bounded by
// WithLoadTimeout and Close). A first caller whose context cannot end reads
// on its own goroutine. The value is shared among them, and with callers
// that come within the share window (see Cache and WithShareWindow).
//
// A stored value that cannot be decoded is an error naming the key and
// matching ErrUnknownHeader, ErrCorrupt, ErrTooLarge or ErrSerialization;
// without a loader, the value is left in Redis untouched. Redis failures
// match ErrRedis.
func (c *Cache[T]) Get(ctx context.Context, key string) (T, error) {
	p := c.policy(key)
	return c.get(ctx, key, p, p.loader)
}

// GetOrLoad is Get with fn as the loader for this call, whatever loader
// the cache has. Concurrent calls for one key share one call of whichever
// fn came first.
func (c *Cache[T]) GetOrLoad(ctx context.Context, key string, fn func(ctx context.Context) (T, error)) (T, error) {
	if fn == nil {
		var zero T
		return zero, errors.New("packcache: GetOrLoad with nil function")
	}
	p := c.policy(key)
	return c.get(ctx, key, p, LoaderFunc[T](func(ctx context.Context, _ string) (T, error) { return fn(ctx) }))
}

// A SetOption changes how one Set or SetMany stores its values.
type SetOption func(*setOptions)

type setOptions struct {
	ttl    time.Duration
	ttlSet bool
}

// SetTTL stores the value for d, or with no expiry for NoExpiration,
// instead of the key's policy's TTL. An invalid TTL fails the call.
func SetTTL(d time.Duration) SetOption {
	return func(o *setOptions) { o.ttl, o.ttlSet = d, true }
}

// Set stores value under key with the key's policy: serialized, compressed
// when above the policy's threshold and when that saves at least its
// minimum, with its TTL. A Set during a shared load of the same key may be
// overwritten when that load stores its value.
func (c *Cache[T]) Set(ctx context.Context, key string, value T, opts ...SetOption) error {
	p := c.policy(key)
	so := setOptions{ttl: p.TTL}
	for _, o := range opts {
		o(&so)
	}
	if err := checkTTL("SetTTL", so.ttl); err != nil {
		return keyErr("set", key, err)
	}
	_, err := c.store(ctx, key, p, value, so.ttl, false)
	c.forget(key)
	return err
}

// Delete removes keys. Keys that do not exist are not an error. On Redis
// Cluster the keys may live in different slots.
func (c *Cache[T]) Delete(ctx context.Context, keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	defer func() {
		for _, k := range keys {
			c.forget(k)
		}
	}()
	if len(keys) == 1 {
		if err := c.rdb.Del(ctx, keys[0]).Err(); err != nil {
			c.redisFailed(c.policy(keys[0]), err)
			return keyErr("delete", keys[0], redisErr(err))
		}
		return nil
	}
	// One DEL per key in a pipeline: a multi-key DEL fails on a cluster
	// when the keys' slots differ, and the pipeline still costs one round
	// trip per node.
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.Del(ctx, k)
	}
	pipe.Exec(ctx)
	var errs []error
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil {
			c.redisFailed(c.policy(keys[i]), err)
			errs = append(errs, keyErr("delete", keys[i], redisErr(err)))
		}
	}
	return errors.Join(errs...)
}

// Stats returns a snapshot of the cache's counters.
func (c *Cache[T]) Stats() Stats {
	s := Stats{Prefixes: make(map[string]Counters, len(c.prefixes)+1)}
	s.Counters.Codecs = map[string]CodecStats{}
	for _, p := range append([]*policy[T]{c.base}, c.prefixes...) {
		snap := p.stats.snapshot()
		s.Prefixes[p.prefix] = snap
		s.Counters.add(snap)
	}
	return s
}
