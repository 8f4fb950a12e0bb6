// Command packbench measures packcache against hand-written go-redis code,
// github.com/go-redis/cache and github.com/redis/rueidis (its client-side
// caching, DoCache, and rueidisaside; see rueidis.go): stored sizes per
// codec (the brotli user codec beside the built-in ones), compression
// break-even, Set/Get cost, small values with and without a zstd
// dictionary, serializers (msgpack against go-json), bulk load, Redis memory,
// request surges, the near cache (Get throughput of a hot key, how soon another process's
// write is seen, a surge), and a list of performance targets. Every suite
// prints a markdown table.
//
// By default it starts its own redis-server on a free 127.0.0.1 port (no
// persistence) and stops it on exit. With REDIS_ADDR it uses that server
// instead, writes only keys under a unique prefix and deletes only those
// (but for rueidisaside's client marker, a key rueidisid:<random> with a
// TTL of an hour, which its Close deletes); it never runs FLUSHALL on a server it
// did not start.
//
// With -net (Linux, root, iproute2) it starts redis-server inside a network
// namespace of its own instead, reached over a veth pair shaped with tbf at
// -net-rate in both directions, optionally with -net-delay added per
// direction by an in-process proxy; see net.go. It removes the namespace,
// the veth pair and the server on exit, including on SIGINT/SIGTERM.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/internal/chart"
)

type config struct {
	suites   map[string]bool
	quick    bool
	reps     int
	ops      int // ops per rep in cost/peers
	bulkN    int
	backlogN int
	surgeN   int
	corpus   string
	chart    string
	net      bool
	netRate  string
	netDelay time.Duration
}

var allSuites = []string{"sizes", "threshold", "cost", "small", "formats", "bulk", "backlog", "surge", "near", "peers", "serve"}

// onlySuites run when named, not with all: each is part of a suite of
// all, alone ("miss": the cost suite's misses).
var onlySuites = []string{"miss"}

// env is what every suite runs against.
type env struct {
	cfg     config
	rdb     *redis.Client
	addr    string
	own     bool   // we started the server: FLUSHALL and exact stats are fine
	prefix  string // every key written starts with it
	out     io.Writer
	machine string
	command string
	errs    []error
	docs    []doc     // corpus documents, if -corpus
	net     *netSetup // -net: the shaped namespace Redis runs in

	// collected for the chart
	sizeRatios map[string][]chart.Point // codec -> (doc size, stored/plain)
	getLat     map[string][]chart.Point // codec -> (doc size, Get ns)

	// collected for the targets table
	peer peerResults
}

func (e *env) fail(suite string, err error) {
	waitIfInterrupted()
	e.errs = append(e.errs, fmt.Errorf("%s: %w", suite, err))
	fmt.Fprintf(e.out, "\n**ERROR in %s:** %v\n", suite, err)
}

func (e *env) key(parts ...string) string { return e.prefix + strings.Join(parts, ":") }

// reset removes every key the benchmark wrote: FLUSHALL on our own server,
// a SCAN+UNLINK of our prefix on a shared one.
func (e *env) reset(ctx context.Context) error {
	if e.own {
		return e.rdb.FlushAll(ctx).Err()
	}
	var cursor uint64
	for {
		keys, next, err := e.rdb.Scan(ctx, cursor, e.prefix+"*", 1000).Result()
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			if err := e.rdb.Unlink(ctx, keys...).Err(); err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

func (e *env) info(ctx context.Context, section string) (map[string]string, error) {
	s, err := e.rdb.Info(ctx, section).Result()
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if k, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, "#") {
			m[k] = v
		}
	}
	return m, nil
}

// usedMemory returns INFO memory used_memory.
func (e *env) usedMemory(ctx context.Context) (int64, error) {
	m, err := e.info(ctx, "memory")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(m["used_memory"], 10, 64)
}

