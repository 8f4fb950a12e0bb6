package packcache

import (
	"sync/atomic"

	"github.com/packcache/packcache/codec"
)

// Stats is a snapshot of a cache's counters, in total and per prefix.
type Stats struct {
	Counters

	// Prefixes holds the counters of each prefix configured with
	// WithPrefix; keys under no configured prefix count under "".
	Prefixes map[string]Counters

	// NearServing reports whether the near cache (WithLocalCache) can
	// serve now: its invalidation stream is up and proven within MaxLag.
	NearServing bool
}

// Counters counts what a cache did since it was created.
type Counters struct {
	Hits         uint64 // Get and GetMany calls answered with a value read from Redis
	NearHits     uint64 // Get and GetMany calls answered by the near cache (not counted in Hits)
	NearBytes    uint64 // estimated bytes the near caches hold now (WithLocalCache; in the total only)
	Misses       uint64 // lookups that found no value
	Sets         uint64 // values written
	DecodeErrors uint64 // stored values that could not be decoded
	RedisErrors  uint64 // failed Redis calls

	Loads          uint64 // loader calls that returned a value or ErrNotFound
	LoadErrors     uint64 // loader calls that failed
	NotFoundHits   uint64 // lookups answered by a remembered ErrNotFound
	CoalescedWaits uint64 // callers that joined a read or load another caller began, counted as they join
	LockWaits      uint64 // loads that waited for another process's lease (WithLock)
	Refreshes      uint64 // background refreshes started
	StaleServes    uint64 // stale values returned because a reload failed

	// Superseded counts loads whose value was not stored because the key
	// was written (or its lease taken over) after the load began: the
	// write won, as it must.
	Superseded uint64

	// TooLarge counts loaded values not stored because they serialize to
	// more than WithMaxValueSize: their callers got them all the same.
	TooLarge uint64

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

type counters struct {
	hits, misses, sets, decodeErrors, redisErrors   atomic.Uint64
	nearHits                                        atomic.Uint64
	loads, loadErrors, notFoundHits, coalescedWaits atomic.Uint64
	lockWaits, refreshes, staleServes, superseded   atomic.Uint64
	tooLarge                                        atomic.Uint64
	codecs                                          [256]codecCounters
}

type codecCounters struct {
	values, bytesIn, bytesOut atomic.Uint64
}

func (c *counters) wrote(id byte, in, out int) {
	cc := &c.codecs[id]
	cc.values.Add(1)
	cc.bytesIn.Add(uint64(in))
	cc.bytesOut.Add(uint64(out))
}

func (c *counters) snapshot() Counters {
	s := Counters{
		Hits:           c.hits.Load(),
		NearHits:       c.nearHits.Load(),
		Misses:         c.misses.Load(),
		Sets:           c.sets.Load(),
		DecodeErrors:   c.decodeErrors.Load(),
		RedisErrors:    c.redisErrors.Load(),
		Loads:          c.loads.Load(),
		LoadErrors:     c.loadErrors.Load(),
		NotFoundHits:   c.notFoundHits.Load(),
		CoalescedWaits: c.coalescedWaits.Load(),
		LockWaits:      c.lockWaits.Load(),
		Refreshes:      c.refreshes.Load(),
		StaleServes:    c.staleServes.Load(),
		Superseded:     c.superseded.Load(),
		TooLarge:       c.tooLarge.Load(),
		Codecs:         map[string]CodecStats{},
	}
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
	s.Hits += o.Hits
	s.NearHits += o.NearHits
	s.Misses += o.Misses
	s.Sets += o.Sets
	s.DecodeErrors += o.DecodeErrors
	s.RedisErrors += o.RedisErrors
	s.Loads += o.Loads
	s.LoadErrors += o.LoadErrors
	s.NotFoundHits += o.NotFoundHits
	s.CoalescedWaits += o.CoalescedWaits
	s.LockWaits += o.LockWaits
	s.Refreshes += o.Refreshes
	s.StaleServes += o.StaleServes
	s.Superseded += o.Superseded
	s.TooLarge += o.TooLarge
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
