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
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"time"
	"unsafe"

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

func (c *Cache[T]) get(ctx context.Context, key string, p *policy[T], ld Loader[T]) (T, error) {
	f := flight[T]{c: c, key: key, p: p, ld: ld}
	if !c.coalesce {
		var r result[T]
		err := lookup(ctx, f, &r)
		return c.deliver(key, p, r, err)
	}
	g := &c.lookups
	if ld != nil {
		g = &c.reads
	}
	r, err, shared := g.do(ctx, key, f, c.lookupFn)
	if shared {
		p.stats.coalescedWaits.Add(1)
	}
	return c.deliver(key, p, r, err)
}

// deliver counts a caller's outcome and gives it its value.
func (c *Cache[T]) deliver(key string, p *policy[T], r result[T], err error) (T, error) {
	switch {
	case err == nil:
		if r.from == fromRedis {
			p.stats.hits.Add(1)
		} else {
			p.stats.misses.Add(1)
		}
	case errors.Is(err, ErrMiss):
		p.stats.misses.Add(1)
	case errors.Is(err, ErrNotFound):
		p.stats.notFoundHits.Add(1)
	}
	if err != nil {
		var zero T
		return zero, err
	}
	if r.data == nil {
		return r.val, nil
	}
	var v T
	if err := c.unmarshal(r.data, &v); err != nil {
		return v, keyErr("get", key, err)
	}
	return v, nil
}

// lookup is the work one Get does, shared by the callers that coalesce: read
// Redis and decode into r; on a miss or an undecodable value, load and
// store.
func lookup[T any](ctx context.Context, f flight[T], r *result[T]) error {
	c, key, p, ld := f.c, f.key, f.p, f.ld
	redisUp := c.breaker.allow()
	if redisUp {
		left, err := c.fetch(ctx, key, p, r)
		switch {
		case err == nil:
			if p.expired(left) {
				if ld == nil {
					*r = result[T]{}
					return ErrMiss
				}
				s := *r
				f.stale = &s
				break
			}
			if ld != nil && p.RefreshAfter > 0 && left >= 0 && p.TTL+p.StaleFor-left >= p.RefreshAfter {
				c.refresh(ctx, key, p, ld)
			}
			return nil
		case errors.Is(err, ErrMiss):
			if ld == nil {
				return ErrMiss
			}
		case errors.Is(err, ErrNotFound):
			return ErrNotFound
		case errors.Is(err, ErrRedis):
			if ld == nil || c.strict {
				return err
			}
			c.report(ctx, key, err)
			redisUp = false
		default: // undecodable
			if ld == nil {
				return err
			}
			c.report(ctx, key, err)
		}
	} else {
		if ld == nil || c.strict {
			return keyErr("get", key, &kindError{ErrRedis, ErrCircuitOpen})
		}
	}
	f.redisUp = redisUp
	if !c.coalesce {
		return loadFlight(ctx, f, r)
	}
	// The load runs detached from this caller, who may leave, while the
	// callers sharing this read, and later ones, wait for it.
	var err error
	*r, err, _ = c.loads.start(ctx, key, detach(ctx, c.closed, c.timeout), f, c.loadFlightFn)
	return err
}

// loadFlight is the load of a flight: under the cross-process lock when
// there is one and Redis is up.
func loadFlight[T any](ctx context.Context, f flight[T], r *result[T]) error {
	var err error
	if f.redisUp && f.c.lockLease > 0 {
		*r, err = f.c.loadLocked(ctx, f.key, f.p, f.ld, f.stale)
	} else {
		*r, err = f.c.load(ctx, f.key, f.p, f.ld, f.stale, f.redisUp)
	}
	return err
}

// load calls the loader and, when Redis is up, stores what it returns.
func (c *Cache[T]) load(ctx context.Context, key string, p *policy[T], ld Loader[T], stale *result[T], store bool) (result[T], error) {
	var v T
	var err error
	protect(ctx, loaderCall[T]{ld, key}, c.callLoaderFn, &v, &err)
	switch {
	case err == nil || errors.Is(err, DoNotCache):
		p.stats.loads.Add(1)
		r := result[T]{val: v, from: fromLoader}
		if err == nil && store {
			data, serr := c.store(ctx, key, p, v, p.TTL, c.perCaller)
			if serr != nil {
				if c.strict || errors.Is(serr, ErrSerialization) || errors.Is(serr, ErrTooLarge) {
					return result[T]{}, serr
				}
				c.report(ctx, key, serr)
			}
			r.data = data
		}
		if c.perCaller && r.data == nil {
			// Not stored, so not serialized yet. (For raw T this is v's
			// own slice; each caller copies it in deliver.)
			data, merr := c.marshal(nil, v)
			if merr != nil {
				return result[T]{}, keyErr("load", key, merr)
			}
			r.data = data
		}
		return r, nil
	case errors.Is(err, ErrNotFound):
		p.stats.loads.Add(1)
		if store {
			c.rememberNotFound(ctx, key, p)
		}
		return result[T]{}, ErrNotFound
	default:
		p.stats.loadErrors.Add(1)
		if stale != nil {
			p.stats.staleServes.Add(1)
			c.report(ctx, key, keyErr("load", key, err))
			s := *stale
			s.stale = true
			return s, nil
		}
		return result[T]{}, keyErr("load", key, err)
	}
}

