package packcacheotel

import (
	"maps"
	"net"
	"strconv"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/packcache/packcache"
)

// The measurement options of every attribute combination are built once and
// kept. Recording with a kept []metric.AddOption costs no allocation: a
// fresh metric.WithAttributeSet boxes its set on each call, and a variadic
// list written at the call escapes into the instrument's interface method.

// A table maps a name (a prefix, a codec, a node) to what was built for it.
// Lookups, the hot path, read an immutable map through an atomic pointer:
// no lock, no allocation. A name not seen before copies the map under mu.
// Names come from the cache's configuration and its Redis nodes, so a
// table stays small and its copies are few.
type table[V any] struct {
	mu sync.Mutex
	m  atomic.Pointer[map[string]*V]
}

// get returns the value for name, built by build the first time.
func (t *table[V]) get(name string, build func() *V) *V {
	if m := t.m.Load(); m != nil {
		if v, ok := (*m)[name]; ok {
			return v
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	m := map[string]*V{}
	if old := t.m.Load(); old != nil {
		if v, ok := (*old)[name]; ok {
			return v // built while this caller waited for mu
		}
		m = maps.Clone(*old)
	}
	v := build()
	m[name] = v
	t.m.Store(&m)
	return v
}

// prefixSets holds the options of every measurement about one prefix.
type prefixSets struct {
	attrs []attribute.KeyValue // the constant attributes and packcache.prefix

	reads [numReadOutcomes][2][2][]metric.AddOption // by outcome, then shared, then near
	loads [numLoadOutcomes]struct {
		record []metric.RecordOption // packcache.load.duration
		add    []metric.AddOption    // packcache.load.keys
	}
	codecs      table[codecSets]
	redisErrors table[table[[]metric.AddOption]] // by node, then error.type

	// Serve's responses, by status and coding: a table as above, keyed
	// by both, so that a lookup builds no string.
	servesMu sync.Mutex
	serves   atomic.Pointer[map[serveKey][]metric.AddOption]
}

type serveKey struct {
	status int
	coding string
}

// served returns the options of Serve's responses of a status and coding
// under this prefix.
func (p *prefixSets) served(status int, coding string) []metric.AddOption {
	k := serveKey{status, coding}
	if m := p.serves.Load(); m != nil {
		if v, ok := (*m)[k]; ok {
			return v
		}
	}
	p.servesMu.Lock()
	defer p.servesMu.Unlock()
	m := map[serveKey][]metric.AddOption{}
	if old := p.serves.Load(); old != nil {
		if v, ok := (*old)[k]; ok {
			return v
		}
		m = maps.Clone(*old)
	}
	v := []metric.AddOption{set(with(p.attrs, keyStatus.Int(status), keyCoding.String(coding))...)}
	m[k] = v
	p.serves.Store(&m)
	return v
}

// codecSets holds the options of the codec measurements of one prefix and
// codec, indexed by direction (0 encode, 1 decode).
type codecSets struct {
	bytes [2][2][]metric.AddOption // then by form
	time  [2][]metric.RecordOption
}

const (
	formPlain = iota
	formStored
)

var (
	directionNames = [2]string{"encode", "decode"}
	formNames      = [2]string{"plain", "stored"}
)

// nodeSets holds the options of the breaker measurements of one node.
type nodeSets struct {
	address string
	server  []attribute.KeyValue // server.address and server.port, or nothing
	add     []metric.AddOption
	observe []metric.ObserveOption
}

// set makes the options that record with the attributes kvs: one set,
// built once.
func set(kvs ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(kvs...))
}

// with returns base followed by kvs, in a new slice.
func with(base []attribute.KeyValue, kvs ...attribute.KeyValue) []attribute.KeyValue {
	return append(append(make([]attribute.KeyValue, 0, len(base)+len(kvs)), base...), kvs...)
}

func (o *observer) prefix(name string) *prefixSets {
	return o.prefixes.get(name, func() *prefixSets {
		p := &prefixSets{attrs: with(o.base, keyPrefix.String(name))}
		for r := range numReadOutcomes {
			for shared := range 2 {
				for near := range 2 {
					s := set(with(p.attrs, keyOutcome.String(packcache.ReadOutcome(r).String()), keyShared.Bool(shared == 1), keyNear.Bool(near == 1))...)
					p.reads[r][shared][near] = []metric.AddOption{s}
				}
			}
		}
		for l := range numLoadOutcomes {
			s := set(with(p.attrs, keyOutcome.String(loadOutcomeNames[l]))...)
			p.loads[l].record = []metric.RecordOption{s}
			p.loads[l].add = []metric.AddOption{s}
		}
		return p
	})
}

func (p *prefixSets) codec(name string) *codecSets {
	return p.codecs.get(name, func() *codecSets {
		c := &codecSets{}
		for d := range 2 {
			kvs := with(p.attrs, keyCodec.String(name), keyDirection.String(directionNames[d]))
			c.time[d] = []metric.RecordOption{set(kvs...)}
			for f := range 2 {
				c.bytes[d][f] = []metric.AddOption{set(with(kvs, keyForm.String(formNames[f]))...)}
			}
		}
		return c
	})
}

// redisError returns the options of a Redis error of type etype on node n
// for this prefix.
func (p *prefixSets) redisError(n *nodeSets, etype string) []metric.AddOption {
	byType := p.redisErrors.get(n.address, func() *table[[]metric.AddOption] { return new(table[[]metric.AddOption]) })
	return *byType.get(etype, func() *[]metric.AddOption {
		kvs := append(with(p.attrs, n.server...), keyErrorType.String(etype))
		return &[]metric.AddOption{set(kvs...)}
	})
}

func (o *observer) node(addr string) *nodeSets {
	return o.nodes.get(addr, func() *nodeSets {
		n := &nodeSets{address: addr, server: nodeAttributes(addr)}
		s := set(with(o.base, n.server...)...)
		n.add = []metric.AddOption{s}
		n.observe = []metric.ObserveOption{s}
		return n
	})
}

// nodeAttributes returns server.address and server.port for a node's
// address, or none for "" (a Cluster's shared breaker of calls whose
// master is unknown, or a client that names no address).
func nodeAttributes(addr string) []attribute.KeyValue {
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return []attribute.KeyValue{keyAddress.String(addr)}
	}
	if n, err := strconv.Atoi(port); err == nil {
		return []attribute.KeyValue{keyAddress.String(host), keyPort.Int(n)}
	}
	return []attribute.KeyValue{keyAddress.String(host)}
}
