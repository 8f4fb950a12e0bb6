package packcache

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/packcache/packcache/codec"
)

// Defaults used where no option says otherwise.
const (
	DefaultCompressAbove = 1024             // bytes of serialized value
	DefaultTTL           = time.Hour        // expiry of stored values
	DefaultMaxValueSize  = 64 << 20         // bytes, decoded
	DefaultLoadTimeout   = 30 * time.Second // bound on a shared load
	DefaultShareWindow   = 10 * time.Millisecond
)

// NoExpiration, as a TTL, stores values without an expiry.
const NoExpiration time.Duration = -1

// A Policy tunes how the cache stores the keys under one prefix; see
// WithPrefix. A zero field inherits the cache's setting.
type Policy struct {
	// Codec compresses values above CompressAbove. codec.None stores every
	// value plain.
	Codec codec.Codec

	// CompressAbove is the serialized size in bytes above which a value is
	// compressed; values at or below it are stored plain. A negative value
	// compresses every value.
	CompressAbove int

	// MinSaving is the number of bytes compression must save for the
	// compressed form to be stored; otherwise the value is stored plain.
	// The default is 1: any saving at all.
	MinSaving int

	// TTL is how long a stored value lives. NoExpiration keeps it until it
	// is deleted or evicted.
	TTL time.Duration

	// TTLJitter, a fraction in [0, 1), shortens each value's TTL by a
	// random part of up to that fraction, so keys written together do not
	// expire together. A TTL never grows past the one configured.
	TTLJitter float64

	// Loader loads values missing under this prefix; it must be a
	// Loader[T] for the cache's T, or New fails. See WithLoader.
	Loader any

	// NegativeTTL is how long a loader's ErrNotFound is remembered. Zero
	// inherits; a negative value disables negative caching.
	NegativeTTL time.Duration

	// RefreshAfter, with a loader, makes a Get of a value older than this
	// start one background reload while callers keep getting the cached
	// value. The age is TTL minus the time Redis says the value has left.
	RefreshAfter time.Duration

	// StaleFor, with a loader, keeps a value in Redis this long past its
	// TTL. A Get of such a value reloads; if the loader fails, the stale
	// value is returned instead of the error.
	StaleFor time.Duration
}

// An Option configures a Cache in New.
type Option func(*config) error

type config struct {
	base         Policy
	prefixes     map[string]Policy
	serializer   Serializer
	maxValueSize int
	loadTimeout  time.Duration
	coalesce     bool
	shareWindow  time.Duration
	perCaller    bool
	strict       bool
	errorHandler func(ctx context.Context, key string, err error)
	lock         time.Duration
	breaker      breakerConfig
}

type breakerConfig struct {
	failures int           // consecutive failures that open it; 0 disables
	cooldown time.Duration // how long it stays open before a probe
}

func defaultConfig() config {
	return config{
		base: Policy{
			Codec:         codec.Zstd,
			CompressAbove: DefaultCompressAbove,
			MinSaving:     1,
			TTL:           DefaultTTL,
			NegativeTTL:   -1,
		},
		prefixes:     map[string]Policy{},
		serializer:   JSON,
		maxValueSize: DefaultMaxValueSize,
		loadTimeout:  DefaultLoadTimeout,
		coalesce:     true,
		shareWindow:  DefaultShareWindow,
		breaker:      breakerConfig{failures: 5, cooldown: time.Second},
	}
}

// WithCodec sets the codec values above the compression threshold are
// written with; the default is codec.Zstd. Readers decode every registered
// codec whatever this says.
func WithCodec(c codec.Codec) Option {
	return func(cfg *config) error {
		if c == nil {
			return errors.New("WithCodec: nil codec")
		}
		cfg.base.Codec = c
		return nil
	}
}

// WithCompressAbove sets the serialized size in bytes above which values
// are compressed; values at or below it are stored plain. The default is
// DefaultCompressAbove. Zero compresses every non-empty value.
func WithCompressAbove(n int) Option {
	return func(cfg *config) error {
		if n < 0 {
			return fmt.Errorf("WithCompressAbove: negative size %d", n)
		}
		cfg.base.CompressAbove = n
		if n == 0 {
			cfg.base.CompressAbove = -1
		}
		return nil
	}
}

// WithMinSaving sets how many bytes compression must save for a value to
// be stored compressed. The default is 1.
func WithMinSaving(n int) Option {
	return func(cfg *config) error {
		if n < 1 {
			return fmt.Errorf("WithMinSaving: %d is below 1", n)
		}
		cfg.base.MinSaving = n
		return nil
	}
}

// WithTTL sets how long stored values live; the default is DefaultTTL.
// NoExpiration stores values without an expiry. Precision is one
// millisecond; a TTL is never rounded up or replaced.
func WithTTL(d time.Duration) Option {
	return func(cfg *config) error {
		if err := checkTTL("WithTTL", d); err != nil {
			return err
		}
		cfg.base.TTL = d
		return nil
	}
}