// rememberNotFound stores key's tombstone for its policy's NegativeTTL,
// if it has one.
func (c *Cache[T]) rememberNotFound(ctx context.Context, key string, p *policy[T]) {
	if p.NegativeTTL <= 0 {
		return
	}
	if err := c.setRaw(ctx, key, []byte{tombstone}, p.NegativeTTL); err != nil {
		c.report(ctx, key, err)
	}
}

// fetch reads key from Redis and decodes it into r. left is the time the
// value has to live, or -1 when it was not asked for or the value has no
// expiry.
func (c *Cache[T]) fetch(ctx context.Context, key string, p *policy[T], r *result[T]) (left time.Duration, err error) {
	left = -1
	var s string
	if p.RefreshAfter > 0 || p.StaleFor > 0 {
		pipe := c.rdb.Pipeline()
		get := pipe.Get(ctx, key)
		pttl := pipe.PTTL(ctx, key)
		pipe.Exec(ctx) // each command carries its own error
		s, err = get.Result()
		if err == nil {
			if d, perr := pttl.Result(); perr == nil && d > 0 {
				left = d
			}
		}
	} else {
		s, err = c.rdb.Get(ctx, key).Result()
	}
	if err != nil {
		if err == redis.Nil {
			c.breaker.success()
			return left, ErrMiss
		}
		c.redisFailed(p, err)
		return left, keyErr("get", key, redisErr(err))
	}
	c.breaker.success()
	return left, c.view(key, p, s, r)
}

// view decodes a Redis reply into r: ErrNotFound for a tombstone, a
// counted decode error for a value it cannot decode.
func (c *Cache[T]) view(key string, p *policy[T], s string, r *result[T]) error {
	// The string is ours alone and is only read: view it as bytes rather
	// than copy a value that may be megabytes.
	data := unsafe.Slice(unsafe.StringData(s), len(s))
	if len(data) == 1 && data[0] == tombstone {
		return ErrNotFound
	}
	err := c.decode(key, data, r)
	if err != nil {
		p.stats.decodeErrors.Add(1)
	}
	return err
}

// loaderCall is a loader and its key, for protect.
type loaderCall[T any] struct {
	ld  Loader[T]
	key string
}

func callLoader[T any](ctx context.Context, l loaderCall[T], v *T) error {
	var err error
	*v, err = l.ld.Load(ctx, l.key)
	return err
}

// decode turns a stored value into a result, written into r: the caller's
// result lives where the shared work keeps it, so decoding into it costs
// no allocation of its own.
func (c *Cache[T]) decode(key string, data []byte, r *result[T]) error {
	*r = result[T]{}
	if c.raw {
		// The caller owns what it gets: decompress into a new slice of
		// its own, and copy a plain value out of the Redis reply.
		b, err := codec.DecodeValue(nil, data, c.maxSize)
		if err != nil {
			return keyErr("get", key, err)
		}
		if codec.Plain(data) {
			b = bytes.Clone(b) // b is the reply itself
		} else if b == nil {
			b = []byte{}
		}
		if c.perCaller {
			r.data = b // each caller copies it in deliver
			return nil
		}
		*(*[]byte)(unsafe.Pointer(&r.val)) = b
		return nil
	}
	buf := getBuf()
	defer putBuf(buf)
	payload, err := codec.DecodeValue((*buf)[:0], data, c.maxSize)
	if err != nil {
		return keyErr("get", key, err)
	}
	if !codec.Plain(data) && cap(payload) > cap(*buf) {
		// Keep the grown buffer. (A plain payload is the Redis reply
		// itself, which must never reach the pool.)
		*buf = payload[:0]
	}
	if c.perCaller {
		r.data = bytes.Clone(payload)
		if r.data == nil {
			r.data = []byte{}
		}
		return nil
	}
	if err := c.ser.Unmarshal(payload, &r.val); err != nil {
		return keyErr("get", key, serializationErr(err))
	}
	return nil
}

