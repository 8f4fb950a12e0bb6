package packcacheotel_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/packcacheotel"
)

// These tests feed the observer events directly, one kind at a time, and
// read back what the SDK collected.

func TestReads(t *testing.T) {
	o, r := newObserver(t)
	feed := func(p string, oc packcache.ReadOutcome, sh bool, n int) {
		for range n {
			o.ObserveRead(packcache.ReadEvent{Prefix: p, Outcome: oc, Shared: sh})
		}
	}
	feed("a:", packcache.ReadHit, false, 3)
	feed("a:", packcache.ReadHit, true, 2)
	feed("a:", packcache.ReadMiss, true, 1)
	feed("a:", packcache.ReadMiss, false, 4)
	feed("", packcache.ReadStale, false, 5)
	feed("", packcache.ReadNotFound, false, 6)
	feed("", packcache.ReadNotFound, true, 7)
	feed("", packcache.ReadError, false, 8)
	feed("", packcache.ReadOutcome(200), false, 9) // an outcome this module does not know: dropped

	s := collect(t, r)
	for _, c := range []struct {
		want  int64
		attrs []attribute.KeyValue
	}{
		{3, []attribute.KeyValue{prefix("a:"), outcome("hit"), shared(false)}},
		{2, []attribute.KeyValue{prefix("a:"), outcome("hit"), shared(true)}},
		{1, []attribute.KeyValue{prefix("a:"), outcome("miss"), shared(true)}},
		{4, []attribute.KeyValue{prefix("a:"), outcome("miss"), shared(false)}},
		{5, []attribute.KeyValue{prefix(""), outcome("stale")}},
		{13, []attribute.KeyValue{prefix(""), outcome("not_found")}},
		{7, []attribute.KeyValue{prefix(""), shared(true)}},
		{8, []attribute.KeyValue{prefix(""), outcome("error"), shared(false)}},
		{10, []attribute.KeyValue{prefix("a:")}},
		{26, []attribute.KeyValue{prefix("")}},
	} {
		if got := s.sum("packcache.reads", c.attrs...); got != c.want {
			t.Errorf("packcache.reads%v = %d, want %d", c.attrs, got, c.want)
		}
	}
	m, _ := s.metric("packcache.reads")
	if n := len(m.Data.(metricdata.Sum[int64]).DataPoints); n != 8 {
		t.Errorf("packcache.reads has %d series, want the 8 fed", n)
	}
}

// TestEveryReadOutcome: each outcome packcache names is counted under its
// name. It fails when packcache gains an outcome that this module's
// tables have no room for (they would drop it).
func TestEveryReadOutcome(t *testing.T) {
	o, r := newObserver(t)
	var names []string
	for i := range 256 {
		name, ok := outcomeName(packcache.ReadOutcome(i))
		if !ok {
			break
		}
		names = append(names, name)
		o.ObserveRead(packcache.ReadEvent{Prefix: "p:", Outcome: packcache.ReadOutcome(i)})
	}
	s := collect(t, r)
	for _, n := range names {
		if got := s.sum("packcache.reads", outcome(n)); got != 1 {
			t.Errorf("outcome %q counted %d times, want 1", n, got)
		}
	}
	if len(names) < 5 {
		t.Errorf("packcache names %d outcomes (%q), want at least hit, miss, stale, not_found and error", len(names), names)
	}
}

// outcomeName returns o's name, or false if packcache names no such
// outcome.
func outcomeName(o packcache.ReadOutcome) (name string, ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	name = o.String()
	return name, name != "" && !strings.ContainsAny(name, "()")
}

