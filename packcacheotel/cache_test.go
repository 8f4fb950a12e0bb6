package packcacheotel_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// These tests drive a real packcache.Cache against real redis-server
// processes and check what the observer recorded against what the cache
// did and what Redis holds.

// Doc is the cached document: a list of lines, as large as asked.
type Doc struct {
	ID    string   `json:"id"`
	Lines []string `json:"lines"`
}

// makeDoc returns a document of about size bytes of JSON that compresses
// well, as JSON does.
func makeDoc(id string, size int) Doc {
	d := Doc{ID: id}
	for n := 0; n < size; n += 60 {
		d.Lines = append(d.Lines, fmt.Sprintf("line %06d of %s: the quick brown fox jumps over it", len(d.Lines), id))
	}
	return d
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func newCache(t testing.TB, rdb redis.UniversalClient, opts ...packcache.Option) *packcache.Cache[Doc] {
	t.Helper()
	c, err := packcache.New[Doc](rdb, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

func strlen(t testing.TB, rdb redis.UniversalClient, key string) int64 {
	t.Helper()
	n, err := rdb.StrLen(context.Background(), key).Result()
	if err != nil || n == 0 {
		t.Fatalf("STRLEN %s = %d, %v", key, n, err)
	}
	return n
}

// TestCacheMetrics runs reads, loads and writes of three prefixes through
// a cache and checks every count, and the bytes against STRLEN.
func TestCacheMetrics(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client(t)
	ctx := ctxT(t)
	obs, r := newObserver(t)
	c := newCache(t, rdb, packcache.WithObserver(obs), packcache.WithShareWindow(packcache.Off), packcache.WithPrefix("", packcache.Policy{NegativeTTL: time.Minute}),
		packcache.WithPrefix("doc:", packcache.Policy{Codec: codec.LZ4}),
		packcache.WithPrefix("neg:", packcache.Policy{}),
		packcache.WithLoader(packcache.LoaderFunc[Doc](func(ctx context.Context, key string) (Doc, error) {
			switch key {
			case "neg:absent":
				return Doc{}, packcache.ErrNotFound
			case "doc:broken":
				return Doc{}, errors.New("database down")
			}
			return makeDoc(key, 20_000), nil
		})))

	// A miss, loaded and stored with LZ4.
	if _, err := c.Get(ctx, "doc:1"); err != nil {
		t.Fatal(err)
	}
	first := collect(t, r)
	plain1 := first.sum("packcache.codec.bytes", prefix("doc:"), codecName("lz4"), direction("encode"), form("plain"))
	stored1 := first.sum("packcache.codec.bytes", prefix("doc:"), codecName("lz4"), direction("encode"), form("stored"))
	if want := strlen(t, rdb, "doc:1"); stored1 != want {
		t.Errorf("encoded doc:1 to %d bytes, but Redis holds %d", stored1, want)
	}
	if want := c.Stats().Codecs["lz4"].BytesIn; plain1 != int64(want) || plain1 < 15_000 {
		t.Errorf("encoded %d plain bytes of doc:1, Stats says %d", plain1, want)
	}

	// Three hits and a hit and a miss in a batch.
	for range 3 {
		if _, err := c.Get(ctx, "doc:1"); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := c.GetMany(ctx, []string{"doc:1", "doc:nothing"}); err != nil || len(got) != 1 {
		t.Fatalf("GetMany: %d values, %v; want doc:1 alone", len(got), err)
	}
	// Not found, loaded then remembered; a loader error.
	for range 2 {
		if _, err := c.Get(ctx, "neg:absent"); !errors.Is(err, packcache.ErrNotFound) {
			t.Fatalf("Get neg:absent: %v", err)
		}
	}
	if _, err := c.Get(ctx, "doc:broken"); err == nil {
		t.Fatal("Get doc:broken: no error")
	}
	// Writes under no prefix: a small value stays plain JSON, a large one
	// is compressed with the default codec, zstd.
	if err := c.Set(ctx, "small", Doc{ID: "small"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "large", makeDoc("large", 50_000)); err != nil {
		t.Fatal(err)
	}
	// A second miss under doc:.
	if _, err := c.Get(ctx, "doc:2"); err != nil {
		t.Fatal(err)
	}

	m := collect(t, r)
	st := c.Stats()
	for _, c := range []struct {
		want  int64
		attrs []attribute.KeyValue
	}{
		{4, []attribute.KeyValue{prefix("doc:"), outcome("hit"), shared(false)}},
		{3, []attribute.KeyValue{prefix("doc:"), outcome("miss"), shared(false)}}, // doc:1, doc:nothing, doc:2
		{1, []attribute.KeyValue{prefix("doc:"), outcome("error")}},
		{2, []attribute.KeyValue{prefix("neg:"), outcome("not_found")}},
		{0, []attribute.KeyValue{outcome("stale")}},
		{0, []attribute.KeyValue{prefix("")}},
		{int64(st.Hits), []attribute.KeyValue{outcome("hit")}},
		{int64(st.CoalescedWaits), []attribute.KeyValue{shared(true)}},
	} {
		if got := m.sum("packcache.reads", c.attrs...); got != c.want {
			t.Errorf("packcache.reads%v = %d, want %d", c.attrs, got, c.want)
		}
	}

	// Loads: doc:1 and doc:2, neg:absent, doc:broken.
	for _, c := range []struct {
		prefix, outcome string
		want            uint64
	}{{"doc:", "ok", 2}, {"neg:", "not_found", 1}, {"doc:", "error", 1}} {
		n, sum := m.hist("packcache.load.duration", prefix(c.prefix), outcome(c.outcome))
		if n != c.want || sum <= 0 {
			t.Errorf("packcache.load.duration{%s%s}: count %d, sum %gs; want %d loads", c.prefix, c.outcome, n, sum, c.want)
		}
		if k := m.sum("packcache.load.keys", prefix(c.prefix), outcome(c.outcome)); k != int64(c.want) {
			t.Errorf("packcache.load.keys{%s%s} = %d, want %d", c.prefix, c.outcome, k, c.want)
		}
	}
	if n, _ := m.hist("packcache.load.duration"); n != 4 {
		t.Errorf("%d loads recorded, want 4", n)
	}

	// Bytes: what was encoded is what Redis holds; each of the four
	// decodes of doc:1 read its stored bytes and gave back its JSON.
	lz4 := []attribute.KeyValue{prefix("doc:"), codecName("lz4")}
	for _, c := range []struct {
		name  string
		got   int64
		want  int64
		attrs []attribute.KeyValue
	}{
		{"lz4 stored, encoded", m.sum("packcache.codec.bytes", append(lz4, direction("encode"), form("stored"))...), strlen(t, rdb, "doc:1") + strlen(t, rdb, "doc:2"), nil},
		{"lz4 plain, encoded", m.sum("packcache.codec.bytes", append(lz4, direction("encode"), form("plain"))...), int64(st.Codecs["lz4"].BytesIn), nil},
		{"lz4 stored, decoded", m.sum("packcache.codec.bytes", append(lz4, direction("decode"), form("stored"))...), 4 * stored1, nil},
		{"lz4 plain, decoded", m.sum("packcache.codec.bytes", append(lz4, direction("decode"), form("plain"))...), 4 * plain1, nil},
		{"zstd stored, encoded", m.sum("packcache.codec.bytes", prefix(""), codecName("zstd"), direction("encode"), form("stored")), strlen(t, rdb, "large"), nil},
		{"zstd plain, encoded", m.sum("packcache.codec.bytes", prefix(""), codecName("zstd"), direction("encode"), form("plain")), int64(st.Codecs["zstd"].BytesIn), nil},
		{"none stored, encoded", m.sum("packcache.codec.bytes", prefix(""), codecName("none"), direction("encode"), form("stored")), strlen(t, rdb, "small"), nil},
		{"none plain, encoded", m.sum("packcache.codec.bytes", prefix(""), codecName("none"), direction("encode"), form("plain")), strlen(t, rdb, "small"), nil},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d bytes, want %d", c.name, c.got, c.want)
		}
	}
	if ratio := float64(m.sum("packcache.codec.bytes", prefix(""), codecName("zstd"), form("stored"))) /
		float64(m.sum("packcache.codec.bytes", prefix(""), codecName("zstd"), form("plain"))); ratio > 0.5 {
		t.Errorf("zstd stored/plain = %.2f: the forms are mixed up", ratio)
	}
	for _, c := range []struct {
		attrs []attribute.KeyValue
		want  uint64
	}{
		{append(lz4, direction("encode")), 2},
		{append(lz4, direction("decode")), 4},
		{[]attribute.KeyValue{prefix(""), direction("encode")}, 2},
		{[]attribute.KeyValue{prefix(""), direction("decode")}, 0},
	} {
		if n, sum := m.hist("packcache.codec.duration", c.attrs...); n != c.want || (n > 0) != (sum > 0) {
			t.Errorf("packcache.codec.duration%v: count %d, sum %gs; want %d", c.attrs, n, sum, c.want)
		}
	}
	if n := m.sum("packcache.redis.errors"); n != 0 || st.RedisErrors != 0 {
		t.Errorf("%d Redis errors recorded, Stats says %d; want none", n, st.RedisErrors)
	}
}

// TestCoalescedWaits: callers that wait for another's load are the reads
// with packcache.shared=true, and the load is recorded once.
func TestCoalescedWaits(t *testing.T) {
	s := redistest.Start(t)
	ctx := ctxT(t)
	obs, r := newObserver(t)
	release, entered := make(chan struct{}), make(chan struct{}, 1)
	// A share window longer than the test: every Get of the key shares
	// the first one's read and load, however late it comes.
	c := newCache(t, s.Client(t), packcache.WithObserver(obs), packcache.WithShareWindow(time.Hour),
		packcache.WithPrefix("doc:", packcache.Policy{}),
		packcache.WithLoader(packcache.LoaderFunc[Doc](func(ctx context.Context, key string) (Doc, error) {
			entered <- struct{}{}
			select {
			case <-release:
				return makeDoc(key, 5_000), nil
			case <-ctx.Done():
				return Doc{}, ctx.Err()
			}
		})))
	const callers = 5
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			if _, err := c.Get(ctx, "doc:slow"); err != nil {
				t.Error(err)
			}
		})
	}
	<-entered
	time.Sleep(50 * time.Millisecond) // let the others join; a late one joins all the same
	close(release)
	wg.Wait()
	m := collect(t, r)
	if n := m.sum("packcache.reads", prefix("doc:"), outcome("miss"), shared(true)); n != callers-1 || int64(c.Stats().CoalescedWaits) != n {
		t.Errorf("%d reads shared a load, Stats counts %d coalesced waits; want %d", n, c.Stats().CoalescedWaits, callers-1)
	}
	if n := m.sum("packcache.reads", prefix("doc:"), outcome("miss"), shared(false)); n != 1 {
		t.Errorf("%d reads did not share, want 1 (the one that loaded)", n)
	}
	if n, _ := m.hist("packcache.load.duration", prefix("doc:"), outcome("ok")); n != 1 {
		t.Errorf("%d loads recorded, want 1", n)
	}
	if n, _ := m.hist("packcache.codec.duration", direction("encode")); n != 1 {
		t.Errorf("%d encodes recorded, want 1", n)
	}
}

// TestBreakerMetrics stops and restarts the server: the failed reads are
// counted as Redis errors, and the breaker gauge goes to 1 and back to 0.
func TestBreakerMetrics(t *testing.T) {
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "stops the server")
	rdb := s.Client(t, func(o *redis.Options) {
		o.MaxRetries, o.DialerRetries, o.DialTimeout = -1, 1, 200*time.Millisecond
	})
	ctx := ctxT(t)
	obs, r := newObserver(t)
	const cooldown = 50 * time.Millisecond
	c := newCache(t, rdb, packcache.WithObserver(obs), packcache.WithShareWindow(packcache.Off), packcache.WithCircuitBreaker(2, cooldown),
		packcache.WithPrefix("doc:", packcache.Policy{}))
	if err := c.Set(ctx, "doc:1", makeDoc("doc:1", 100)); err != nil {
		t.Fatal(err)
	}
	// A client of one node: its breaker's gauge is one series, naming
	// the node (server.address and server.port, as on
	// packcache.redis.errors and as on a Cluster) from the start.
	breaker := func() int64 {
		t.Helper()
		pts := collect(t, r).gauge("packcache.breaker.open")
		if len(pts) != 1 {
			t.Fatalf("breaker gauge: %v, want the node's series alone", pts)
		}
		if addr, ok := pts[0].Attributes.Value("server.address"); !ok || addr.AsString()+":"+portOf(pts[0]) != s.Addr() {
			t.Fatalf("breaker gauge's series %v does not name the server, %s", pts[0].Attributes.ToSlice(), s.Addr())
		}
		return pts[0].Value
	}
	if b := breaker(); b != 0 {
		t.Fatalf("breaker gauge %d before any failure, want 0", b)
	}

	s.Stop(t)
	for range 2 {
		if _, err := c.Get(ctx, "doc:1"); !errors.Is(err, packcache.ErrRedis) {
			t.Fatalf("Get with Redis stopped: %v, want ErrRedis", err)
		}
	}
	m := collect(t, r)
	if b := breaker(); b != 1 {
		t.Errorf("breaker gauge %d after a refused connection, want 1", b)
	}
	if n := m.sum("packcache.breaker.trips"); n != 1 {
		t.Errorf("packcache.breaker.trips = %d, want 1", n)
	}
	// The stopped server refuses connections: the first failure opens the
	// breaker at once, and the second Get does not try Redis.
	if n := m.sum("packcache.redis.errors", prefix("doc:"), errorType("network")); n != 1 {
		t.Errorf("packcache.redis.errors{doc:, network} = %d, want 1 (all: %d)", n, m.sum("packcache.redis.errors"))
	}
	// With the breaker open, a Get does not try Redis: a read error, and
	// no Redis error.
	if _, err := c.Get(ctx, "doc:1"); !errors.Is(err, packcache.ErrCircuitOpen) {
		t.Fatalf("Get with the breaker open: %v, want ErrCircuitOpen", err)
	}
	m = collect(t, r)
	if n, st := m.sum("packcache.redis.errors"), c.Stats().RedisErrors; n != 1 || st != 1 {
		t.Errorf("%d Redis errors recorded, Stats says %d; want 1", n, st)
	}
	if n := m.sum("packcache.reads", prefix("doc:"), outcome("error")); n != 3 {
		t.Errorf("%d read errors, want 3", n)
	}

	// Back up: after the cool-down, one probe succeeds and closes it.
	s.Restart(t)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(cooldown) {
		if _, err := c.Get(ctx, "doc:1"); err == nil || errors.Is(err, packcache.ErrMiss) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no Get succeeded within 30s of the restart")
		}
	}
	if b := breaker(); b != 0 {
		t.Errorf("breaker gauge %d after a Get succeeded, want 0", b)
	}
	if n := collect(t, r).sum("packcache.breaker.trips"); n != 1 {
		t.Errorf("packcache.breaker.trips = %d after closing, want still 1", n)
	}
}