func (c *Cache[T]) unmarshal(data []byte, v *T) error {
	if c.raw {
		*(*[]byte)(unsafe.Pointer(v)) = bytes.Clone(data)
		return nil
	}
	if err := c.ser.Unmarshal(data, v); err != nil {
		return serializationErr(err)
	}
	return nil
}

// marshal appends v's serialized form to dst. For raw T it returns v's
// own bytes, not a copy.
func (c *Cache[T]) marshal(dst []byte, v T) ([]byte, error) {
	if c.raw {
		return *(*[]byte)(unsafe.Pointer(&v)), nil
	}
	b, err := c.ser.Marshal(dst, &v)
	if err != nil {
		return dst, serializationErr(err)
	}
	return b, nil
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

// store serializes, frames and writes v. With keep, it returns a copy of
// the serialized value.
func (c *Cache[T]) store(ctx context.Context, key string, p *policy[T], v T, ttl time.Duration, keep bool) ([]byte, error) {
	sbuf, fbuf := getBuf(), getBuf()
	defer putBuf(sbuf)
	defer putBuf(fbuf)
	stored, payload, err := c.encode(ctx, key, p, v, sbuf, fbuf)
	if err != nil {
		return nil, err
	}
	if err := c.setRaw(ctx, key, stored, c.expiry(p, ttl)); err != nil {
		return nil, err
	}
	p.stats.sets.Add(1)
	if keep {
		return bytes.Clone(payload), nil
	}
	return nil, nil
}

// encode serializes v into sbuf and frames it into fbuf, returning the
// bytes to store and the serialized value.
func (c *Cache[T]) encode(ctx context.Context, key string, p *policy[T], v T, sbuf, fbuf *[]byte) (stored, payload []byte, err error) {
	payload, err = c.marshal((*sbuf)[:0], v)
	if err != nil {
		return nil, nil, keyErr("set", key, err)
	}
	if !c.raw {
		*sbuf = payload[:0]
	}
	if len(payload) > c.maxSize {
		return nil, nil, keyErr("set", key, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(payload), c.maxSize))
	}
	verbatim := (c.raw || c.ser.Text()) && codec.Plain(payload)
	plainLen := len(payload)
	if !verbatim {
		plainLen++
	}
	if (p.CompressAbove < 0 || len(payload) > p.CompressAbove) && p.Codec.ID() != codec.HeaderNone && len(payload) > 0 {
		out, cerr := codec.AppendValue((*fbuf)[:0], p.Codec, payload)
		if cerr == nil {
			*fbuf = out[:0]
			if len(out)+p.MinSaving <= plainLen {
				p.stats.wrote(p.Codec.ID(), len(payload), len(out))
				return out, payload, nil
			}
		} else {
			c.report(ctx, key, keyErr("set", key, cerr))
		}
	}
	if verbatim {
		p.stats.wrote(codec.HeaderNone, len(payload), len(payload))
		return payload, payload, nil
	}
	out, _ := codec.AppendValue((*fbuf)[:0], codec.None, payload) // None cannot fail
	*fbuf = out[:0]
	p.stats.wrote(codec.HeaderNone, len(payload), len(out))
	return out, payload, nil
}

// expiry applies the policy's jitter and stale window to a TTL.
func (c *Cache[T]) expiry(p *policy[T], ttl time.Duration) time.Duration {
	if ttl == NoExpiration {
		return ttl
	}
	if p.TTLJitter > 0 {
		ttl -= time.Duration(rand.Float64() * p.TTLJitter * float64(ttl))
		if ttl < time.Millisecond {
			ttl = time.Millisecond
		}
	}
	return ttl + p.StaleFor
}

// setRaw writes value under key. Every write the cache makes goes through
// setRaw or setMany, and both end the sharing of loader-less reads of the
// key begun before the write: such a read may have seen a miss, which later
// callers must not be given. (Reads with a loader need no such care: a
// load's store happens inside the very read they share.)
func (c *Cache[T]) setRaw(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	if err := c.rdb.Set(ctx, key, value, redisTTL(ttl)).Err(); err != nil {
		c.redisFailed(c.policy(key), err)
		return keyErr("set", key, redisErr(err))
	}
	c.breaker.success()
	c.lookups.forget(key)
	return nil
}