// cmdCalls returns calls per command name (lower case) from INFO commandstats.
func (e *env) cmdCalls(ctx context.Context) (map[string]int64, error) {
	m, err := e.info(ctx, "commandstats")
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for k, v := range m {
		name, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok {
			continue
		}
		for _, f := range strings.Split(v, ",") {
			if n, ok := strings.CutPrefix(f, "calls="); ok {
				c, _ := strconv.ParseInt(n, 10, 64)
				out[name] = c
			}
		}
	}
	return out, nil
}

// stored returns STRLEN and MEMORY USAGE of key.
func (e *env) stored(ctx context.Context, key string) (strlen, usage int64, err error) {
	if strlen, err = e.rdb.StrLen(ctx, key).Result(); err != nil {
		return
	}
	usage, err = e.rdb.MemoryUsage(ctx, key, 0).Result()
	return
}

func (e *env) header(suite, what string) {
	fmt.Fprintf(e.out, "\n## %s\n\n%s  \nmachine: %s  \ncommand: `%s`\n", suite, what, e.machine, e.command)
	if !e.own {
		fmt.Fprintf(e.out, "server: shared (REDIS_ADDR=%s, key prefix %q): memory deltas and command counts include other clients' activity\n", e.addr, e.prefix)
	}
	fmt.Fprintln(e.out)
}

func main() {
	var cfg config
	suite := flag.String("suite", "all", "comma-separated suites: all or "+strings.Join(append(allSuites, onlySuites...), ","))
	flag.BoolVar(&cfg.quick, "quick", false, "tiny sizes and counts (CI smoke, < 30 s)")
	flag.IntVar(&cfg.reps, "reps", 5, "repetitions per measurement (median, min, max)")
	flag.IntVar(&cfg.ops, "n", 0, "operations per repetition in cost and peers (0: by size)")
	flag.IntVar(&cfg.bulkN, "bulk-n", 10000, "values in the bulk suite")
	flag.IntVar(&cfg.backlogN, "backlog-n", 10000, "values in the backlog suite")
	flag.IntVar(&cfg.surgeN, "surge-n", 20000, "goroutines in a surge")
	flag.StringVar(&cfg.corpus, "corpus", "", "directory of *.json documents to use instead of generated ones (sizes, threshold, cost)")
	flag.StringVar(&cfg.chart, "chart", "", "write an SVG chart to this file")
	flag.BoolVar(&cfg.net, "net", false, "run Redis in a network namespace of its own behind a veth pair shaped with tbf (Linux, root, iproute2)")
	flag.StringVar(&cfg.netRate, "net-rate", "1gbit", "with -net: tbf rate in each direction (tc syntax: 1gbit, 100mbit, ...)")
	flag.DurationVar(&cfg.netDelay, "net-delay", 0, "with -net: one-way delay added to each direction by an in-process proxy (RTT grows by twice this)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()

	cfg.suites = map[string]bool{}
	for _, s := range strings.Split(*suite, ",") {
		s = strings.TrimSpace(s)
		if s == "all" {
			for _, a := range allSuites {
				cfg.suites[a] = true
			}
			continue
		}
		known := false
		for _, a := range append(allSuites, onlySuites...) {
			known = known || a == s
		}
		if !known {
			fmt.Fprintf(os.Stderr, "packbench: unknown suite %q\n", s)
			os.Exit(2)
		}
		cfg.suites[s] = true
	}
	if cfg.quick {
		cfg.reps = min(cfg.reps, 3)
		cfg.bulkN = min(cfg.bulkN, 200)
		cfg.backlogN = min(cfg.backlogN, 200)
		cfg.surgeN = min(cfg.surgeN, 500)
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "packbench:", err)
			os.Exit(2)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "packbench:", err)
			os.Exit(2)
		}
		code := run(cfg)
		pprof.StopCPUProfile()
		f.Close()
		os.Exit(code)
	}
	os.Exit(run(cfg))
}

