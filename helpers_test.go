package packcache_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode)) // the other process of a cross-process test
	}
	// go-redis logs dial failures through its own global logger; the tests
	// that stop servers make plenty.
	redis.SetLogger(quietLogger{})
	// Most tests start their own redis-server and spend their time waiting
	// on it and on timers, so more of them run at once than there are
	// cores. Tests that measure time do not call t.Parallel and run alone
	// first; those that measure the process's memory or goroutines run
	// beside the others, each in a process of its own (see alone). -parallel on the command line overrides this.
	flag.Parse()
	// A cluster's masters take 2 s to report cluster_state:ok; the
	// tests that start their own clusters take ones started ahead.
	redistest.KeepSpareClusters(2)
	// Tests on the shared servers (redistest.Targets) run three at a
	// time, each on a set of its own, rather than taking turns on one.
	redistest.SharedSets(3)
	// What the first tests to use them would otherwise wait for, started
	// now, in the background: the first set of the shared servers (for
	// TestTwoBatchesDeadlockCluster, the first serial test on them) and
	// the spare clusters (for TestClusterMasterStopped, the first serial
	// test that starts a cluster), unless -run or -skip leaves those out.
	if willRun("TestTwoBatchesDeadlockCluster") {
		redistest.PrestartSharedSet()
	}
	if willRun("TestClusterMasterStopped") {
		redistest.PrestartSpareClusters()
	}
	// TestPendingFollowsFailover's three runs each need a cluster of 3
	// masters with a replica each, which takes seconds to start: all
	// start now, beside the tests that run before it.
	if willRun("TestPendingFollowsFailover") {
		redistest.PrestartClustersWithReplicas(3, 1, 3)
	}
	if !flagSet("test.parallel") {
		flag.Set("test.parallel", "6")
	}
	code := m.Run()
	redistest.Shutdown()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreCurrent()); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// willRun reports whether -test.run and -test.skip let the top-level test
// called name run (as far as their first level goes).
func willRun(name string) bool {
	level := func(flagName string) string {
		f := flag.Lookup(flagName)
		if f == nil {
			return ""
		}
		first, _, _ := strings.Cut(f.Value.String(), "/")
		return first
	}
	if run := level("test.run"); run != "" {
		if ok, err := regexp.MatchString(run, name); err != nil || !ok {
			return false
		}
	}
	if skip := level("test.skip"); skip != "" {
		if ok, err := regexp.MatchString(skip, name); err == nil && ok {
			return false
		}
	}
	return true
}

// Message and Channel model the documents packcache is for: a chat
// channel's recent messages.
type Message struct {
	ID     int64     `json:"id"`
	Author string    `json:"author"`
	Text   string    `json:"text"`
	Sent   time.Time `json:"sent"`
	Likes  []string  `json:"likes,omitempty"`
}

type Channel struct {
	ID       string    `json:"id"`
	Title    string    `json:"title"`
	Messages []Message `json:"messages"`
}

var words = strings.Fields(`the a lecture notes exam tomorrow room please read chapter
	question answer thanks professor deadline homework assignment group project slides
	posted link meeting today week grade midterm final review session office hours
	is are was will can could should would did does have has about with for from`)

// makeChannel builds a channel of about size bytes of JSON, the same for a
// given seed.
func makeChannel(seed uint64, size int) Channel {
	r := rand.New(rand.NewPCG(seed, 42))
	ch := Channel{ID: fmt.Sprintf("ch-%d", seed), Title: "Course announcements"}
	base := time.Date(2026, 9, 1, 8, 0, 0, 0, time.UTC)
	n := 0
	for i := 0; n < size; i++ {
		var sb strings.Builder
		for w := 0; w < 5+r.IntN(30); w++ {
			if w > 0 {
				sb.WriteByte(' ')
			}
			sb.WriteString(words[r.IntN(len(words))])
		}
		m := Message{
			ID:     int64(1_000_000 + i),
			Author: fmt.Sprintf("student%04d", r.IntN(5000)),
			Text:   sb.String(),
			Sent:   base.Add(time.Duration(i) * 37 * time.Second),
		}
		if r.IntN(4) == 0 {
			m.Likes = []string{fmt.Sprintf("student%04d", r.IntN(5000))}
		}
		ch.Messages = append(ch.Messages, m)
		n += 110 + len(m.Text)
	}
	return ch
}