// TestPendingMetrics: a Delete that fails while Redis is stopped by
// SIGSTOP is pending: the gauge reads 1 until its invalidation lands after
// SIGCONT, then 0; and the failure is one Redis error, as in Stats, not
// two (the pending count is an event of its own).
func TestPendingMetrics(t *testing.T) {
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "pauses the server")
	rdb := s.Client(t, func(o *redis.Options) { o.MaxRetries = -1 })
	ctx := ctxT(t)
	obs, r := newObserver(t)
	c := newCache(t, rdb, packcache.WithObserver(obs), packcache.WithRedisTimeout(200*time.Millisecond))
	pending := func() int64 {
		t.Helper()
		pts := collect(t, r).gauge("packcache.invalidations.pending")
		if len(pts) != 1 {
			t.Fatalf("packcache.invalidations.pending: %v, want one series", pts)
		}
		return pts[0].Value
	}
	if n := pending(); n != 0 {
		t.Fatalf("pending gauge %d before any failure, want 0", n)
	}
	s.Pause(t)
	if err := c.Delete(ctx, "doc:1"); !errors.Is(err, packcache.ErrPending) {
		s.Resume(t)
		t.Fatalf("Delete with Redis stopped: %v, want ErrPending", err)
	}
	n := pending()
	m := collect(t, r)
	s.Resume(t)
	if n != 1 {
		t.Errorf("pending gauge %d after a failed Delete, want 1", n)
	}
	if got, st := m.sum("packcache.redis.errors"), c.Stats().RedisErrors; got != int64(st) || got != 1 {
		t.Errorf("%d Redis errors recorded, Stats says %d; want 1", got, st)
	}
	for deadline := time.Now().Add(10 * time.Second); pending() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("pending gauge still %d 10 s after SIGCONT (Stats: %d pending)", pending(), c.Stats().Pending)
		}
		time.Sleep(2 * time.Millisecond) // polling, with the deadline above
	}
}

