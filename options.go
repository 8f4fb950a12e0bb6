package packcache

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/breaker"
	"github.com/packcache/packcache/internal/dictset"
)

// The defaults, used where an option or Policy field is zero.
const (
	defaultCompressAbove = 1024             // bytes of serialized value
	defaultTTL           = time.Hour        // expiry of stored values
	defaultMaxValueSize  = 64 << 20         // bytes, decoded
	defaultLoadTimeout   = 30 * time.Second // bound on a load
	defaultRedisTimeout  = time.Second      // bound on each Redis call
	defaultShareWindow   = 10 * time.Millisecond
)

// Every option and Policy field follows one rule: zero means the default
// (in a Policy: inherit the cache's setting), Off turns the setting off,
// and any other value sets it. The one explicit sentinel beside Off is
// CompressAll.

// Off, as the argument of an option or a Policy field, turns a setting
// off: no expiry (TTL), no compression (CompressAbove), no minimum saving
// beyond one byte (MinSaving), no jitter, no negative caching, no early
// refresh, no stale window, no near cache (LocalCache.MaxBytes), no share
// window past a read's reply (WithShareWindow), no circuit breaker
// (WithCircuitBreaker), no deltas (Policy.Deltas).
const Off = -1

// CompressAll, as CompressAbove, compresses every non-empty value however
// small (still storing it plain when compression does not save MinSaving
// bytes).
const CompressAll = -2

// A Policy tunes how the cache stores the keys under one prefix; see
// WithPrefix.
//
// Every field follows one rule: its zero value inherits the cache's
// setting (given with WithPrefix("", p), or the defaults below), Off turns
// the setting off for the prefix, and any other value sets it.
// CompressAbove also takes CompressAll. Values
// outside these are an error in New.
type Policy struct {
	// Codec compresses values above CompressAbove; the default is
	// codec.Zstd. codec.None stores every value plain.
	Codec codec.Codec

	// CompressAbove is the serialized size in bytes above which a value is
	// compressed, 1024 by default (codec.DictionaryCompressAbove, 64, with
	// a Dictionary); values at or below it are stored plain. CompressAll
	// compresses every value, Off none.
	CompressAbove int

	// MinSaving is the number of bytes compression must save for the
	// compressed form to be stored; otherwise the value is stored plain.
	// The cache's default is 1 (any saving at all), which Off also means.
	MinSaving int

	// TTL is how long a stored value lives, an hour by default. Off keeps
	// it until it is deleted or evicted.
	TTL time.Duration

	// TTLJitter, a fraction in (0, 1), shortens each value's TTL by a
	// random part of up to that fraction, so keys written together do not
	// expire together. A TTL never grows past the one configured.
	TTLJitter float64

	// Loader loads values missing under this prefix; it must be a
	// Loader[T] for the cache's T, or New fails. See WithLoader. Off turns
	// read-through off for the prefix: Get returns ErrMiss for its keys.
	Loader any

	// NegativeTTL is how long a loader's ErrNotFound is remembered, so
	// that a key missing at the source does not send every request to the
	// loader. By default nothing is remembered.
	NegativeTTL time.Duration

	// RefreshAfter, with a loader, makes a Get of a value older than this
	// start one background reload while callers keep getting the cached
	// value. The age is TTL minus the time Redis says the value has left.
	RefreshAfter time.Duration

	// StaleFor, with a loader, keeps a value in Redis this long past its
	// TTL. A Get of such a value reloads; if the loader fails, the stale
	// value is returned instead of the error.
	StaleFor time.Duration

	// Local keeps the prefix's decoded values in a near cache of its own
	// (see WithLocalCache). The zero LocalCache inherits the cache's (the
	// prefix then shares its near cache and its MaxBytes);
	// LocalCache{MaxBytes: Off} turns it off for the prefix. (In the
	// cache's own policy, the zero LocalCache is no near cache.)
	Local LocalCache

	// Dictionary is a Zstandard dictionary to compress the prefix's values
	// with: codec.TrainDictionary (or "packcache advise --train", or "zstd
	// --train") makes one from values like them. Zstd alone barely shrinks
	// values of a few hundred bytes; with a dictionary they take about
	// half their bytes. New fails for bytes codec.ParseDictionary refuses.
	//
	// Every Cache reads the values, whether or not its policy has the
	// dictionary: a value names its dictionary by id (FORMAT.md section
	// 3.6); before it stores the first value written with a dictionary, a
	// Cache publishes the dictionary in Redis, without expiry, under
	// codec.DictionaryKey(id); and a Cache that reads a value of a
	// dictionary it was not given fetches it from there, once, and uses it
	// only if its id is the one the value names. A dictionary Redis does
	// not hold is an error matching codec.ErrUnknownDictionary, and the
	// value is kept (see Get). A dictionary evicted (allkeys-lru), deleted
	// or lost in a restart comes back: a Set written with it learns in its
	// own round trip that Redis lacks it and publishes it again before it
	// returns (where both keys are on one node: docs/dictionaries.md),
	// and any other write finds it missing within a second (a writer asks
	// Redis once a second whether it holds it). If the first publication fails,
	// the value is stored without the dictionary (zstd at the same level,
	// or plain), the error goes to the error handler, and a write a second
	// later tries again: no value is stored with a dictionary Redis may not
	// hold.
	//
	// With a Dictionary, Codec gives the level: a zstd codec (codec.Zstd,
	// the default and fastest, or codec.ZstdLevel(n)) writes with the
	// dictionary at its level; codec.None stores values plain; another
	// codec in the same Policy is an error. Where the two come from
	// different policies, the prefix's own wins: its Dictionary over an
	// inherited codec (the level is then the fastest), its own codec other
	// than zstd over an inherited Dictionary (which it then does not use).
	// A Policy that sets its own Dictionary and leaves CompressAbove zero
	// gets codec.DictionaryCompressAbove, not the cache's threshold, which
	// suits values compressed without one; MinSaving still stores plain a
	// value that gains too little.
	//
	// Rotation: give the prefix a new dictionary. New writes use it;
	// values written with the old one stay readable, by its id, as long as
	// Redis holds the old dictionary: leave it there until they expire.
	//
	// WARNING: zstd levels 10 and above copy 34 MiB of tables for every
	// value they compress with a dictionary, about 2 ms a value (see
	// codec.Dictionary.Codec).
	Dictionary []byte

	// Deltas is how long a version of a value that Cache.Serve sent stays
	// usable as a dictionary (RFC 9842, Compression Dictionary Transport)
	// for the prefix's keys: with it, Serve offers every body it sends as
	// a dictionary for the request's path, keeps the version in Redis,
	// and answers a client that names a version still kept, and accepts
	// dcz, with the value compressed against that version (see
	// Cache.Serve and docs/http.md). At least a millisecond; Off, the
	// cache's own default, keeps no version and sends no delta.
	Deltas time.Duration
}