func TestLoads(t *testing.T) {
	o, r := newObserver(t)
	loaderErr := errors.New("db down")
	events := []struct {
		err     error
		outcome string
	}{
		{nil, "ok"},
		{packcache.ErrNotFound, "not_found"},
		{fmt.Errorf("wrapped: %w", packcache.ErrNotFound), "not_found"},
		{packcache.DoNotCache, "do_not_cache"},
		{&packcache.Error{Op: "load", Key: "k", Err: packcache.ErrLoadTimeout}, "timeout"},
		{&packcache.PanicError{Value: "boom"}, "panic"},
		{&packcache.Error{Op: "load", Key: "k", Err: &packcache.PanicError{Value: loaderErr}}, "panic"},
		{loaderErr, "error"},
	}
	for i, e := range events {
		o.ObserveLoad(packcache.LoadEvent{Prefix: "p:", Keys: i + 1, Duration: time.Duration(i+1) * time.Millisecond, Err: e.err})
	}
	s := collect(t, r)
	want := map[string]struct {
		count, keys int64
		secs        float64
	}{}
	for i, e := range events {
		w := want[e.outcome]
		w.count++
		w.keys += int64(i + 1)
		w.secs += float64(i+1) / 1000
		want[e.outcome] = w
	}
	for oc, w := range want {
		count, sum := s.hist("packcache.load.duration", prefix("p:"), outcome(oc))
		if int64(count) != w.count || math.Abs(sum-w.secs) > 1e-9 {
			t.Errorf("packcache.load.duration{%s}: count %d sum %gs, want %d and %gs", oc, count, sum, w.count, w.secs)
		}
		if got := s.sum("packcache.load.keys", prefix("p:"), outcome(oc)); got != w.keys {
			t.Errorf("packcache.load.keys{%s} = %d, want %d", oc, got, w.keys)
		}
	}
}

func TestCodec(t *testing.T) {
	o, r := newObserver(t)
	o.ObserveCodec(packcache.CodecEvent{Prefix: "ch:", Codec: "lz4", Plain: 10_000, Stored: 3_000, Duration: time.Millisecond})
	o.ObserveCodec(packcache.CodecEvent{Prefix: "ch:", Codec: "lz4", Plain: 20_000, Stored: 5_000, Duration: time.Millisecond})
	o.ObserveCodec(packcache.CodecEvent{Prefix: "ch:", Codec: "lz4", Decode: true, Plain: 10_000, Stored: 3_000, Duration: 2 * time.Millisecond})
	o.ObserveCodec(packcache.CodecEvent{Prefix: "ch:", Codec: "none", Plain: 300, Stored: 300})
	o.ObserveCodec(packcache.CodecEvent{Prefix: "", Codec: "zstd", Decode: true, Plain: 7_000, Stored: 1_000})
	s := collect(t, r)
	for _, c := range []struct {
		want  int64
		attrs []attribute.KeyValue
	}{
		{30_000, []attribute.KeyValue{prefix("ch:"), codecName("lz4"), direction("encode"), form("plain")}},
		{8_000, []attribute.KeyValue{prefix("ch:"), codecName("lz4"), direction("encode"), form("stored")}},
		{10_000, []attribute.KeyValue{prefix("ch:"), codecName("lz4"), direction("decode"), form("plain")}},
		{3_000, []attribute.KeyValue{prefix("ch:"), codecName("lz4"), direction("decode"), form("stored")}},
		{300, []attribute.KeyValue{prefix("ch:"), codecName("none"), direction("encode"), form("stored")}},
		{7_000, []attribute.KeyValue{prefix(""), codecName("zstd"), direction("decode"), form("plain")}},
		{0, []attribute.KeyValue{prefix(""), direction("encode")}},
	} {
		if got := s.sum("packcache.codec.bytes", c.attrs...); got != c.want {
			t.Errorf("packcache.codec.bytes%v = %d, want %d", c.attrs, got, c.want)
		}
	}
	if n, sum := s.hist("packcache.codec.duration", prefix("ch:"), codecName("lz4"), direction("encode")); n != 2 || math.Abs(sum-0.002) > 1e-9 {
		t.Errorf("lz4 encodes: count %d sum %gs, want 2 and 0.002s", n, sum)
	}
	if n, _ := s.hist("packcache.codec.duration", direction("decode")); n != 2 {
		t.Errorf("decodes: count %d, want 2", n)
	}
}

// replyError is an error reply from Redis, as go-redis types it.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

