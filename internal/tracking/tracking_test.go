package tracking

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/packcache/packcache/internal/redistest"
)

func TestMain(m *testing.M) {
	// go-redis logs dial failures through its global logger; the tests
	// that kill connections make some.
	redis.SetLogger(quietLogger{})
	// Every goroutine a Tracker starts ends with Close.
	goleak.VerifyTestMain(m)
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// A recorder is a Handler that keeps what it was told, in order.
type recorder struct {
	mu     sync.Mutex
	events []string // "key:<k>", "flush", "report"
	errs   []error
	// gate, if set, is looked at on each Report: whether it was open then.
	gate         *Gate
	openAtReport []bool
}

func (r *recorder) Invalidate(keys []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range keys {
		r.events = append(r.events, "key:"+k)
	}
}

func (r *recorder) Flush() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, "flush")
}

func (r *recorder) Report(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, "report")
	r.errs = append(r.errs, err)
	if r.gate != nil {
		r.openAtReport = append(r.openAtReport, r.gate.Open())
	}
}

func (r *recorder) snapshot() ([]string, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events), slices.Clone(r.errs)
}

func (r *recorder) count(event string) int {
	ev, _ := r.snapshot()
	n := 0
	for _, e := range ev {
		if e == event {
			n++
		}
	}
	return n
}

// keys returns the keys invalidated, in order.
func (r *recorder) keys() []string {
	ev, _ := r.snapshot()
	var ks []string
	for _, e := range ev {
		if k, ok := strings.CutPrefix(e, "key:"); ok {
			ks = append(ks, k)
		}
	}
	return ks
}

// waitFor polls cond until it holds; it fails the test after a minute,
// which bounds a hang, not a latency.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
		<-tick.C
	}
}

