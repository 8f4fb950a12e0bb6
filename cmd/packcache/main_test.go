package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/internal/redistest"
)

func TestMain(m *testing.M) {
	// The tests on the shared servers (Targets) run two at a time, each
	// on a set of its own, unless they set a package variable
	// (testHookAfterRead, the candidates, the clock, advise's timing) or
	// the environment: those run alone, before the parallel ones. An
	// advise run times each codec on its thread's CPU clock, not the
	// wall, so tests running beside it do not change its timings. Every
	// parallel test starts at once, not GOMAXPROCS at a time: a test
	// waiting for a set would hold a place, and the tests on servers of
	// their own (TestSentinel, TestTLS and the others) and
	// TestBadConnection's command lines spend most of their time waiting,
	// on servers starting and on go-redis's dial retries, not on the CPU.
	// -parallel on the command line overrides this.
	flag.Parse()
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet {
		flag.Set("test.parallel", "64")
	}
	redistest.SharedSets(2)
	redistest.PrestartSharedSet()
	testTiming.set() // advise times less in the tests (testTiming)
	code := m.Run()
	redistest.Shutdown()
	os.Exit(code)
}

// adviseTiming is how long advise times and warms up each codec
// (minOpTime and the rest).
type adviseTiming struct {
	op, sample, median   time.Duration
	warmCalls, warmBytes int
}

// commandTiming is advise's timing as the command runs it. testTiming is
// the tests' (TestMain): they check what advise reports and claims, not
// how precise its timings are, and at the command's timing each run of
// advise costs seconds of CPU. Every value is still warmed up (a single
// pass) and timed the same way, only for less time.
// TestAdviseColumnsAgree, the test of the timings, runs at the command's.
var (
	commandTiming = adviseTiming{minOpTime, minSampleTime, minMedianTime, warmCalls, warmBytes}
	testTiming    = adviseTiming{op: 10 * time.Microsecond, sample: 500 * time.Microsecond, median: 500 * time.Microsecond}
)

// set makes advise time as a says. Only TestMain and tests that
// run alone (without t.Parallel) may call it.
func (a adviseTiming) set() {
	minOpTime, minSampleTime, minMedianTime, warmCalls, warmBytes = a.op, a.sample, a.median, a.warmCalls, a.warmBytes
}

// result is one in-process run of the command.
type runResult struct {
	stdout, stderr string
	code           int
}

// cli runs the command in-process with args, as main would.
func cli(t *testing.T, args ...string) runResult {
	t.Helper()
	return cliContext(t, context.Background(), args...)
}

func cliContext(t *testing.T, ctx context.Context, args ...string) runResult {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(ctx, args, &out, &errOut)
	t.Logf("packcache %s: exit %d\n--- stdout\n%s--- stderr\n%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return runResult{out.String(), errOut.String(), code}
}

// targets runs f against the shared single server and 3-master cluster,
// flushed and with their command statistics reset.
func targets(t *testing.T, f func(t *testing.T, tg redistest.Target)) {
	t.Helper()
	for _, tg := range redistest.Targets(t) {
		t.Run(tg.Name, func(t *testing.T) {
			if tg.Server != nil {
				redistest.RequireReal(t, tg.Server, "MEMORY USAGE, SET KEEPTTL and Lua scripts")
			}
			f(t, tg)
		})
	}
}

// singleTarget runs f as targets does, against the shared single server
// only: for the advise tests whose subject is not the topology. Each run
// of advise measures every codec; TestAdviseChat and TestAdviseTinyValues
// run it on the cluster too.
func singleTarget(t *testing.T, f func(t *testing.T, tg redistest.Target)) {
	t.Helper()
	targets(t, func(t *testing.T, tg redistest.Target) {
		if tg.Server != nil {
			f(t, tg)
		}
	})
}

// conn returns the global flags that connect to tg.
func connArgs(tg redistest.Target) []string {
	if tg.Cluster != nil {
		args := []string{"--cluster"}
		for _, a := range tg.Cluster.Addrs() {
			args = append(args, "--addr", a)
		}
		return args
	}
	return []string{"--addr", tg.Server.Addr()}
}

// with returns tg's connection flags followed by args.
func with(tg redistest.Target, args ...string) []string {
	return append(connArgs(tg), args...)
}

// nodes returns a client for each master of tg.
func nodes(t *testing.T, tg redistest.Target) []*redis.Client {
	t.Helper()
	if tg.Cluster == nil {
		return []*redis.Client{tg.Server.Client(t)}
	}
	var cs []*redis.Client
	for _, n := range tg.Cluster.Nodes() {
		cs = append(cs, n.Client(t))
	}
	return cs
}

// entry is a key's state in a snapshot.
type entry struct {
	typ   string
	value string // for strings
	ttl   time.Duration
}

// snapshot reads every key of tg: its type, its value if a string, and
// its TTL.
func snapshot(t *testing.T, tg redistest.Target) map[string]entry {
	t.Helper()
	ctx := context.Background()
	snap := map[string]entry{}
	for _, n := range nodes(t, tg) {
		var cur uint64
		for {
			keys, next, err := n.Scan(ctx, cur, "*", 1000).Result()
			if err != nil {
				t.Fatalf("SCAN: %v", err)
			}
			for _, k := range keys {
				e := entry{typ: n.Type(ctx, k).Val(), ttl: n.PTTL(ctx, k).Val()}
				if e.typ == "string" {
					e.value = n.Get(ctx, k).Val()
				}
				snap[k] = e
			}
			if cur = next; cur == 0 {
				break
			}
		}
	}
	return snap
}

// sameData fails the test unless two snapshots hold the same keys, types
// and values, and TTLs that only went down (by at most slack) or stayed
// absent.
func sameData(t *testing.T, before, after map[string]entry, slack time.Duration) {
	t.Helper()
	if !slices.Equal(slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after))) {
		t.Fatalf("keys changed: before %d keys, after %d", len(before), len(after))
	}
	for k, b := range before {
		a := after[k]
		if a.typ != b.typ || a.value != b.value {
			t.Errorf("%s changed: type %s -> %s, value %q -> %q", k, b.typ, a.typ, clip(b.value), clip(a.value))
		}
		if !ttlKept(b.ttl, a.ttl, slack) {
			t.Errorf("%s: TTL %v -> %v", k, b.ttl, a.ttl)
		}
	}
}

