package packcache

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/packcache/packcache/codec"
)

// Stats is a snapshot of a cache's counters, in total and per prefix.
// It marshals to JSON (encoding/json), for a health endpoint: Served's
// keys as "200 zstd", "404" (ServeResponse.MarshalText), and back.
type Stats struct {
	Counters

	// Prefixes holds the counters of each prefix configured with
	// WithPrefix; keys under no configured prefix count under "".
	Prefixes map[string]Counters

	// NearServing reports whether the near cache (WithLocalCache) can
	// serve now: its invalidation stream is up and proven within MaxLag.
	NearServing bool

	// Invalidations of failed writes (see ErrPending). Every key kept for
	// retry is, at any moment, exactly one of pending, applied or expired:
	// PendingKept = Pending + PendingApplied + PendingExpired. (A key that
	// fails again while pending is not kept twice.)
	Pending        int    // kept and not yet applied, now
	PendingKept    uint64 // keys kept for retry
	PendingApplied uint64 // retries that landed
	PendingExpired uint64 // dropped once the longest TTL the old value could have had had passed
	PendingDropped uint64 // failed writes not kept, the bound being reached (their errors say so)

	// Breakers holds the state of each Redis node's circuit breaker
	// (WithCircuitBreaker), for health checks: the one node of a
	// single-node client; on a Cluster each master a call went to,
	// ordered by address, and, once its breaker has opened, the shared
	// breaker (Addr "") of calls whose master was unknown.
	Breakers []BreakerState

	// Served counts Serve's responses by status and content coding, with
	// the body bytes sent.
	Served map[ServeResponse]ServeCount
}

// BreakerState is a Redis node's circuit breaker.
type BreakerState struct {
	Addr  string    // the node's address as the client names it ("FailoverClient" through Sentinel)
	Open  bool      // open, or half open: calls to the node fail with ErrCircuitOpen but for one probe
	Since time.Time // when it last opened or closed; if it never did, when the cache first used the node
}

// ServeResponse is a kind of response Serve wrote: its status, and, for
// a response about a body (200, 304 and 412), the body's content coding,
// "zstd", "gzip", "identity" or "dcz" (Policy.Deltas); "" for the others (404, 405, 406, 500,
// 503: an error's status as Serve chose it, whatever WithServeError
// wrote).
type ServeResponse struct {
	Status int    // the HTTP status Serve chose
	Coding string // "zstd", "gzip" or "identity" for a 200, 304 or 412; "" for the others
}

// MarshalText is the response's status, then its coding if any, as in
// "200 zstd" or "404": the key of Stats.Served in JSON.
func (r ServeResponse) MarshalText() ([]byte, error) {
	b := strconv.AppendInt(nil, int64(r.Status), 10)
	if r.Coding != "" {
		b = append(append(b, ' '), r.Coding...)
	}
	return b, nil
}

// UnmarshalText reads what MarshalText writes.
func (r *ServeResponse) UnmarshalText(b []byte) error {
	status, coding, _ := strings.Cut(string(b), " ")
	n, err := strconv.Atoi(status)
	if err != nil || n < 100 || n > 999 || strings.Contains(coding, " ") {
		return fmt.Errorf("packcache: ServeResponse %q: want a status and an optional coding, as in \"200 zstd\"", b)
	}
	r.Status, r.Coding = n, coding
	return nil
}

// ServeCount counts Serve's responses of one kind.
type ServeCount struct {
	Responses uint64 // responses written
	Bytes     uint64 // body bytes written: a 200's body (none for HEAD); 0 for the others
}