// start starts a Tracker on rdb with prefixes, a heartbeat every 25 ms,
// closed when the test ends.
func start(t *testing.T, rdb redis.UniversalClient, prefixes []string, h Handler) *Tracker {
	t.Helper()
	tr, err := New(rdb, prefixes, 25*time.Millisecond, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	return tr
}

func server(t *testing.T, args ...string) *redistest.Server {
	t.Helper()
	s := redistest.Start(t, args...)
	redistest.RequireReal(t, s, "CLIENT TRACKING")
	return s
}

func TestCoverPrefixes(t *testing.T) {
	for _, c := range []struct {
		in, want []string
	}{
		{nil, nil},
		{[]string{"a:"}, []string{"a:"}},
		{[]string{"b:", "a:"}, []string{"a:", "b:"}},
		{[]string{"a:", "a:b:", "a:"}, []string{"a:"}}, // covered and repeated
		{[]string{"ab", "a"}, []string{"a"}},
		{[]string{"a:", "", "b:"}, nil}, // the empty prefix covers every key
	} {
		in := slices.Clone(c.in)
		if got := coverPrefixes(c.in); !slices.Equal(got, c.want) {
			t.Errorf("coverPrefixes(%q) = %q, want %q", c.in, got, c.want)
		}
		if !slices.Equal(c.in, in) {
			t.Errorf("coverPrefixes changed its argument: %q, was %q", c.in, in)
		}
	}
}

// TestNewRefusesOtherClients: a Ring (or any other kind of client) has no
// one master per key to follow: New says so, and starts nothing.
func TestNewRefusesOtherClients(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	before := runtime.NumGoroutine()
	tr, err := New(ring, nil, time.Second, &recorder{})
	if err == nil || !strings.Contains(err.Error(), "*redis.Ring is not supported") {
		t.Fatalf("New with a Ring: %v, %v", tr, err)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Fatalf("New that failed left %d goroutines, %d before", n, before)
	}
}

// TestGateOpen: a gate serves until its deadline, judged by the clock at
// each call, and never while closed (0).
func TestGateOpen(t *testing.T) {
	g := &Gate{maxLag: time.Second, epoch: time.Now().Add(-time.Hour)}
	if g.Open() {
		t.Fatal("a gate never set is open")
	}
	g.until.Store(int64(time.Hour + time.Minute))
	if !g.Open() {
		t.Fatal("a gate whose deadline is a minute ahead is closed")
	}
	g.until.Store(int64(time.Hour - time.Minute))
	if g.Open() {
		t.Fatal("a gate whose deadline passed a minute ago is open")
	}
}

// TestInvalidations: once the gate opens, every write by another client
// under the tracked prefixes reaches Invalidate, in order, and no other
// key does; the near cache was flushed before the gate opened; FLUSHALL
// and FLUSHDB reach Flush.
func TestInvalidations(t *testing.T) {
	t.Parallel()
	s := server(t)
	rdb := s.Client(t)
	ctx := t.Context()
	r := &recorder{}
	tr := start(t, rdb, []string{"b:", "a:", "a:x:"}, r)
	g := tr.Gate(time.Minute)
	if tr.Gate(time.Minute) != g {
		t.Fatal("two gates for one MaxLag")
	}
	waitFor(t, "the gate opening", g.Open)
	if r.count("flush") == 0 {
		t.Fatal("the gate opened before the near cache was flushed of what the stream had not seen")
	}
	if !g.Admits("a:1") {
		t.Fatal("an open gate on a single node does not admit a key")
	}
	other := s.Client(t)
	for _, k := range []string{"a:1", "c:1", "b:2", "a:x:3", "ca:4"} {
		if err := other.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	other.Del(ctx, "a:1")
	other.Set(ctx, "b:last", "v", 0)
	// Invalidations arrive in order: once b:last's has, so would have
	// c:1's and ca:4's, were they tracked.
	waitFor(t, "the invalidation of b:last", func() bool { return slices.Contains(r.keys(), "b:last") })
	if got, want := r.keys(), []string{"a:1", "b:2", "a:x:3", "a:1", "b:last"}; !slices.Equal(got, want) {
		t.Fatalf("invalidated %q, want %q", got, want)
	}

	for _, flush := range []func() error{
		func() error { return other.FlushAll(ctx).Err() },
		func() error { return other.FlushDB(ctx).Err() },
	} {
		n := r.count("flush")
		if err := flush(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "a Flush after FLUSHALL or FLUSHDB", func() bool { return r.count("flush") > n })
	}
	if _, errs := r.snapshot(); len(errs) != 0 {
		t.Fatalf("reported %v", errs)
	}
}

// TestEveryKey: with an empty prefix every key is tracked.
func TestEveryKey(t *testing.T) {
	t.Parallel()
	s := server(t)
	r := &recorder{}
	tr := start(t, s.Client(t), []string{"a:", ""}, r)
	waitFor(t, "the gate opening", tr.Gate(time.Minute).Open)
	s.Client(t).Set(t.Context(), "anything", "v", 0)
	waitFor(t, "the invalidation of a key under no prefix", func() bool { return slices.Contains(r.keys(), "anything") })
}

// TestKilledConnection: a connection that drops closes the gates before
// anything is reported, flushes the near cache and reports the loss;
// then it reconnects, flushes again, and the gates open again, with
// invalidations flowing.
func TestKilledConnection(t *testing.T) {
	t.Parallel()
	s := server(t)
	ctx := t.Context()
	r := &recorder{}
	tr := start(t, s.Client(t), []string{"k:"}, r)
	g := tr.Gate(time.Minute)
	r.mu.Lock()
	r.gate = g
	r.mu.Unlock()
	waitFor(t, "the gate opening", g.Open)
	other := s.Client(t)
	flushes := r.count("flush")
	if err := other.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the lost connection reported", func() bool { return r.count("report") > 0 })
	ev, errs := r.snapshot()
	if !strings.Contains(errs[0].Error(), "lost, near cache emptied") {
		t.Fatalf("reported %v", errs[0])
	}
	if i := slices.Index(ev, "report"); i < 1 || ev[i-1] != "flush" || r.count("flush") <= flushes {
		t.Fatalf("events %q: want a Flush right before the report", ev)
	}
	r.mu.Lock()
	open := r.openAtReport[0]
	r.mu.Unlock()
	if open {
		t.Fatal("the gate was open when the loss was reported")
	}
	waitFor(t, "the gate opening again", g.Open)
	other.Set(ctx, "k:after", "v", 0)
	waitFor(t, "an invalidation after the reconnection", func() bool { return slices.Contains(r.keys(), "k:after") })
	ev, _ = r.snapshot()
	if i := slices.Index(ev, "report"); !slices.Contains(ev[i+1:], "flush") {
		t.Fatalf("events %q: no Flush when it subscribed again", ev)
	}
}

// TestWithoutTracking: where Redis refuses CLIENT TRACKING (here an ACL),
// the gates never open, and the failure is reported once however often
// the connection is tried again.
func TestWithoutTracking(t *testing.T) {
	t.Parallel()
	s := server(t, "--user", "notrack", "on", ">pw", "~*", "&*", "+@all", "-client|tracking")
	rdb := s.Client(t, func(o *redis.Options) { o.Username, o.Password = "notrack", "pw" })
	admin := s.Client(t)
	ctx := t.Context()
	connections := func() int64 {
		info, err := admin.Info(ctx, "stats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(info, "\n") {
			if v, ok := strings.CutPrefix(line, "total_connections_received:"); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				return n
			}
		}
		t.Fatal("no total_connections_received in INFO stats")
		return 0
	}
	r := &recorder{}
	tr := start(t, rdb, []string{"k:"}, r)
	g := tr.Gate(time.Minute)
	waitFor(t, "the failure reported", func() bool { return r.count("report") > 0 })
	// Three more tries after the report.
	tried := connections()
	waitFor(t, "three more connections tried", func() bool { return connections() >= tried+3 })
	_, errs := r.snapshot()
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "does not serve") || !strings.Contains(errs[0].Error(), "CLIENT TRACKING") {
		t.Fatalf("reported %d times: %v", len(errs), errs)
	}
	if g.Open() {
		t.Fatal("the gate is open without tracking")
	}
}