func run(cfg config) int {
	ctx := context.Background()
	e := &env{cfg: cfg, out: os.Stdout, sizeRatios: map[string][]chart.Point{}, getLat: map[string][]chart.Point{}}
	e.command = "cd bench && go run ./cmd/packbench " + strings.Join(quoteArgs(os.Args[1:]), " ")

	// Undo steps (our redis-server, -net's namespace and veth) go on atExit
	// as they are made, so a signal at any point removes what exists.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sig
		interrupted.Store(true)
		fmt.Fprintf(os.Stderr, "packbench: %v: cleaning up\n", s)
		// Let a setup step in flight finish and register its undo step.
		setupMu.Lock()
		atExit.run()
		os.Exit(130)
	}()
	defer atExit.run()

	setupMu.Lock()
	if cfg.net {
		if os.Getenv("REDIS_ADDR") != "" {
			setupMu.Unlock()
			fmt.Fprintln(os.Stderr, "packbench: -net starts its own redis-server in a namespace; unset REDIS_ADDR")
			return 2
		}
		ns, err := setupNet(cfg.netRate, cfg.netDelay)
		if err != nil {
			setupMu.Unlock()
			atExit.run()
			fmt.Fprintln(os.Stderr, "packbench: -net: cannot set up:", err)
			fmt.Fprintln(os.Stderr, "packbench: -net: nothing was measured; run without -net for loopback numbers")
			return 1
		}
		e.net = ns
	}

	stop, err := e.connect(ctx)
	if err == nil {
		atExit.push(stop)
	}
	setupMu.Unlock()
	if err != nil {
		fmt.Fprintln(os.Stderr, "packbench:", err)
		return 1
	}

	if cfg.corpus != "" {
		if e.docs, err = loadCorpus(cfg.corpus); err != nil {
			fmt.Fprintln(os.Stderr, "packbench:", err)
			return 1
		}
	}

	fmt.Fprintf(e.out, "# packbench\n\nmachine: %s  \ncommand: `%s`\n", e.machine, e.command)
	if e.net != nil {
		fmt.Fprintf(e.out, "\n> -net: all numbers are %s, not loopback.\n", e.net.describe())
	} else {
		fmt.Fprintln(e.out, "\n> network: loopback (127.0.0.1), unshaped.")
	}
	if cfg.quick {
		fmt.Fprintln(e.out, "\n> -quick: tiny sizes and counts; numbers are a smoke test, not measurements.")
	}

	type suiteFn struct {
		name string
		fn   func(context.Context) error
	}
	for _, s := range []suiteFn{
		{"sizes", e.suiteSizes},
		{"threshold", e.suiteThreshold},
		{"cost", e.suiteCost},
		{"miss", e.suiteMiss},
		{"small", e.suiteSmall},
		{"formats", e.suiteFormats},
		{"bulk", e.suiteBulk},
		{"backlog", e.suiteBacklog},
		{"surge", e.suiteSurge},
		{"near", e.suiteNear},
		{"peers", e.suitePeers},
		{"serve", e.suiteServe},
	} {
		if !cfg.suites[s.name] {
			continue
		}
		start := time.Now()
		if err := e.reset(ctx); err != nil {
			e.fail(s.name, fmt.Errorf("reset: %w", err))
			continue
		}
		if err := s.fn(ctx); err != nil {
			e.fail(s.name, err)
		}
		fmt.Fprintf(os.Stderr, "packbench: %s done in %v\n", s.name, time.Since(start).Round(time.Millisecond))
	}
	if err := e.reset(ctx); err != nil {
		e.errs = append(e.errs, fmt.Errorf("final cleanup: %w", err))
	}
	if cfg.chart != "" {
		if err := e.writeChart(cfg.chart); err != nil {
			e.errs = append(e.errs, fmt.Errorf("chart: %w", err))
		} else {
			fmt.Fprintf(e.out, "\nchart written to %s\n", cfg.chart)
		}
	}
	waitIfInterrupted()
	if len(e.errs) > 0 {
		fmt.Fprintln(os.Stderr, "packbench: errors:")
		for _, err := range e.errs {
			fmt.Fprintln(os.Stderr, "  ", err)
		}
		return 1
	}
	return 0
}

func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, " \t\"'$") {
			a = strconv.Quote(a)
		}
		out[i] = a
	}
	return out
}