// Counters counts what a cache did since it was created. Each counter is
// one sentence a reader can check, and they add up:
//
//	Gets  = NearHits + Hits + StaleServes + Misses + NotFoundHits + GetErrors
//	Loads = Stores + Superseded + TooLarge + Unstored
//
// A load is counted per key. Sets counts only Set and SetMany; values
// stored by loads are Stores. RedisErrors counts failed Redis calls, which
// a Get may make more than one of, or none (the near cache).
type Counters struct {
	// Gets counts Get and GetOrLoad calls and the distinct keys of GetMany
	// and GetOrLoadMany calls; each ends as exactly one of the six below.
	// (A call whose context had ended before it began is not counted.)
	Gets         uint64
	NearHits     uint64 // answered by the near cache (WithLocalCache)
	Hits         uint64 // answered with a value read from Redis (shared reads included)
	StaleServes  uint64 // answered with a value past its TTL, within StaleFor, because its reload failed
	Misses       uint64 // found no value: answered by a load (its own or one it joined), or ErrMiss without a loader
	NotFoundHits uint64 // answered ErrNotFound: a remembered ErrNotFound, or the loader's
	GetErrors    uint64 // answered with any other error, the caller's own context ending included

	NearBytes    uint64 // estimated bytes the near caches hold now (WithLocalCache; in the total only)
	Sets         uint64 // values written by Set and SetMany
	DecodeErrors uint64 // stored values read that could not be decoded
	RedisErrors  uint64 // failed Redis calls (not counting those refused by an open breaker)

	// Loads counts the keys for which a loader returned a value or
	// ErrNotFound; each ends as exactly one of Stores, Superseded,
	// TooLarge and Unstored. LoadErrors counts the keys for which it
	// failed (an error, a panic, the load timeout, a nil pointer).
	Loads      uint64
	LoadErrors uint64

	// Stores counts loaded values (and remembered ErrNotFounds) written
	// to Redis.
	Stores uint64

	// Superseded counts loads whose value was not stored because the key
	// was written (or its lease taken over) after the load began: the
	// write won, as it must.
	Superseded uint64

	// TooLarge counts loaded values not stored because they serialize to
	// more than WithMaxValueSize: their callers got them all the same.
	TooLarge uint64

	// Unstored counts loads not stored for any other reason: the loader
	// said DoNotCache, ErrNotFound without a NegativeTTL, Redis was
	// unreachable or its invalidation pending (see ErrPending), another
	// process held the key's lease, the store failed, or the value could
	// not be serialized.
	Unstored uint64

	CoalescedWaits uint64 // callers that joined a read or load another caller began, counted as they join
	LockWaits      uint64 // loads that waited for another process's lease (WithLock)
	Refreshes      uint64 // background refreshes started

	// Codecs counts written values by the codec they were stored with;
	// values stored uncompressed count under "none".
	Codecs map[string]CodecStats
}

// CodecStats counts the values written with one codec.
type CodecStats struct {
	Values   uint64 // values written
	BytesIn  uint64 // their serialized size
	BytesOut uint64 // their stored size, header included
}

// counters are a policy's counts: the exported Counters themselves, each
// uint64 changed only by atomic.AddUint64 and read only by snapshot, so
// that a counter is declared once, where it is documented, and every list
// of them (snapshot, add) follows the struct by reflection.
//
// policy holds counters behind a pointer, so that they are 64-bit aligned
// for the atomic operations on every platform.
type counters struct {
	Counters
	codecs [256]codecCounters
}

// countFields are the indexes of Counters' uint64 fields.
var countFields = func() []int {
	var idx []int
	t := reflect.TypeFor[Counters]()
	for i := range t.NumField() {
		if t.Field(i).Type.Kind() == reflect.Uint64 {
			idx = append(idx, i)
		}
	}
	return idx
}()

type codecCounters struct {
	values, bytesIn, bytesOut atomic.Uint64
}

func (c *counters) snapshot() Counters {
	var s Counters
	from, to := reflect.ValueOf(&c.Counters).Elem(), reflect.ValueOf(&s).Elem()
	for _, i := range countFields {
		to.Field(i).SetUint(atomic.LoadUint64((*uint64)(from.Field(i).Addr().UnsafePointer())))
	}
	// Every read is counted once, by its outcome: Gets is their sum, one
	// atomic add fewer on a near hit.
	s.Gets = s.NearHits + s.Hits + s.StaleServes + s.Misses + s.NotFoundHits + s.GetErrors
	s.Codecs = map[string]CodecStats{}
	for id := range c.codecs {
		cc := &c.codecs[id]
		n := cc.values.Load()
		if n == 0 {
			continue
		}
		name := "none"
		if cd, ok := codec.Lookup(byte(id)); ok {
			name = cd.Name()
		}
		cs := s.Codecs[name]
		cs.Values += n
		cs.BytesIn += cc.bytesIn.Load()
		cs.BytesOut += cc.bytesOut.Load()
		s.Codecs[name] = cs
	}
	return s
}

func (s *Counters) add(o Counters) {
	to, from := reflect.ValueOf(s).Elem(), reflect.ValueOf(&o).Elem()
	for _, i := range countFields {
		to.Field(i).SetUint(to.Field(i).Uint() + from.Field(i).Uint())
	}
	if s.Codecs == nil {
		s.Codecs = map[string]CodecStats{}
	}
	for name, c := range o.Codecs {
		t := s.Codecs[name]
		t.Values += c.Values
		t.BytesIn += c.BytesIn
		t.BytesOut += c.BytesOut
		s.Codecs[name] = t
	}
}
