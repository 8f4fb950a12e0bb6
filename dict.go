package packcache

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
)

// Zstandard dictionaries (Policy.Dictionary, FORMAT.md section 3.6). A
// Cache holds the dictionaries its policies give it, which it publishes in
// Redis before it stores the first value written with one, and those it
// fetched from Redis to read values others wrote. Publishing is the
// writer's side (published, called by encode); fetching and verifying the
// reader's (decodeValue, called by decode).

const (
	// maxFetchedDictionaries bounds the dictionaries a Cache holds that
	// it fetched, and the ids it remembers as missing: a dictionary takes
	// up to 128 KiB and its decoder about 50 KiB, and values naming
	// thousands of ids must not make a reader keep thousands.
	maxFetchedDictionaries = 64

	// dictionaryRetry is how long a dictionary found missing from Redis,
	// or refused, is remembered as such before a read fetches it again; and
	// how long a failed publication is waited out before a write tries
	// again. Reads of values whose dictionary is missing then cost one
	// fetch a second, not one each.
	dictionaryRetry = time.Second

	// republishEvery is how often a writer publishes its dictionary
	// again, so that a dictionary key evicted (allkeys-lru, as it is read
	// only when a process starts) or deleted comes back while values are
	// written with it.
	republishEvery = time.Minute
)

// A dictSet is a Cache's dictionaries by id. Reads look them up without
// a lock; fetches and the policies' own change the set under mu.
type dictSet struct {
	held atomic.Pointer[map[uint32]*dictEntry] // copied on every change

	mu       sync.Mutex
	order    []*dictEntry          // fetched entries, oldest first, for eviction; may hold replaced ones
	fetching map[uint32]*dictFetch // fetches under way, which reads of the same id wait for
}

// A dictEntry is a dictionary the set holds, or an id found missing or
// refused (d nil, until retry). It does not change once in the set, but
// for used.
type dictEntry struct {
	id    uint32
	d     *codec.Dictionary
	own   *ownDict // a policy's own; never evicted
	err   error    // d nil: why
	retry int64    // d nil: unix nanoseconds from which a read fetches it again
	used  atomic.Bool
}

// A dictFetch is a fetch under way, and its entry once done.
type dictFetch struct {
	done chan struct{}
	e    *dictEntry
}

// An ownDict is a dictionary a policy writes with, and its publication.
type ownDict struct {
	d         *codec.Dictionary
	mu        sync.Mutex   // one publication at a time
	published atomic.Int64 // unix nanoseconds of the last publication that succeeded; 0: none
	failed    atomic.Int64 // unix nanoseconds of the last that Redis failed
}