func TestRedisErrors(t *testing.T) {
	o, r := newObserver(t)
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, c := range []struct {
		err   error
		etype string
	}{
		{context.DeadlineExceeded, "timeout"},
		{fmt.Errorf("get: %w", context.DeadlineExceeded), "timeout"},
		{context.Canceled, "canceled"},
		{redis.ErrPoolTimeout, "pool_timeout"},
		{dial, "network"},
		{&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, "timeout"},
		{io.EOF, "network"},
		{fmt.Errorf("write: %w", syscall.ECONNRESET), "network"},
		{replyError("LOADING Redis is loading the dataset in memory"), "LOADING"},
		{replyError("CLUSTERDOWN The cluster is down"), "CLUSTERDOWN"},
		{replyError("WRONGTYPE Operation against a key holding the wrong kind of value"), "WRONGTYPE"},
		{replyError("ERR unknown command"), "ERR"},
		{replyError("OOM"), "OOM"},
		{replyError("lower-case reply"), "ERR"},
		{replyError("Mixed case"), "ERR"},
		{replyError(strings.Repeat("X", 30) + " too long to be a code"), "ERR"},
		{replyError(""), "ERR"},
		{errors.New("something else"), "_OTHER"},
	} {
		o.ObserveRedis(packcache.RedisEvent{Prefix: "k:", Node: "10.1.2.3:7001", Err: c.err})
		s := collect(t, r)
		if n := s.sum("packcache.redis.errors", prefix("k:"), address("10.1.2.3"), port(7001), errorType(c.etype)); n == 0 {
			t.Errorf("%v: no packcache.redis.errors with error.type %q; have %v", c.err, c.etype, s.rm)
		}
	}
	// The one node of a non-cluster client is not named.
	o.ObserveRedis(packcache.RedisEvent{Prefix: "", Err: io.EOF})
	o.ObserveRedis(packcache.RedisEvent{Prefix: "k:", Node: "redis-7.internal:6380", Err: io.EOF})
	o.ObserveRedis(packcache.RedisEvent{Prefix: "k:", Node: "[::1]:6390", Err: io.EOF})
	o.ObserveRedis(packcache.RedisEvent{Prefix: "k:"}) // no error, no breaker: not an event
	s := collect(t, r)
	if n := s.sum("packcache.redis.errors", prefix("k:")); n != 20 {
		t.Errorf("packcache.redis.errors under k: = %d, want 20", n)
	}
	m, _ := s.metric("packcache.redis.errors")
	var unnamed, hostname, ipv6 int
	for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
		a, hasAddr := p.Attributes.Value("server.address")
		pt, hasPort := p.Attributes.Value("server.port")
		switch {
		case !hasAddr && !hasPort:
			unnamed++
		case a.AsString() == "redis-7.internal" && pt.AsInt64() == 6380:
			hostname++
		case a.AsString() == "::1" && pt.AsInt64() == 6390:
			ipv6++
		}
	}
	if unnamed != 1 || hostname != 1 || ipv6 != 1 {
		t.Errorf("node attributes: %d series unnamed, %d of redis-7.internal:6380, %d of [::1]:6390; want 1 each", unnamed, hostname, ipv6)
	}
}

func TestBreakerGauge(t *testing.T) {
	o, r := newObserver(t)
	node := []attribute.KeyValue{address("10.1.2.3"), port(7001)}
	state := func() (single, node7001 []metricdata.DataPoint[int64], trips int64) {
		s := collect(t, r)
		for _, p := range s.gauge("packcache.breaker.open") {
			if _, ok := p.Attributes.Value("server.address"); !ok {
				single = append(single, p)
			}
		}
		return single, s.gauge("packcache.breaker.open", node...), s.sum("packcache.breaker.trips", node...)
	}

	// Before any event: no series. The cache tells of each node it
	// knows, closed, with its address (issue 24: a series without
	// server.address beside the node's own on a single node).
	single, n, trips := state()
	if len(single) != 0 || len(n) != 0 || trips != 0 {
		t.Fatalf("at start: unnamed %v, node 7001 %v, %d trips; want nothing", single, n, trips)
	}
	o.ObserveRedis(packcache.RedisEvent{Node: "10.1.2.3:7001", Breaker: "closed"})
	if single, n, trips = state(); len(n) != 1 || n[0].Value != 0 || trips != 0 || len(single) != 0 {
		t.Fatalf("the node known: node 7001 %v, %d trips, unnamed %v; want closed, no trip, nothing unnamed", n, trips, single)
	}
	o.ObserveRedis(packcache.RedisEvent{Node: "10.1.2.3:7001", Breaker: "open"})
	if single, n, trips = state(); len(n) != 1 || n[0].Value != 1 || trips != 1 || len(single) != 0 {
		t.Fatalf("after opening: node 7001 %v, %d trips, unnamed %v; want open, 1 trip, nothing unnamed", n, trips, single)
	}
	o.ObserveRedis(packcache.RedisEvent{Node: "10.1.2.3:7001", Breaker: "closed"})
	if _, n, trips = state(); len(n) != 1 || n[0].Value != 0 || trips != 1 {
		t.Fatalf("after closing: node 7001 %v, %d trips; want closed, 1 trip", n, trips)
	}
	o.ObserveRedis(packcache.RedisEvent{Breaker: "open"})
	o.ObserveRedis(packcache.RedisEvent{Node: "10.1.2.3:7001", Breaker: "open"})
	if single, n, trips = state(); single[0].Value != 1 || n[0].Value != 1 || trips != 2 {
		t.Fatalf("after both opened: single node %v, node 7001 %v, %d trips; want both open, 2 trips", single, n, trips)
	}
	if errs := collect(t, r).sum("packcache.redis.errors"); errs != 0 {
		t.Errorf("breaker events counted as %d Redis errors", errs)
	}
}