// WithTTLJitter shortens each value's TTL by a random fraction of up to f
// (0 <= f < 1), so keys written together do not expire together.
func WithTTLJitter(f float64) Option {
	return func(cfg *config) error {
		if !(f >= 0 && f < 1) {
			return fmt.Errorf("WithTTLJitter: %v is not in [0, 1)", f)
		}
		cfg.base.TTLJitter = f
		return nil
	}
}

// WithSerializer sets how values are turned into bytes; the default is
// JSON. It has no effect when T is []byte or json.RawMessage: those are
// stored as they are.
func WithSerializer(s Serializer) Option {
	return func(cfg *config) error {
		if s == nil {
			return errors.New("WithSerializer: nil serializer")
		}
		cfg.serializer = s
		return nil
	}
}

// WithMaxValueSize sets the largest serialized value, in bytes, the cache
// stores or decodes; the default is DefaultMaxValueSize. A stored value
// that would decode to more is an error matching ErrTooLarge, found before
// memory is allocated for it, so a hostile value cannot make the process
// allocate more than about this much.
func WithMaxValueSize(n int) Option {
	return func(cfg *config) error {
		if n < 1 {
			return fmt.Errorf("WithMaxValueSize: %d is below 1", n)
		}
		cfg.maxValueSize = n
		return nil
	}
}

// WithPrefix sets the policy for keys that begin with prefix. Where
// prefixes nest, the longest that matches a key wins; fields left zero
// inherit the cache's options. Setting one prefix twice is an error.
func WithPrefix(prefix string, p Policy) Option {
	return func(cfg *config) error {
		if prefix == "" {
			return errors.New("WithPrefix: empty prefix; use the cache's options")
		}
		if _, dup := cfg.prefixes[prefix]; dup {
			return fmt.Errorf("WithPrefix: prefix %q set twice", prefix)
		}
		if err := p.check(); err != nil {
			return fmt.Errorf("WithPrefix %q: %w", prefix, err)
		}
		cfg.prefixes[prefix] = p
		return nil
	}
}

// WithNegativeTTL makes the cache remember, for d, that a loader returned
// ErrNotFound for a key, so a key missing at the source does not send
// every request to the loader. By default nothing is remembered.
func WithNegativeTTL(d time.Duration) Option {
	return func(cfg *config) error {
		if d <= 0 {
			return fmt.Errorf("WithNegativeTTL: %v is not positive", d)
		}
		cfg.base.NegativeTTL = d
		return nil
	}
}

// WithRefreshAfter makes a Get of a value older than d reload it in the
// background (one reload per key per process at a time) while callers keep
// getting the cached value. It needs a loader and a TTL longer than d.
func WithRefreshAfter(d time.Duration) Option {
	return func(cfg *config) error {
		if d <= 0 {
			return fmt.Errorf("WithRefreshAfter: %v is not positive", d)
		}
		cfg.base.RefreshAfter = d
		return nil
	}
}

// WithStaleFor keeps values in Redis for d past their TTL; when a reload
// of an expired value fails, the stale value is returned instead of the
// error, for up to d.
func WithStaleFor(d time.Duration) Option {
	return func(cfg *config) error {
		if d <= 0 {
			return fmt.Errorf("WithStaleFor: %v is not positive", d)
		}
		cfg.base.StaleFor = d
		return nil
	}
}

// WithLoadTimeout bounds the work shared by coalesced callers (a Redis read
// and decode, or a load and store). It runs detached from any one caller's
// cancellation, so it needs a bound of its own; the default is
// DefaultLoadTimeout.
func WithLoadTimeout(d time.Duration) Option {
	return func(cfg *config) error {
		if d <= 0 {
			return fmt.Errorf("WithLoadTimeout: %v is not positive", d)
		}
		cfg.loadTimeout = d
		return nil
	}
}

// WithCoalescing turns coalescing of concurrent Gets of one key on (the
// default) or off.
func WithCoalescing(on bool) Option {
	return func(cfg *config) error { cfg.coalesce = on; return nil }
}

// WithShareWindow sets how long a value that coalesced callers shared
// stays shared with callers of the same key that arrive after the read or
// load ended; the default is DefaultShareWindow. A surge's callers do not
// all arrive within one Redis read: with a window, the whole surge costs
// one read and one decode instead of one per read's length of arrivals. A
// value that took longer than d to make (a load, typically) stays shared
// for as long as it took, up to a second. While callers keep coming within
// d of one another, the window slides on, up to ten times d after the read
// ended: a surge shares one read until it ebbs, while a lone caller that
// comes later than d reads afresh.
//
// The price: a caller may get a value older than what Redis holds, by up to
// ten times the window (or the load's duration, at most a second), if
// another process wrote the key meanwhile. A Set or Delete through this cache ends
// the window for its key at once. Zero turns the window off: then only
// callers that overlap share.
func WithShareWindow(d time.Duration) Option {
	return func(cfg *config) error {
		if d < 0 {
			return fmt.Errorf("WithShareWindow: %v is negative", d)
		}
		cfg.shareWindow = d
		return nil
	}
}