// An Option configures a Cache in New.
type Option func(*config) error

type config struct {
	base         Policy
	prefixes     map[string]Policy
	serializer   Serializer
	maxValueSize int
	loadTimeout  time.Duration
	redisTimeout time.Duration
	coalesce     bool
	shareWindow  time.Duration
	perCaller    bool
	strict       bool
	errorHandler func(ctx context.Context, key string, err error)
	serveError   ServeErrorFunc // WithServeError (serve.go); nil: the status text
	lockWait     time.Duration
	breaker      breaker.Config
	observer     Observer
	envNamespace string              // WithEnv: "" when unset
	envSet       map[string][]string // WithEnv: the variables set, by prefix ("" for the base)
	readHooks    []redis.Hook        // tests: hooks of a TrackKeys near cache's reading connections
}

var defaultBreaker = breaker.Config{Failures: 5, Cooldown: time.Second}

func defaultConfig() config {
	return config{
		base: Policy{
			Codec:         codec.Zstd,
			CompressAbove: 0, // resolve's: 1024, or codec.DictionaryCompressAbove with a Dictionary
			MinSaving:     1,
			TTL:           defaultTTL,
			TTLJitter:     Off,
			NegativeTTL:   Off,
			RefreshAfter:  Off,
			StaleFor:      Off,
			Loader:        Off,
			Deltas:        Off,
		},
		prefixes:     map[string]Policy{},
		serializer:   JSON,
		maxValueSize: defaultMaxValueSize,
		loadTimeout:  defaultLoadTimeout,
		redisTimeout: defaultRedisTimeout,
		coalesce:     true,
		shareWindow:  defaultShareWindow,
		breaker:      defaultBreaker,
	}
}