// long reports whether PACKCACHE_LONG=1 asks for the tests at full size.
// The test command runs the load and allocation tests at a size that
// keeps it within its two minutes and still fails when what they check
// breaks; with PACKCACHE_LONG=1 they run at the sizes the issues name
// (20,000 calls, 16 MiB, 10,000 Gets), as CI's steps for them do, and
// the tests that are only long run at all.
func long() bool { return os.Getenv("PACKCACHE_LONG") == "1" }

// sized returns full under PACKCACHE_LONG=1 and quick otherwise.
func sized(quick, full int) int {
	if long() {
		return full
	}
	return quick
}

// jsonText returns n bytes of compressible JSON: a string literal.
func jsonText(n int) []byte {
	if n < 2 {
		return []byte(strings.Repeat("1", n))
	}
	b := make([]byte, 0, n)
	b = append(b, '"')
	for len(b) < n-1 {
		b = append(b, words[len(b)%len(words)]...)
		b = append(b, ' ')
	}
	b = b[:n-1]
	return append(b, '"')
}

// forEachTarget runs f against a single node and a 3-master cluster.
func forEachTarget(t *testing.T, f func(t *testing.T, tg redistest.Target)) {
	t.Helper()
	for _, tg := range redistest.Targets(t) {
		t.Run(tg.Name, func(t *testing.T) { f(t, tg) })
	}
}

func single(t *testing.T) (*redistest.Server, redis.UniversalClient) {
	t.Helper()
	s := redistest.Start(t)
	return s, s.Universal(t)
}

// mustNew is packcache.New with a minute's Redis budget unless opts give
// one: on a loaded machine (CI under -race, beside the parallel tests) the
// default second is not enough for every reply, and a test that is not
// about the budget must not fail because a reply took longer. The tests
// about the budget, or about a stopped or paused server, give their own.
func mustNew[T any](t testing.TB, rdb redis.UniversalClient, opts ...packcache.Option) *packcache.Cache[T] {
	t.Helper()
	c, err := packcache.New[T](rdb, append([]packcache.Option{packcache.WithRedisTimeout(time.Minute)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func rawGet(t testing.TB, rdb redis.UniversalClient, key string) []byte {
	t.Helper()
	b, err := rdb.Get(context.Background(), key).Bytes()
	if err != nil {
		t.Fatalf("raw GET %q: %v", key, err)
	}
	return b
}

func flagSet(name string) (set bool) {
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func gzipBytes(t testing.TB, b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// waitFor polls cond until it holds, failing the test with what if it
// does not within d: the way tests wait for something they cannot be told
// of, such as an invalidation arriving from Redis.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !eventually(d, cond) {
		t.Fatalf("%s: not within %v", what, d)
	}
}

// eventually polls cond until it holds or d has passed, and reports
// whether it held; for goroutines that must not fail the test themselves.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			// Once more, begun after the deadline: on a loaded machine
			// the last try may have begun long before it, and a bound
			// such as MaxLag promises only calls that begin after it.
			return cond()
		}
		<-tick.C
	}
	return true
}

// brokenSerializer is JSON whose Marshal fails (err) or panics (panics),
// standing in for a value the serializer cannot encode. (Tests use it with
// the T types the suite already has: every distinct T instantiates the
// whole Cache again, which the compiler pays for.)
type brokenSerializer struct {
	err    error
	panics bool
}

func (b brokenSerializer) Marshal(dst []byte, v any) ([]byte, error) {
	if b.panics {
		panic("MarshalJSON exploded")
	}
	return dst, b.err
}

func (brokenSerializer) Unmarshal(data []byte, v any) error { return packcache.JSON.Unmarshal(data, v) }

func (brokenSerializer) Text() bool { return true }