// publishScript stores the dictionary ARGV[1] under KEYS[1] without
// expiry unless the key already holds exactly it (a SET NX that also puts
// right a key holding anything else, or given an expiry). It returns 1 if
// it wrote.
var publishScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PERSIST', KEYS[1])
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
return 1`)

// writer parses b, a policy's Dictionary, adds it to the set (once per
// id, however many policies give it) and returns it with its codec at the
// level of zc, the policy's codec: a zstd codec, or codec.None (no codec).
func (s *dictSet) writer(b []byte, zc codec.Codec) (*ownDict, codec.Codec, error) {
	d, err := codec.ParseDictionary(b)
	if err != nil {
		return nil, nil, fmt.Errorf("the Dictionary: %w", err)
	}
	e := s.lookup(d.ID())
	if e == nil || e.own == nil {
		e = &dictEntry{id: d.ID(), d: d, own: &ownDict{d: d}}
		s.mu.Lock()
		s.add(e)
		s.mu.Unlock()
	}
	switch zc.ID() {
	case codec.HeaderNone:
		return e.own, nil, nil
	case codec.HeaderZstd:
		return e.own, e.d.Codec(zstdLevel(zc)), nil
	}
	return nil, nil, dictCodecError(zc)
}

func dictCodecError(c codec.Codec) error {
	return fmt.Errorf("a Dictionary with Codec %s: a dictionary is zstd's; give a zstd codec for its level, or none", c.Name())
}

// zstdLevel returns the standard level of zc, one of the zstd codecs.
func zstdLevel(zc codec.Codec) int {
	for _, l := range []int{3, 7, 11} {
		if codec.ZstdLevel(l) == zc {
			return l
		}
	}
	return 1
}

func (s *dictSet) lookup(id uint32) *dictEntry {
	if m := s.held.Load(); m != nil {
		return (*m)[id]
	}
	return nil
}

// known returns the dictionary with id if the set holds it.
func (s *dictSet) known(id uint32) *codec.Dictionary {
	if e := s.lookup(id); e != nil && e.d != nil {
		e.use()
		return e.d
	}
	return nil
}

func (e *dictEntry) use() {
	if !e.used.Load() { // a store only when it changes: reads share the line
		e.used.Store(true)
	}
}

// add puts e in the set, in place of any entry of its id, and evicts
// fetched entries past maxFetchedDictionaries: ids found missing first,
// then, as a clock does, the first dictionary not used since the eviction
// before. s.mu is held.
func (s *dictSet) add(e *dictEntry) {
	m := map[uint32]*dictEntry{}
	if old := s.held.Load(); old != nil {
		for id, v := range *old {
			m[id] = v
		}
	}
	m[e.id] = e
	if e.own == nil {
		e.used.Store(true) // it is fetched to be used
		s.order = append(s.order, e)
	}
	for len(s.order) > maxFetchedDictionaries {
		v := s.order[0]
		s.order = s.order[1:]
		switch {
		case m[v.id] != v: // replaced by a later fetch
		case v.d != nil && v.used.Load():
			v.used.Store(false)
			s.order = append(s.order, v)
		default:
			delete(m, v.id)
		}
	}
	s.held.Store(&m)
}

// decodeValue is codec.DecodeValue with the cache's dictionaries: a value
// written with one is decoded with it, fetched from Redis the first time.
// Only a value sound as far as can be told without its dictionary costs a
// fetch: codec.DecodeValue checks the frame and its size first. A
// dictionary that cannot be had is an error matching
// codec.ErrUnknownDictionary, or ErrRedis when Redis failed.
func (c *Cache[T]) decodeValue(dst []byte, p *policy[T], value []byte) ([]byte, error) {
	if id, ok := codec.DictionaryID(value); ok {
		if d := c.dicts.known(id); d != nil {
			return codec.DecodeValueDict(dst, value, c.maxSize, d)
		}
	}
	out, err := codec.DecodeValue(dst, value, c.maxSize)
	var de *codec.DictionaryError
	if !errors.As(err, &de) {
		return out, err
	}
	d, err := c.dictionary(p, de.ID)
	if err != nil {
		return dst, err
	}
	return codec.DecodeValueDict(dst, value, c.maxSize, d)
}

// lacksDictionary reports whether err, from decodeValue, says that a value
// may be sound but its dictionary cannot be had: such a value is kept.
func lacksDictionary(err error) bool {
	return errors.Is(err, codec.ErrUnknownDictionary) || errors.Is(err, ErrRedis)
}

// dictionary returns the dictionary with id, fetching it from Redis if
// the set has neither it nor a recent failure to get it. Concurrent reads
// of one id share one fetch. The fetch is the cache's, not a caller's: it
// is bounded by the Redis budget and no caller's context ends it.
func (c *Cache[T]) dictionary(p *policy[T], id uint32) (*codec.Dictionary, error) {
	s := &c.dicts
	if e, ok := s.settled(id); ok {
		return e.get()
	}
	s.mu.Lock()
	if e, ok := s.settled(id); ok { // fetched while this read took the lock
		s.mu.Unlock()
		return e.get()
	}
	f := s.fetching[id]
	if f != nil {
		s.mu.Unlock()
		<-f.done
		return f.e.get()
	}
	f = &dictFetch{done: make(chan struct{})}
	if s.fetching == nil {
		s.fetching = map[uint32]*dictFetch{}
	}
	s.fetching[id] = f
	s.mu.Unlock()

	e := c.fetchDictionary(p, id)
	s.mu.Lock()
	delete(s.fetching, id)
	if e.d != nil || e.retry != 0 { // a Redis failure is not remembered
		s.add(e)
	}
	s.mu.Unlock()
	f.e = e
	close(f.done)
	return e.get()
}

// settled returns the set's entry for id unless a read must fetch it.
func (s *dictSet) settled(id uint32) (*dictEntry, bool) {
	e := s.lookup(id)
	return e, e != nil && (e.d != nil || time.Now().UnixNano() < e.retry)
}

func (e *dictEntry) get() (*codec.Dictionary, error) {
	if e.d == nil {
		return nil, e.err
	}
	e.use()
	return e.d, nil
}

// fetchDictionary reads the dictionary with id from Redis and verifies it:
// it must parse and have that id. It reads with GETRANGE up to one byte
// past codec.MaxDictionarySize, so that whatever the key holds, a reader
// allocates no more than a dictionary may take.
func (c *Cache[T]) fetchDictionary(p *policy[T], id uint32) *dictEntry {
	key := codec.DictionaryKey(id)
	e := &dictEntry{id: id}
	var b []byte
	err := c.roundTrip(c.life.ctx, "get", key, p, true, func(ctx context.Context) (err error) {
		b, err = c.rdb.GetRange(ctx, key, 0, codec.MaxDictionarySize).Bytes()
		return err
	})
	refuse := func(format string, args ...any) *dictEntry {
		e.err = fmt.Errorf("%w: %s", &codec.DictionaryError{ID: id}, fmt.Sprintf(format, args...))
		e.retry = time.Now().Add(dictionaryRetry).UnixNano()
		return e
	}
	var re redis.Error
	switch {
	case errors.As(err, &re) && strings.HasPrefix(re.Error(), "WRONGTYPE"):
		return refuse("%s is not a string", key)
	case err != nil:
		e.err = fmt.Errorf("fetching zstd dictionary %s: %w", key, redisCause(err))
		return e
	case len(b) == 0:
		return refuse("Redis does not hold %s", key)
	case len(b) > codec.MaxDictionarySize:
		return refuse("%s holds over %d bytes, more than a dictionary may", key, codec.MaxDictionarySize)
	}
	d, err := codec.ParseDictionary(b)
	switch {
	case err != nil:
		return refuse("%s: %v", key, err)
	case d.ID() != id:
		return refuse("%s holds dictionary %08x", key, d.ID())
	}
	e.d = d
	return e
}

// redisCause is a roundTrip error for a dictionary's key without the
// *Error naming that key: the error returned names the value's key.
func redisCause(err error) error {
	var ke *Error
	if errors.As(err, &ke) {
		return ke.Err
	}
	return err
}

// published reports whether a write of key may use p's dictionary: whether
// Redis holds it, as far as this cache knows. The first write publishes it
// (the writes that come meanwhile wait for it), and a write once a minute
// publishes it again (the others go on). A failure is reported to the
// error handler; if the dictionary was never published, the write is
// stored without it, and so are the writes of the next second.
func (c *Cache[T]) published(ctx context.Context, op, key string, p *policy[T]) bool {
	w := p.dict
	last := w.published.Load()
	now := time.Now().UnixNano()
	switch {
	case last != 0 && now-last < int64(republishEvery):
		return true
	case now-w.failed.Load() < int64(dictionaryRetry):
		return last != 0
	case last != 0:
		if !w.mu.TryLock() {
			return true // another write publishes it again
		}
	default:
		w.mu.Lock()
	}
	defer w.mu.Unlock()
	if w.published.Load() != last || time.Now().UnixNano()-w.failed.Load() < int64(dictionaryRetry) {
		// Another write published it, or failed to, while this one
		// waited.
		return w.published.Load() != 0
	}
	dk := codec.DictionaryKey(w.d.ID())
	b := w.d.Bytes()
	err := c.roundTripMany(ctx, "set", []string{dk}, true, func(ctx context.Context, pipe redis.Cmdable, _ int, sha bool) redis.Cmder {
		return runScript(ctx, pipe, publishScript, sha, dk, b)
	})[0]
	if err == nil {
		w.published.Store(time.Now().UnixNano())
		return true
	}
	if errors.Is(err, ErrRedis) {
		w.failed.Store(time.Now().UnixNano())
	}
	what := "so stored without it"
	if last != 0 {
		what = "again"
	}
	c.report(ctx, key, keyErr(op, key, fmt.Errorf("publishing zstd dictionary %s, %s: %w", dk, what, redisCause(err))))
	return last != 0
}