// WithCodec sets the codec values above the compression threshold are
// written with; the default is codec.Zstd. Readers decode every registered
// codec whatever this says. It is Policy.Codec of the cache's own policy.
func WithCodec(c codec.Codec) Option {
	return nonNil("WithCodec", "codec", c == nil, func(cfg *config) { cfg.base.Codec = c })
}

// WithCompressAbove sets the serialized size in bytes above which values
// are compressed; values at or below it are stored plain. Zero means the
// default, 1024 (codec.DictionaryCompressAbove with a Dictionary);
// CompressAll compresses every non-empty value; Off
// compresses none. It is Policy.CompressAbove of the cache's own policy.
func WithCompressAbove(n int) Option {
	return func(cfg *config) error {
		return cfg.setBase("WithCompressAbove", Policy{CompressAbove: n})
	}
}

// WithTTL sets how long stored values live. Zero means the default, an
// hour; Off stores values without an expiry. Precision is one
// millisecond; a TTL is never rounded up or replaced. It is Policy.TTL of
// the cache's own policy.
func WithTTL(d time.Duration) Option {
	return func(cfg *config) error {
		return cfg.setBase("WithTTL", Policy{TTL: d})
	}
}

// setBase sets the non-zero fields of p in the cache's own policy.
func (cfg *config) setBase(what string, p Policy) error {
	if err := p.check(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	cfg.base = p.merge(cfg.base)
	return nil
}

// nonNil is the Option that calls set, unless isNil: an Option that takes
// an interface refuses nil, failing with "option: nil what".
func nonNil(option, what string, isNil bool, set func(*config)) Option {
	return func(cfg *config) error {
		if isNil {
			return fmt.Errorf("%s: nil %s", option, what)
		}
		set(cfg)
		return nil
	}
}

// WithSerializer sets how values are turned into bytes; the default is
// JSON. It has no effect when T is []byte or json.RawMessage: those are
// stored as they are.
func WithSerializer(s Serializer) Option {
	return nonNil("WithSerializer", "serializer", s == nil, func(cfg *config) { cfg.serializer = s })
}

// WithMaxValueSize sets the largest serialized value, in bytes, the cache
// stores or decodes; zero means the default, 64 MiB. A stored value that
// would decode to more is an error matching ErrTooLarge, found before
// memory is allocated for it, so a hostile value cannot make the process
// allocate more than about this much.
func WithMaxValueSize(n int) Option {
	return func(cfg *config) error {
		var err error
		cfg.maxValueSize, err = orDefault("WithMaxValueSize", n, defaultMaxValueSize)
		return err
	}
}

// WithPrefix sets the policy for keys that begin with prefix. Where
// prefixes nest, the longest that matches a key wins; fields left zero
// inherit the cache's own policy (not a shorter prefix's). Setting one
// prefix twice is an error.
//
// The empty prefix is the cache's own policy, which every key under no
// other prefix gets and every prefix inherits: WithPrefix("", p) sets its
// non-zero fields (MinSaving, TTLJitter, NegativeTTL, RefreshAfter,
// StaleFor, or any other), as WithCodec, WithCompressAbove, WithTTL,
// WithLoader and WithLocalCache set theirs.
func WithPrefix(prefix string, p Policy) Option {
	return func(cfg *config) error {
		if prefix == "" {
			return cfg.setBase(`WithPrefix ""`, p)
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

// WithLoadTimeout bounds each load: the loader's context ends after d, and
// the callers waiting for a load that has not returned by then get an error
// matching ErrLoadTimeout. Nothing is stored for such a load, even if the
// loader returns a value afterwards. Zero means the default, 30 s.
func WithLoadTimeout(d time.Duration) Option {
	return func(cfg *config) error {
		var err error
		cfg.loadTimeout, err = orDefault("WithLoadTimeout", d, defaultLoadTimeout)
		return err
	}
}

// WithRedisTimeout sets the cache's time budget for each Redis call it
// makes (a GET, a pipeline, a SET, a lease script): past it the call fails
// with an error matching ErrRedis, and a read-through caller is answered
// from the loader. Zero means the default, one second. A caller's own
// earlier deadline still applies.
//
// The budget begins when the call's turn at the node comes: the cache
// asks the client's pool for no more connections to a node than the pool
// holds (its PoolSize), and the calls beyond wait for their turn under
// their own contexts. A call that ran out of its budget counts as a
// failure of the node (for Stats.RedisErrors and the circuit breaker)
// only if the node is what it waited on: if, within the call's time, a
// command written to the node went unanswered for at least half the
// budget, on the call's own connection or another of the node's, whatever
// the node answered on its other connections (so a write held by CLIENT
// PAUSE WRITE fails in one budget while reads are answered). Otherwise
// this process was too busy to make the call in time (a CPU, a
// connection, a dial; or its reply came and waited unread): the call is
// late, its error
// says so, and a read, or the plain SET of a Set and DEL of a Delete, is
// made again with a budget of its own, while the caller's context lasts
// and for at most the load timeout. A refused connection is a failure at
// once.
//
// The budget reaches the network only if the client honours context
// deadlines: New fails for a go-redis client whose ContextTimeoutEnabled
// is false.
func WithRedisTimeout(d time.Duration) Option {
	return func(cfg *config) error {
		var err error
		cfg.redisTimeout, err = orDefault("WithRedisTimeout", d, defaultRedisTimeout)
		return err
	}
}

// WithCoalescing turns coalescing of concurrent Gets of one key on (the
// default) or off. Off, each Get reads Redis, decodes and, on a miss,
// loads on its own: for measuring what coalescing saves.
func WithCoalescing(on bool) Option {
	return func(cfg *config) error { cfg.coalesce = on; return nil }
}

// WithShareWindow sets the share window, 10 ms by default (zero): a Get
// shares the read (and decode, and load) of another Get of the same key
// begun at most d before it, whether that read is still in flight or has
// ended, so the value it gets is never from a read sent more than d before
// its own would have been. Off shares only reads still in flight:
// concurrent callers coalesce, and a Get that comes after a read ended
// reads afresh.
//
// A surge's callers do not all arrive within one Redis read: with a
// window, a surge costs one read and one decode per window instead of one
// per read's length of arrivals. The price is that a Get may miss a write
// made by another process up to d earlier. A Set or Delete through this
// cache ends the window for its key at once.
func WithShareWindow(d time.Duration) Option {
	return func(cfg *config) error {
		switch {
		case d == 0:
			cfg.shareWindow = defaultShareWindow
		case d == Off:
			cfg.shareWindow = 0
		case d < 0:
			return fmt.Errorf("WithShareWindow: %v is neither a duration nor Off", d)
		default:
			cfg.shareWindow = d
		}
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

// WithLock makes a read-through Get that finds another process loading the
// key (its lease, see Loader) wait for that process's value instead of
// loading it again: it polls Redis with backoff for up to wait. If the
// lease is still there after wait (its holder died or is slow), the Get
// takes the lease over and loads and stores the value itself; the former
// holder's value is then not stored. wait should exceed the usual load
// time. Zero (the default) and Off do not wait.
//
// Without it, such a Get loads the value itself and returns it without
// storing it, so every process that misses at once loads once.
func WithLock(wait time.Duration) Option {
	return func(cfg *config) error {
		switch {
		case wait == 0 || wait == Off:
			cfg.lockWait = 0
		case wait < time.Millisecond:
			return fmt.Errorf("WithLock: wait %v is under a millisecond", wait)
		default:
			cfg.lockWait = wait
		}
		return nil
	}
}

// WithCircuitBreaker sets how many consecutive failures of a Redis node
// open its circuit breaker, 5 by default (zero), and how long it stays
// open before one call probes the node again, one second by default
// (zero). Off, as failures, turns the breaker off. There is one breaker
// per node: per master on a Redis Cluster. While a node's breaker is open,
// calls for its keys do not wait on it: read-through calls answer from the
// loader, the others fail with ErrCircuitOpen. A failure is the node's
// own: a network error, a reply such as LOADING or CLUSTERDOWN, or the
// WithRedisTimeout budget running out; never a caller's context ending. A
// refused connection (nothing listens at the node's address) opens the
// breaker at once, whatever the count.
func WithCircuitBreaker(failures int, cooldown time.Duration) Option {
	return func(cfg *config) error {
		b := breaker.Config{Failures: failures, Cooldown: cooldown} // not the arguments: an Option may be applied twice
		switch {
		case failures == Off:
			cfg.breaker = breaker.Config{}
			return nil
		case failures == 0:
			b.Failures = defaultBreaker.Failures
		case failures < 0:
			return fmt.Errorf("WithCircuitBreaker: failures %d is neither a count nor Off", failures)
		}
		switch {
		case cooldown == 0:
			b.Cooldown = defaultBreaker.Cooldown
		case cooldown < 0:
			return fmt.Errorf("WithCircuitBreaker: cooldown %v is negative", cooldown)
		}
		cfg.breaker = b
		return nil
	}
}

// orDefault is the one zero rule for a setting that cannot be turned off:
// zero is def, a negative value an error naming the option.
func orDefault[N int | time.Duration](what string, v, def N) (N, error) {
	switch {
	case v == 0:
		return def, nil
	case v < 0:
		return 0, fmt.Errorf("%s: %v is negative", what, v)
	}
	return v, nil
}

func checkTTL(what string, d time.Duration) error {
	if d != Off && d < time.Millisecond {
		return fmt.Errorf("%s: TTL %v is neither Off nor at least a millisecond", what, d)
	}
	return nil
}

// check reports fields outside the one rule: zero, Off or a valid value.
func (p Policy) check() error {
	if p.TTL != 0 {
		if err := checkTTL("TTL", p.TTL); err != nil {
			return err
		}
	}
	if p.CompressAbove < 0 && p.CompressAbove != Off && p.CompressAbove != CompressAll {
		return fmt.Errorf("CompressAbove %d is neither a size, Off nor CompressAll", p.CompressAbove)
	}
	if p.MinSaving < 0 && p.MinSaving != Off {
		return fmt.Errorf("MinSaving %d is neither a size nor Off", p.MinSaving)
	}
	if p.TTLJitter != Off && !(p.TTLJitter >= 0 && p.TTLJitter < 1) {
		return fmt.Errorf("TTLJitter %v is neither Off nor in [0, 1)", p.TTLJitter)
	}
	for name, d := range map[string]time.Duration{"NegativeTTL": p.NegativeTTL, "RefreshAfter": p.RefreshAfter, "StaleFor": p.StaleFor} {
		if d < 0 && d != Off {
			return fmt.Errorf("%s %v is neither a duration nor Off", name, d)
		}
	}
	if p.Deltas != 0 && p.Deltas != Off && p.Deltas < time.Millisecond {
		return fmt.Errorf("%s %v is neither Off nor at least a millisecond", "Deltas", p.Deltas)
	}
	if p.Dictionary != nil && p.Codec != nil {
		if err := dictset.CheckCodec(p.Codec); err != nil {
			return err
		}
	}
	if !p.Local.zero() {
		return p.Local.check()
	}
	return nil
}

// merge fills p's zero fields from base: the rule "zero inherits", for
// every field, the Policy's documented rule read as code.
func (p Policy) merge(base Policy) Policy {
	own, from := reflect.ValueOf(&p).Elem(), reflect.ValueOf(base)
	for i := range own.NumField() {
		if f := own.Field(i); f.IsZero() {
			f.Set(from.Field(i))
		}
	}
	return p
}

// prefixPolicy is prefix's Policy merged with the cache's, with the rule
// of Policy.Dictionary: where a dictionary and a codec come from different
// policies, the prefix's own setting wins.
func (cfg *config) prefixPolicy(prefix string) Policy {
	own := cfg.prefixes[prefix]
	p := own.merge(cfg.base)
	switch {
	case own.Dictionary != nil:
		if own.CompressAbove == 0 {
			p.CompressAbove = 0 // the dictionary's default, not the cache's threshold
		}
		if own.Codec == nil && p.Codec.ID() != codec.HeaderZstd {
			p.Codec = codec.Zstd
		}
	case own.Codec != nil && own.Codec.ID() != codec.HeaderZstd:
		p.Dictionary = nil
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