// redisTTL is ttl as go-redis takes it, where 0 means no expiry.
func redisTTL(ttl time.Duration) time.Duration {
	if ttl == NoExpiration {
		return 0
	}
	return ttl
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

// GetMany returns the values stored under keys, in one round trip per
// Redis node. Keys that hold no value (or a remembered ErrNotFound) are
// absent from the map. Values that cannot be decoded, and keys Redis failed
// on, are left out of the map and reported in the error, which joins one
// *Error per key; the map holds every value that could be read.
func (c *Cache[T]) GetMany(ctx context.Context, keys []string) (map[string]T, error) {
	found, _, errs := c.getMany(ctx, keys)
	return found, errors.Join(errs...)
}

// getMany reads keys; missing lists the keys that hold no value.
func (c *Cache[T]) getMany(ctx context.Context, keys []string) (found map[string]T, missing []string, errs []error) {
	found = make(map[string]T, len(keys))
	if len(keys) == 0 {
		return found, nil, nil
	}
	if !c.breaker.allow() {
		for _, k := range keys {
			errs = append(errs, keyErr("get", k, &kindError{ErrRedis, ErrCircuitOpen}))
		}
		return found, nil, errs
	}
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.Get(ctx, k)
	}
	pipe.Exec(ctx)
	for i, cmd := range cmds {
		k := keys[i]
		p := c.policy(k)
		s, err := cmd.Result()
		if err == redis.Nil {
			p.stats.misses.Add(1)
			missing = append(missing, k)
			continue
		}
		if err != nil {
			c.redisFailed(p, err)
			errs = append(errs, keyErr("get", k, redisErr(err)))
			continue
		}
		c.breaker.success()
		var r result[T]
		if err := c.view(k, p, s, &r); err != nil {
			if err == ErrNotFound {
				p.stats.notFoundHits.Add(1)
			} else {
				errs = append(errs, err)
			}
			continue
		}
		v := r.val
		if r.data != nil {
			if err := c.unmarshal(r.data, &v); err != nil {
				errs = append(errs, keyErr("get", k, err))
				continue
			}
		}
		p.stats.hits.Add(1)
		found[k] = v
	}
	return found, missing, errs
}

// SetMany stores items, each with its key's policy, in one round trip per
// Redis node. The error joins one *Error per key that failed; the others
// are stored.
func (c *Cache[T]) SetMany(ctx context.Context, items map[string]T, opts ...SetOption) error {
	stored, err := c.setMany(ctx, items, opts...)
	for _, k := range stored {
		c.forget(k)
	}
	return err
}

// setMany is SetMany for the cache's own use: it ends the sharing of
// loader-less reads only (see setRaw), and returns the keys it stored.
func (c *Cache[T]) setMany(ctx context.Context, items map[string]T, opts ...SetOption) ([]string, error) {
	if len(items) == 0 {
		return nil, nil
	}
	var so setOptions
	for _, o := range opts {
		o(&so)
	}
	if so.ttlSet {
		if err := checkTTL("SetTTL", so.ttl); err != nil {
			return nil, err
		}
	}
	var errs []error
	bufs := make([]*[]byte, 0, 2*len(items))
	defer func() {
		for _, b := range bufs {
			putBuf(b)
		}
	}()
	pipe := c.rdb.Pipeline()
	keys := make([]string, 0, len(items))
	cmds := make([]*redis.StatusCmd, 0, len(items))
	for k, v := range items {
		p := c.policy(k)
		sbuf, fbuf := getBuf(), getBuf()
		bufs = append(bufs, sbuf, fbuf)
		stored, _, err := c.encode(ctx, k, p, v, sbuf, fbuf)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ttl := p.TTL
		if so.ttlSet {
			ttl = so.ttl
		}
		keys = append(keys, k)
		cmds = append(cmds, pipe.Set(ctx, k, stored, redisTTL(c.expiry(p, ttl))))
	}
	if len(cmds) > 0 {
		pipe.Exec(ctx)
	}
	done := keys[:0]
	for i, cmd := range cmds {
		p := c.policy(keys[i])
		if err := cmd.Err(); err != nil {
			c.redisFailed(p, err)
			errs = append(errs, keyErr("set", keys[i], redisErr(err)))
			continue
		}
		p.stats.sets.Add(1)
		c.lookups.forget(keys[i])
		done = append(done, keys[i])
	}
	return done, errors.Join(errs...)
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

// forget ends the sharing of any earlier read of key, so that this
// process's callers see a write it has just made.
func (c *Cache[T]) forget(key string) {
	c.lookups.forget(key)
	c.reads.forget(key)
}

// redisFailed counts a failed Redis call and feeds the circuit breaker.
func (c *Cache[T]) redisFailed(p *policy[T], err error) {
	p.stats.redisErrors.Add(1)
	var re redis.Error
	if errors.As(err, &re) || errors.Is(err, context.Canceled) {
		// An error reply (WRONGTYPE, say) or a caller giving up says
		// nothing of Redis's health.
		return
	}
	c.breaker.failure()
}

func (c *Cache[T]) report(ctx context.Context, key string, err error) {
	if c.onError != nil {
		c.onError(ctx, key, err)
	}
}