// TestClusterBreakerPerNode: on a Redis Cluster, errors and the breaker
// gauge name the node that failed, and only that one.
func TestClusterBreakerPerNode(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	cl.AllowPartialCoverage(t)
	rdb := cl.Client(t, func(o *redis.ClusterOptions) {
		o.DialTimeout, o.MaxRedirects, o.MaxRetries, o.DialerRetries = 200*time.Millisecond, 2, -1, 1
	})
	ctx := ctxT(t)
	obs, r := newObserver(t)
	c := newCache(t, rdb, packcache.WithObserver(obs), packcache.WithShareWindow(packcache.Off), packcache.WithCircuitBreaker(2, time.Minute),
		packcache.WithPrefix("n:", packcache.Policy{}))
	victim := cl.Nodes()[1]
	_, victimPort, _ := strings.Cut(victim.Addr(), ":")
	vport, _ := strconv.Atoi(victimPort)
	var lost, kept []string
	for i := 0; len(lost) < 3 || len(kept) < 3; i++ {
		k := fmt.Sprintf("n:{%d}", i)
		if err := c.Set(ctx, k, makeDoc(k, 100)); err != nil {
			t.Fatal(err)
		}
		if cl.NodeForKey(t, k) == victim {
			lost = append(lost, k)
		} else {
			kept = append(kept, k)
		}
	}
	victim.Stop(t)
	for _, k := range lost[:2] {
		if _, err := c.Get(ctx, k); !errors.Is(err, packcache.ErrRedis) {
			t.Fatalf("Get of %s on the stopped master: %v", k, err)
		}
	}
	for _, k := range kept {
		if _, err := c.Get(ctx, k); err != nil {
			t.Fatalf("Get of %s on a live master: %v", k, err)
		}
	}
	m := collect(t, r)
	// The stopped master refuses connections: its first failure opens its
	// breaker at once.
	if n := m.sum("packcache.redis.errors", prefix("n:"), address("127.0.0.1"), port(vport)); n != 1 {
		t.Errorf("%d Redis errors on %s, want 1", n, victim.Addr())
	}
	if n := m.sum("packcache.redis.errors"); n != 1 {
		t.Errorf("%d Redis errors in all, want 1", n)
	}
	open := 0
	for _, p := range m.gauge("packcache.breaker.open") {
		a, _ := p.Attributes.Value("server.address")
		pt, _ := p.Attributes.Value("server.port")
		if p.Value == 1 {
			open++
			if a.AsString() != "127.0.0.1" || pt.AsInt64() != int64(vport) {
				t.Errorf("breaker open on %s:%d, want only on %s", a.AsString(), pt.AsInt64(), victim.Addr())
			}
		}
	}
	if open != 1 {
		t.Errorf("%d breakers open, want 1", open)
	}
	if n := m.sum("packcache.breaker.trips", address("127.0.0.1"), port(vport)); n != 1 {
		t.Errorf("%d trips of %s, want 1", n, victim.Addr())
	}
}

