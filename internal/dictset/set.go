// Package dictset holds a cache's Zstandard dictionaries (FORMAT.md
// section 3.6): those its policies write with, which it publishes in
// Redis before the first value written with one is stored, and those it
// fetched from Redis to read values other processes wrote.
//
// A Set is where to start. Its Decode is codec.DecodeValue for values
// written with any dictionary: a value naming a dictionary the Set does
// not hold costs one fetch of it from Redis, shared by every read of that
// id meanwhile. What callers can rely on:
//
//   - A dictionary fetched is verified before it is used: it must parse,
//     and its id must be the one its key names. Anything else the key
//     holds (another dictionary, a forged id, a hash, 64 MiB) is refused
//     with an error matching codec.ErrUnknownDictionary, and reading it
//     allocates no more than a dictionary may take.
//   - One fetch per id at a time, however many readers want it; no
//     caller's context ends it.
//   - An id found missing or refused is remembered as such for a second
//     (a read of it then costs no fetch); a Redis failure is not
//     remembered, so the next read fetches again.
//   - At most 64 fetched dictionaries and missing ids are held; the
//     policies' own are never evicted.
//   - A Writer's dictionary is published (stored under
//     codec.DictionaryKey with no expiry) before Published first reports
//     true, again once a minute while values are written with it, and
//     again at once when a write tells it Redis lost it (Writer.Lost).
//
// A Set reaches Redis only through the Redis interface its caller
// implements, so that every call is made as the caller's other calls are:
// under its time budget, its circuit breaker and its judgement of errors.
package dictset

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/packcache/packcache/codec"
)

const (
	// maxFetched bounds the dictionaries a Set holds that it fetched, and
	// the ids it remembers as missing: a dictionary takes up to 128 KiB
	// and its decoder about 50 KiB, and values naming thousands of ids
	// must not make a reader keep thousands.
	maxFetched = 64

	// retryAfter is how long a dictionary found missing from Redis, or
	// refused, is remembered as such before a read fetches it again; and
	// how long a failed publication is waited out before a write tries
	// again. Reads of values whose dictionary is missing then cost one
	// fetch a second, not one each.
	retryAfter = time.Second

	// republishEvery is how often a writer publishes its dictionary
	// again, so that a dictionary key evicted (allkeys-lru, as it is read
	// only when a process starts) or deleted comes back while values are
	// written with it, also by writes that do not check for it (see
	// Writer.Lost).
	republishEvery = time.Minute

	// checkEvery is how often a writer asks Redis whether it still holds
	// the dictionary (a GETRANGE of one byte, on the node that holds it),
	// on a write that did not learn it in its own round trip (see
	// Writer.Published): a dictionary lost while every write is a SetMany,
	// a load, or on another node is published again within a second of a
	// write, not a minute.
	checkEvery = time.Second
)

// A Set is a cache's dictionaries by id: its policies' own and those it
// fetched from Redis. The zero Set is empty and ready to use. A Set is
// safe for concurrent use; reads look dictionaries up without a lock.
type Set struct {
	held atomic.Pointer[map[uint32]*entry] // copied on every change

	mu    sync.Mutex // held while the set changes
	order []*entry   // fetched entries, oldest first, for eviction; may hold replaced ones

	fetches fetches // the fetches under way, which reads of the same id wait for
}

// An entry is a dictionary the set holds, or an id found missing or
// refused (d nil, until retry). It does not change once in the set, but
// for used.
type entry struct {
	id    uint32
	d     *codec.Dictionary
	own   *Writer // a policy's own; never evicted
	err   error   // d nil: why
	retry int64   // d nil: unix nanoseconds from which a read fetches it again; 0: a Redis failure, not kept
	used  atomic.Bool
}