// TestGatesCloseByTheClock: with every update of the gates held (a
// machine too loaded to run the tracker), the gates still close once
// their lag has passed since the last proof: Open reads the clock.
func TestGatesCloseByTheClock(t *testing.T) {
	t.Parallel()
	s := server(t)
	tr := start(t, s.Client(t), []string{"k:"}, &recorder{})
	g := tr.Gate(100 * time.Millisecond)
	waitFor(t, "the gate opening", g.Open)
	release := tr.HoldGates()
	waitFor(t, "the gate closing with its updates held", func() bool { return !g.Open() })
	release()
	waitFor(t, "the gate opening once released", g.Open)
}

// TestClose: Close returns without waiting for a heartbeat interval (an
// hour here: were it to wait, the test would hang), closes every gate,
// ends every goroutine the tracker started and its connections; on a
// single node and on a Cluster, whose masters are followed by a goroutine
// of their own.
//
// It counts the process's goroutines: beside the other tests, but in a
// process of its own (alone).
func TestClose(t *testing.T) {
	t.Parallel()
	if !redistest.Alone(t) {
		return
	}
	t.Run("single", func(t *testing.T) {
		s := server(t)
		rdb := s.Client(t)
		rdb.Ping(t.Context()) // the client's own pool, before counting
		testClose(t, rdb, []*redis.Client{s.Client(t)})
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3)
		rdb := cl.Client(t)
		// The client's node clients, and their goroutines, are the
		// application's: make them before counting.
		rdb.ForEachMaster(t.Context(), func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() })
		var admins []*redis.Client
		for _, n := range cl.Nodes() {
			admins = append(admins, n.Client(t))
		}
		testClose(t, rdb, admins)
	})
}

func testClose(t *testing.T, rdb redis.UniversalClient, admins []*redis.Client) {
	baseline := runtime.NumGoroutine()
	tr, err := New(rdb, []string{"k:"}, time.Hour, &recorder{})
	if err != nil {
		t.Fatal(err)
	}
	g := tr.Gate(4 * time.Hour)
	waitFor(t, "the gate opening", g.Open)
	tr.Close()
	if g.Open() {
		t.Fatal("a gate open after Close")
	}
	waitFor(t, "the tracker's goroutines ending", func() bool { return runtime.NumGoroutine() <= baseline })
	for _, admin := range admins {
		waitFor(t, "the invalidation connection closed", func() bool {
			list, err := admin.ClientList(t.Context()).Result()
			if err != nil {
				t.Fatal(err)
			}
			return !strings.Contains(list, "packcache-invalidation")
		})
	}
}

// TestCluster: on a Cluster the tracker follows every master: writes on
// each reach Invalidate, and a key's value is admitted once its master's
// connection has proved itself.
func TestCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	rdb := cl.Client(t)
	ctx := t.Context()
	r := &recorder{}
	tr := start(t, rdb, []string{"k:"}, r)
	g := tr.Gate(time.Minute)
	waitFor(t, "the gate opening", g.Open)
	if n := len(*tr.current.Load()); n != 3 {
		t.Fatalf("%d connections for 3 masters", n)
	}
	// Keys on every master.
	byMaster := map[string]string{}
	for i := 0; len(byMaster) < 3; i++ {
		k := fmt.Sprintf("k:%d", i)
		m, err := rdb.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := byMaster[m.Options().Addr]; !ok {
			byMaster[m.Options().Addr] = k
		}
	}
	other := cl.Client(t)
	for _, k := range byMaster {
		if !g.Admits(k) {
			t.Fatalf("%s not admitted with every master's connection proven", k)
		}
		if err := other.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the invalidation of "+k, func() bool { return slices.Contains(r.keys(), k) })
	}
	if _, errs := r.snapshot(); len(errs) != 0 {
		t.Fatalf("reported %v", errs)
	}
}

// TestClusterUnreachable: a Cluster whose masters cannot be listed is
// reported, and its gates do not open.
func TestClusterUnreachable(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
	defer rdb.Close()
	r := &recorder{}
	tr := start(t, rdb, []string{"k:"}, r)
	_, errs := r.snapshot()
	if len(errs) == 0 || !strings.Contains(errs[0].Error(), "finding the cluster's masters") {
		t.Fatalf("New on an unreachable cluster reported %v", errs)
	}
	if tr.Gate(time.Minute).Open() {
		t.Fatal("a gate open with no master followed")
	}
}