func TestConstantAttributes(t *testing.T) {
	o, r := newObserver(t, packcacheotel.WithAttributes(attribute.String("packcache.cache", "orders")),
		packcacheotel.WithAttributes(attribute.Int("shard", 3)))
	o.ObserveRead(packcache.ReadEvent{Prefix: "a:"})
	o.ObserveLoad(packcache.LoadEvent{Prefix: "a:", Keys: 1})
	o.ObserveCodec(packcache.CodecEvent{Prefix: "a:", Codec: "zstd"})
	o.ObserveRedis(packcache.RedisEvent{Prefix: "a:", Node: "h:1", Err: io.EOF})
	o.ObserveRedis(packcache.RedisEvent{Node: "h:1", Breaker: "open"})
	o.(packcache.ServeObserver).ObserveServe(packcache.ServeEvent{Prefix: "a:", Status: 200, Coding: "gzip", Bytes: 100})
	s := collect(t, r)
	points := 0
	for _, sm := range s.rm.ScopeMetrics {
		if sm.Scope.Name != packcacheotel.ScopeName {
			t.Errorf("scope %q, want %q", sm.Scope.Name, packcacheotel.ScopeName)
		}
		for _, m := range sm.Metrics {
			var sets []attribute.Set
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			}
			for _, set := range sets {
				points++
				c, _ := set.Value("packcache.cache")
				sh, _ := set.Value("shard")
				if c.AsString() != "orders" || sh.AsInt64() != 3 {
					t.Errorf("%s: data point %v lacks the constant attributes", m.Name, set.ToSlice())
				}
			}
		}
	}
	// reads, load duration and keys, codec bytes (2) and duration, redis
	// errors, trips, the breaker gauge's node, the pending gauge, and
	// Serve's responses and bytes.
	if points != 12 {
		t.Errorf("%d data points, want 12", points)
	}
}

func TestOptions(t *testing.T) {
	for _, c := range []struct {
		name string
		opt  packcacheotel.Option
		want string
	}{
		{"nil provider", packcacheotel.WithMeterProvider(nil), "nil provider"},
		{"own key", packcacheotel.WithAttributes(attribute.String("packcache.prefix", "x")), `"packcache.prefix" is set by the observer`},
		{"own semconv key", packcacheotel.WithAttributes(attribute.String("error.type", "x")), `"error.type" is set by the observer`},
		{"invalid", packcacheotel.WithAttributes(attribute.KeyValue{}), "invalid attribute"},
	} {
		o, err := packcacheotel.NewObserver(c.opt)
		if err == nil || !strings.Contains(err.Error(), c.want) || o != nil {
			t.Errorf("%s: NewObserver = %v, %v; want an error containing %q", c.name, o, err, c.want)
		}
	}
	// The default, the global provider, works (it is a no-op until set).
	if o, err := packcacheotel.NewObserver(); err != nil || o == nil {
		t.Fatalf("NewObserver() = %v, %v", o, err)
	}
}