// WithDecodePerCaller makes coalesced callers share the Redis read and the
// decompression but each decode a value of its own, so callers may modify
// what they get. By default coalesced callers share one decoded value.
func WithDecodePerCaller() Option {
	return func(cfg *config) error { cfg.perCaller = true; return nil }
}

// WithStrictRedis makes read-through calls fail with the Redis error when
// Redis fails. By default they answer from the loader and report the error
// to the error handler.
func WithStrictRedis() Option {
	return func(cfg *config) error { cfg.strict = true; return nil }
}

// WithErrorHandler sets a function that is told of the errors the cache
// handles without returning them: Redis failures answered from the loader,
// undecodable values reloaded, background refreshes that failed, stores
// after a load that failed. It must be safe for concurrent use and should
// return quickly.
func WithErrorHandler(f func(ctx context.Context, key string, err error)) Option {
	return func(cfg *config) error { cfg.errorHandler = f; return nil }
}

// WithLock makes processes that miss the same key at the same time take
// turns through a Redis lock (SET NX PX with a random token, released only
// by its owner), so that one process loads and the others wait for its
// value. lease bounds how long a dead holder can keep others waiting; it
// should exceed the usual load time.
func WithLock(lease time.Duration) Option {
	return func(cfg *config) error {
		if lease < time.Millisecond {
			return fmt.Errorf("WithLock: lease %v is under a millisecond", lease)
		}
		cfg.lock = lease
		return nil
	}
}

// WithCircuitBreaker sets how many consecutive Redis failures open the
// circuit breaker and how long it stays open before one call probes Redis
// again. While it is open, calls do not wait on Redis: read-through calls
// answer from the loader, the others fail with ErrCircuitOpen. The default
// is 5 failures and one second; failures of 0 turns the breaker off.
func WithCircuitBreaker(failures int, cooldown time.Duration) Option {
	return func(cfg *config) error {
		if failures < 0 || (failures > 0 && cooldown <= 0) {
			return fmt.Errorf("WithCircuitBreaker: bad settings %d, %v", failures, cooldown)
		}
		cfg.breaker = breakerConfig{failures, cooldown}
		return nil
	}
}

func checkTTL(what string, d time.Duration) error {
	if d != NoExpiration && d < time.Millisecond {
		return fmt.Errorf("%s: TTL %v is neither NoExpiration nor at least a millisecond", what, d)
	}
	return nil
}

func (p Policy) check() error {
	if p.TTL != 0 {
		if err := checkTTL("TTL", p.TTL); err != nil {
			return err
		}
	}
	if p.MinSaving < 0 {
		return fmt.Errorf("MinSaving %d is negative", p.MinSaving)
	}
	if !(p.TTLJitter >= 0 && p.TTLJitter < 1) {
		return fmt.Errorf("TTLJitter %v is not in [0, 1)", p.TTLJitter)
	}
	if p.RefreshAfter < 0 || p.StaleFor < 0 {
		return errors.New("RefreshAfter and StaleFor must not be negative")
	}
	return nil
}

// merge fills p's zero fields from base.
func (p Policy) merge(base Policy) Policy {
	if p.Codec == nil {
		p.Codec = base.Codec
	}
	if p.CompressAbove == 0 {
		p.CompressAbove = base.CompressAbove
	}
	if p.MinSaving == 0 {
		p.MinSaving = base.MinSaving
	}
	if p.TTL == 0 {
		p.TTL = base.TTL
	}
	if p.TTLJitter == 0 {
		p.TTLJitter = base.TTLJitter
	}
	if p.Loader == nil {
		p.Loader = base.Loader
	}
	if p.NegativeTTL == 0 {
		p.NegativeTTL = base.NegativeTTL
	}
	if p.RefreshAfter == 0 {
		p.RefreshAfter = base.RefreshAfter
	}
	if p.StaleFor == 0 {
		p.StaleFor = base.StaleFor
	}
	return p
}

// sortedPrefixes returns the configured prefixes, longest first, so the
// first that matches a key is the longest.
func (cfg *config) sortedPrefixes() []string {
	ps := make([]string, 0, len(cfg.prefixes))
	for p := range cfg.prefixes {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool {
		if len(ps[i]) != len(ps[j]) {
			return len(ps[i]) > len(ps[j])
		}
		return ps[i] < ps[j]
	})
	return ps
}