// connect starts a redis-server of our own, or uses REDIS_ADDR.
func (e *env) connect(ctx context.Context) (stop func(), err error) {
	var id [6]byte
	rand.Read(id[:])
	e.prefix = "packbench:" + hex.EncodeToString(id[:]) + ":"
	stop = func() {}
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		e.addr, e.own = addr, false
	} else if e.net != nil {
		e.addr, e.own = e.net.redisAddr, true
		if e.net.proxyAddr != "" {
			e.addr = e.net.proxyAddr
		}
	} else {
		addr, s, err := startRedis()
		if err != nil {
			return stop, err
		}
		e.addr, e.own, stop = addr, true, s
	}
	e.rdb = redis.NewClient(&redis.Options{Addr: e.addr, PoolSize: 64, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, ContextTimeoutEnabled: true})
	if err := e.rdb.Ping(ctx).Err(); err != nil {
		stop()
		return func() {}, fmt.Errorf("ping %s: %w", e.addr, err)
	}
	srv, err := e.info(ctx, "server")
	if err != nil {
		stop()
		return func() {}, err
	}
	where := "own redis-server on " + e.addr
	if e.net != nil {
		where = fmt.Sprintf("own redis-server on %s in netns %s, tbf %s each way", e.net.redisAddr, e.net.ns, e.net.rate)
		if e.net.delay > 0 {
			where += fmt.Sprintf(", +%v each way via proxy %s", e.net.delay, e.net.proxyAddr)
		}
	}
	if !e.own {
		where = "shared redis on " + e.addr
	}
	e.machine = fmt.Sprintf("%d CPU, %s/%s, %s, redis %s (%s)", runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), srv["redis_version"], where)
	inner := stop
	return func() {
		// On a shared server delete what we wrote; never FLUSHALL it.
		if !e.own {
			e.reset(context.Background())
		}
		e.rdb.Close()
		inner()
	}, nil
}

// startRedis runs redis-server on a free loopback port without persistence.
func startRedis() (addr string, stop func(), err error) {
	return startRedisIn(nil, "127.0.0.1", func() int {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	})
}

// startRedisIn runs redis-server, prefixed by wrap (e.g. ip netns exec ns),
// bound to host on the port pick returns, without persistence.
func startRedisIn(wrap []string, host string, pick func() int) (addr string, stop func(), err error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, errors.New("redis-server not on PATH (or set REDIS_ADDR)")
	}
	dir, err := os.MkdirTemp("", "packbench-redis-")
	if err != nil {
		return "", nil, err
	}
	for attempt := 0; attempt < 5; attempt++ {
		port := pick()
		if port == 0 {
			os.RemoveAll(dir)
			return "", nil, errors.New("no free port")
		}
		args := append(append([]string{}, wrap...), bin,
			"--port", strconv.Itoa(port), "--bind", host,
			"--save", "", "--appendonly", "no", "--dir", dir,
			"--logfile", filepath.Join(dir, "redis.log"), "--daemonize", "no",
			"--protected-mode", "no")
		// ip netns exec execs redis-server in place, so cmd.Process is the
		// server either way.
		cmd := exec.Command(args[0], args[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return "", nil, err
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		addr = net.JoinHostPort(host, strconv.Itoa(port))
		ready := false
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			select {
			case <-done:
			default:
				if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
					fmt.Fprint(c, "PING\r\n")
					c.SetReadDeadline(time.Now().Add(time.Second))
					line, _ := bufio.NewReader(c).ReadString('\n')
					c.Close()
					if strings.HasPrefix(line, "+PONG") {
						ready = true
					}
				}
			}
			if ready {
				break
			}
			select {
			case <-done:
				deadline = time.Time{}
			case <-time.After(20 * time.Millisecond):
			}
		}
		if !ready {
			cmd.Process.Kill()
			<-done
			continue // port taken in the meantime, most likely
		}
		stop = func() {
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				cmd.Process.Kill()
				<-done
			}
			os.RemoveAll(dir)
		}
		return addr, stop, nil
	}
	os.RemoveAll(dir)
	return "", nil, errors.New("could not start redis-server")
}