// TestInstruments checks each instrument's kind and unit, and that both the
// package documentation and the README list it.
func TestInstruments(t *testing.T) {
	o, r := newObserver(t)
	o.ObserveRead(packcache.ReadEvent{})
	o.ObserveLoad(packcache.LoadEvent{Keys: 1})
	o.ObserveCodec(packcache.CodecEvent{Codec: "none"})
	o.ObserveRedis(packcache.RedisEvent{Err: io.EOF})
	o.ObserveRedis(packcache.RedisEvent{Breaker: "open"})
	s := collect(t, r)
	want := map[string]struct{ kind, unit string }{
		"packcache.reads":                 {"counter", "{read}"},
		"packcache.load.duration":         {"histogram", "s"},
		"packcache.load.keys":             {"counter", "{key}"},
		"packcache.codec.bytes":           {"counter", "By"},
		"packcache.codec.duration":        {"histogram", "s"},
		"packcache.redis.errors":          {"counter", "{error}"},
		"packcache.breaker.open":          {"gauge", "{breaker}"},
		"packcache.breaker.trips":         {"counter", "{trip}"},
		"packcache.invalidations.pending": {"gauge", "{invalidation}"},
	}
	docs := map[string]string{}
	for _, f := range []string{"packcacheotel.go", "README.md"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs[f] = string(b)
	}
	seen := 0
	for _, sm := range s.rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			seen++
			w, ok := want[m.Name]
			if !ok {
				t.Errorf("undocumented instrument %s", m.Name)
				continue
			}
			kind := "?"
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				if d.IsMonotonic && d.Temporality == metricdata.CumulativeTemporality {
					kind = "counter"
				}
			case metricdata.Histogram[float64]:
				kind = "histogram"
			case metricdata.Gauge[int64]:
				kind = "gauge"
			}
			if kind != w.kind || m.Unit != w.unit || m.Description == "" {
				t.Errorf("%s: %s in %q (%q), want a %s in %q with a description", m.Name, kind, m.Unit, m.Description, w.kind, w.unit)
			}
			named := regexp.MustCompile(regexp.QuoteMeta(m.Name) + `[^\w.]`)
			for f, text := range docs {
				if !named.MatchString(text) {
					t.Errorf("%s does not document %s", f, m.Name)
				}
			}
		}
	}
	if seen != len(want) {
		t.Errorf("%d instruments recorded, want %d", seen, len(want))
	}
	for _, key := range []string{"packcache.prefix", "packcache.outcome", "packcache.shared", "packcache.codec.name",
		"packcache.codec.direction", "packcache.codec.form", "server.address", "server.port", "error.type"} {
		for f, text := range docs {
			if !strings.Contains(text, key) {
				t.Errorf("%s does not document the attribute %s", f, key)
			}
		}
	}
}

// TestConcurrentPrefixes records from many goroutines, each meeting
// prefixes, codecs and nodes for the first time, to exercise the tables
// that keep their attribute sets (run it with -race).
func TestConcurrentPrefixes(t *testing.T) {
	o, r := newObserver(t)
	const goroutines, prefixes, rounds = 8, 40, 5
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range rounds * prefixes {
				p := fmt.Sprintf("p%d:", (i+g)%prefixes)
				o.ObserveRead(packcache.ReadEvent{Prefix: p, Outcome: packcache.ReadHit})
				o.ObserveCodec(packcache.CodecEvent{Prefix: p, Codec: fmt.Sprint("c", i%3), Decode: true, Plain: 2, Stored: 1})
				o.ObserveRedis(packcache.RedisEvent{Prefix: p, Node: fmt.Sprintf("h:%d", i%4), Err: io.EOF})
				o.ObserveRedis(packcache.RedisEvent{Node: fmt.Sprintf("h:%d", i%4), Breaker: map[bool]string{true: "open", false: "closed"}[i%2 == 0]})
			}
		})
	}
	wg.Wait()
	s := collect(t, r)
	const total = goroutines * rounds * prefixes
	if n := s.sum("packcache.reads", outcome("hit")); n != total {
		t.Errorf("%d hits, want %d", n, total)
	}
	if n := s.sum("packcache.reads", prefix("p7:")); n != goroutines*rounds {
		t.Errorf("%d hits under p7:, want %d", n, goroutines*rounds)
	}
	if n := s.sum("packcache.codec.bytes", form("stored")); n != total {
		t.Errorf("%d stored bytes, want %d", n, total)
	}
	if n := s.sum("packcache.redis.errors", errorType("network")); n != total {
		t.Errorf("%d redis errors, want %d", n, total)
	}
	if pts := s.gauge("packcache.breaker.open"); len(pts) != 4 {
		t.Errorf("breaker gauge has %d series, want 4, one per node", len(pts))
	}
}