// portOf returns a data point's server.port, as a string.
func portOf(pt metricdata.DataPoint[int64]) string {
	if v, ok := pt.Attributes.Value("server.port"); ok {
		return strconv.FormatInt(v.AsInt64(), 10)
	}
	return ""
}

// TestServeMetrics: Serve's responses are counted by prefix, status and
// coding, with the body bytes sent, as Stats.Served counts them (issue
// 24, item 2).
func TestServeMetrics(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client(t)
	ctx := ctxT(t)
	obs, r := newObserver(t)
	c := newCache(t, rdb, packcache.WithObserver(obs), packcache.WithPrefix("doc:", packcache.Policy{}))
	if err := c.Set(ctx, "doc:1", makeDoc("doc:1", 8<<10)); err != nil {
		t.Fatal(err)
	}
	serve := func(key string, header ...string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/"+key, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		rec := httptest.NewRecorder()
		c.Serve(rec, req, key)
		return rec
	}
	first := serve("doc:1", "Accept-Encoding", "zstd")
	serve("doc:1", "Accept-Encoding", "zstd", "If-None-Match", first.Header().Get("Etag"))
	serve("doc:2")
	m := collect(t, r)
	status := func(n int) attribute.KeyValue { return attribute.Int("http.response.status_code", n) }
	coding := func(c string) attribute.KeyValue { return attribute.String("packcache.serve.coding", c) }
	for _, tc := range []struct {
		attrs []attribute.KeyValue
		n     int64
	}{
		{[]attribute.KeyValue{prefix("doc:"), status(200), coding("zstd")}, 1},
		{[]attribute.KeyValue{prefix("doc:"), status(304), coding("zstd")}, 1},
		{[]attribute.KeyValue{prefix("doc:"), status(404), coding("")}, 1},
	} {
		if n := m.sum("packcache.serve.responses", tc.attrs...); n != tc.n {
			t.Errorf("packcache.serve.responses%v = %d, want %d", tc.attrs, n, tc.n)
		}
	}
	if n := m.sum("packcache.serve.bytes", prefix("doc:"), status(200), coding("zstd")); n != int64(first.Body.Len()) || n == 0 {
		t.Errorf("packcache.serve.bytes = %d, want the body's %d", n, first.Body.Len())
	}
	if n := m.sum("packcache.serve.bytes"); n != int64(first.Body.Len()) {
		t.Errorf("packcache.serve.bytes in all = %d, want %d: only a 200 has a body", n, first.Body.Len())
	}
	var st uint64
	for _, v := range c.Stats().Served {
		st += v.Responses
	}
	if n := m.sum("packcache.serve.responses"); n != 3 || st != 3 {
		t.Errorf("%d responses recorded, Stats says %d; want 3", n, st)
	}
}