// ttlKept reports whether after is before, counted down by at most slack.
func ttlKept(before, after, slack time.Duration) bool {
	if before < 0 || after < 0 {
		return before == after
	}
	return after <= before && after >= before-slack
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// readOnly lists the commands stats, inspect and advise may send, as INFO
// commandstats names them: the reads the issue allows, and what go-redis
// sends to connect and to learn a cluster's layout.
var readOnly = map[string]bool{
	"scan": true, "get": true, "getrange": true, "strlen": true, "pttl": true, "type": true,
	"memory|usage": true, "ping": true, "info": true, "hello": true,
	"client|setinfo": true, "client|setname": true,
	"cluster|slots": true, "cluster|shards": true, "cluster|nodes": true, "cluster|info": true,
	"command": true, "command|docs": true, "command|info": true, "readonly": true,
	"config|resetstat": true, // the test's own reset, counted after it
}

// commandsRun returns the commands tg's masters ran since the last reset,
// with their counts, from INFO commandstats.
func commandsRun(t *testing.T, tg redistest.Target) map[string]int64 {
	t.Helper()
	ran := map[string]int64{}
	for _, n := range nodes(t, tg) {
		info, err := n.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatalf("INFO commandstats: %v", err)
		}
		for _, line := range strings.Split(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
			if !ok {
				continue
			}
			calls, _, _ := strings.Cut(rest, ",")
			c, _ := strconv.ParseInt(calls, 10, 64)
			ran[strings.TrimPrefix(name, "cmdstat_")] += c
		}
	}
	return ran
}

// checkReadOnly fails the test if tg ran anything but read commands since
// its statistics were last reset.
func checkReadOnly(t *testing.T, tg redistest.Target) {
	t.Helper()
	ran := commandsRun(t, tg)
	if len(ran) == 0 {
		t.Fatal("INFO commandstats shows no commands at all: the check would pass vacuously")
	}
	for cmd, n := range ran {
		if !readOnly[cmd] {
			t.Errorf("ran %s %d times; only read commands are allowed", cmd, n)
		}
	}
}

// set stores values under tg, with a TTL when ttl > 0.
func set(t *testing.T, tg redistest.Target, ttl time.Duration, kv map[string][]byte) {
	t.Helper()
	ctx := context.Background()
	for k, v := range kv {
		if err := tg.Client.Set(ctx, k, v, ttl).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
}

func get(t *testing.T, tg redistest.Target, key string) []byte {
	t.Helper()
	v, err := tg.Client.Get(context.Background(), key).Bytes()
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	return v
}

func mustContain(t *testing.T, s string, subs ...string) {
	t.Helper()
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			t.Errorf("output lacks %q", sub)
		}
	}
}

func jsonDoc(i, n int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `{"id":%d,"items":[`, i)
	for j := 0; b.Len() < n; j++ {
		if j > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"n":%d,"text":"message %d of document %d, hello hello"}`, j, j, i)
	}
	b.WriteString("]}")
	return []byte(b.String())
}