// Writer parses b, a policy's dictionary, adds it to s (once per id,
// however many policies give it) and returns it with its codec at the
// level of zc, the policy's codec: a zstd codec, or codec.None, for which
// the codec returned is nil. Bytes that are not a dictionary are an error
// matching codec.ErrInvalidDictionary; a codec of another algorithm is an
// error too (see CheckCodec).
func (s *Set) Writer(b []byte, zc codec.Codec) (*Writer, codec.Codec, error) {
	d, err := codec.ParseDictionary(b)
	if err != nil {
		return nil, nil, fmt.Errorf("the Dictionary: %w", err)
	}
	if err := CheckCodec(zc); err != nil {
		return nil, nil, err
	}
	e := s.lookup(d.ID())
	if e == nil || e.own == nil {
		e = &entry{id: d.ID(), d: d, own: &Writer{d: d, key: codec.DictionaryKey(d.ID())}}
		s.mu.Lock()
		s.add(e)
		s.mu.Unlock()
	}
	if zc.ID() == codec.HeaderNone {
		return e.own, nil, nil
	}
	return e.own, e.d.Codec(zstdLevel(zc)), nil
}

// CheckCodec returns an error unless c may be given beside a dictionary:
// a dictionary is zstd's, so c must be a zstd codec (whose level the
// dictionary's codec takes) or codec.None.
func CheckCodec(c codec.Codec) error {
	switch c.ID() {
	case codec.HeaderZstd, codec.HeaderNone:
		return nil
	}
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

// Decode is codec.DecodeValue with the set's dictionaries: a value written
// with one is decoded with it, fetched through r the first time. Only a
// value sound as far as can be told without its dictionary costs a fetch:
// codec.DecodeValue checks the frame and its size first. A dictionary
// that cannot be had is an error matching codec.ErrUnknownDictionary, or
// r's error when Redis failed.
func (s *Set) Decode(dst, value []byte, limit int, r Redis) ([]byte, error) {
	if id, ok := codec.DictionaryID(value); ok {
		if d := s.known(id); d != nil {
			return codec.DecodeValueDict(dst, value, limit, d)
		}
	}
	out, err := codec.DecodeValue(dst, value, limit)
	var de *codec.DictionaryError
	if !errors.As(err, &de) {
		return out, err
	}
	d, err := s.Dictionary(de.ID, r)
	if err != nil {
		return dst, err
	}
	return codec.DecodeValueDict(dst, value, limit, d)
}

// Dictionary returns the dictionary with id, fetching it through r if the
// set has neither it nor a recent failure to get it (see the package
// doc). Concurrent calls for one id share one fetch, and get its result.
// The fetch is the set's, not a caller's: it is bounded by r's budget and
// no caller's context ends it.
func (s *Set) Dictionary(id uint32, r Redis) (*codec.Dictionary, error) {
	if e, ok := s.settled(id); ok {
		return e.get()
	}
	return s.fetches.do(id, func() *entry {
		// A fetch that ended between the look above and this one's
		// start has left its entry in the set: no second fetch.
		if e, ok := s.settled(id); ok {
			return e
		}
		e := fetch(r, id)
		if e.d != nil || e.retry != 0 { // a Redis failure is not remembered
			s.mu.Lock()
			s.add(e)
			s.mu.Unlock()
		}
		return e
	}).get()
}

func (s *Set) lookup(id uint32) *entry {
	if m := s.held.Load(); m != nil {
		return (*m)[id]
	}
	return nil
}

// known returns the dictionary with id if the set holds it.
func (s *Set) known(id uint32) *codec.Dictionary {
	if e := s.lookup(id); e != nil && e.d != nil {
		e.use()
		return e.d
	}
	return nil
}

// settled returns the set's entry for id unless a read must fetch it.
func (s *Set) settled(id uint32) (*entry, bool) {
	e := s.lookup(id)
	return e, e != nil && (e.d != nil || time.Now().UnixNano() < e.retry)
}

// add puts e in the set, in place of any entry of its id, and evicts
// fetched entries past maxFetched: ids found missing first, then, as a
// clock does, the first dictionary not used since the eviction before.
// s.mu is held.
func (s *Set) add(e *entry) {
	m := map[uint32]*entry{}
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
	for len(s.order) > maxFetched {
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

func (e *entry) use() {
	if !e.used.Load() { // a store only when it changes: reads share the line
		e.used.Store(true)
	}
}

func (e *entry) get() (*codec.Dictionary, error) {
	if e.d == nil {
		return nil, e.err
	}
	e.use()
	return e.d, nil
}
