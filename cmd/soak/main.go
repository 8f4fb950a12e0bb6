// Command soak drives a packcache.Cache with mixed Get, Set, GetOrLoad and
// Delete load against Redis for a while and checks every read against a
// model of what was written.
//
// Each key maps to a prefix with its own codec (lz4, snappy, zstd, none).
// Values carry the key, a sequence number and a checksum of their payload,
// whose size is log-uniform from 100 B to 2 MB. Writes to a key (Set,
// Delete, and GetOrLoad, whose load stores) are serialized by a per-key
// mutex and recorded in the model once confirmed; reads are not. A read
// must return a value whose checksum matches, that belongs to the key, and
// whose sequence number is at least that of the last write confirmed before
// the read began — or a miss, if the key was deleted or a delete overlapped
// the read.
//
// At the end it checks that there were no mismatches or unexpected errors,
// that the goroutine count is back to where it started once the cache is
// closed, and that the heap is back near its starting size; it prints
// throughput, latency percentiles per operation and errors by kind, and
// exits non-zero if any check fails.
//
// Without -addr (or REDIS_ADDR) it starts its own redis-server on a free
// port with no persistence. With an external server it uses a key prefix of
// its own, deletes only its own keys, and never flushes.
//
// With -outage it checks instead that invalidations survive Redis stopping
// (see outage.go): it stops its own redis-server (SIGSTOP) for 1-2 s every
// 2-3 s while writers update a source of truth and invalidate the cache on
// every update and readers Get through a slow loader, and fails on a stale
// read once a resume has settled or a write undone at the end.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
)

func main() {
	os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr))
}

// config is what one soak run does.
type config struct {
	duration time.Duration
	workers  int
	keys     int
	minSize  int
	maxSize  int
	addr     string // external Redis; empty: start one
	heapSlop uint64 // allowed heap growth, bytes
}

func cli(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := config{minSize: 100, maxSize: 2 << 20, heapSlop: 64 << 20}
	fs.DurationVar(&cfg.duration, "duration", 10*time.Minute, "how long to run")
	fs.IntVar(&cfg.workers, "workers", 64, "concurrent workers")
	fs.IntVar(&cfg.keys, "keys", 500, "distinct keys")
	fs.StringVar(&cfg.addr, "addr", os.Getenv("REDIS_ADDR"), "external Redis address (default $REDIS_ADDR; empty: start a redis-server)")
	quick := fs.Bool("quick", false, "a short run: 5s, 16 workers, 100 keys, values up to 256 KB (explicit flags still win)")
	outage := fs.Bool("outage", false, "stop (SIGSTOP) and resume a redis-server of its own every few seconds while writers invalidate and readers load; check for stale reads and undone writes (default 1m; -workers: readers, default 16; -keys default 64)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *outage {
		return cliOutage(fs, cfg, stdout, stderr)
	}
	if *quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["duration"] {
			cfg.duration = 5 * time.Second
		}
		if !set["workers"] {
			cfg.workers = 16
		}
		if !set["keys"] {
			cfg.keys = 100
		}
		cfg.maxSize = 256 << 10
	}
	if cfg.workers < 1 || cfg.keys < 1 || cfg.duration <= 0 {
		fmt.Fprintln(stderr, "soak: -workers, -keys and -duration must be positive")
		return 2
	}
	rep, err := run(cfg, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "soak:", err)
		return 1
	}
	return verdict(rep.failures(), stdout, stderr)
}

// verdict prints the failed checks, or PASS, and returns the exit status.
func verdict(fails []string, stdout, stderr io.Writer) int {
	if len(fails) > 0 {
		for _, f := range fails {
			fmt.Fprintln(stderr, "soak: FAIL:", f)
		}
		return 1
	}
	fmt.Fprintln(stdout, "soak: PASS")
	return 0
}

// cliOutage runs the outage mode (-outage) with the flags given.
func cliOutage(fs *flag.FlagSet, cfg config, stdout, stderr io.Writer) int {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["addr"] || set["quick"] {
		fmt.Fprintln(stderr, "soak: -outage starts, stops and resumes a redis-server of its own: it takes neither -addr nor -quick")
		return 2
	}
	oc := defaultOutageConfig()
	if set["duration"] {
		oc.duration = cfg.duration
	}
	if set["workers"] {
		oc.readers = cfg.workers
	}
	if set["keys"] {
		oc.keys = cfg.keys
	}
	if oc.readers < 1 || oc.keys < 1 || oc.duration <= 0 {
		fmt.Fprintln(stderr, "soak: -workers, -keys and -duration must be positive")
		return 2
	}
	rep, err := runOutage(oc, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "soak:", err)
		return 1
	}
	return verdict(rep.failures(), stdout, stderr)
}

// Value is what the soak stores.
type Value struct {
	Key     string
	Seq     uint64
	Payload string
	Sum     uint32
}

func checksum(s string) uint32 {
	return crc32.ChecksumIEEE(unsafe.Slice(unsafe.StringData(s), len(s)))
}

// keyState is the model of one key. mu serializes writes; the atomics are
// read without it by readers.
type keyState struct {
	mu       sync.Mutex
	seq      atomic.Uint64 // Seq of the last confirmed write (0: none)
	present  atomic.Bool   // the last confirmed write was a Set, not a Delete
	delSeq   atomic.Uint64 // seq at the last confirmed Delete
	delBegun atomic.Uint64 // Deletes begun
	delDone  atomic.Uint64 // Deletes confirmed
	byLoad   atomic.Bool   // the last confirmed write was a GetOrLoad's load
}

// snapshot is the model of a key as a read begins.
type snapshot struct {
	seq     uint64 // last confirmed write
	present bool   // not deleted since
	delSeq  uint64 // seq at the last confirmed Delete
	delDone uint64 // Deletes confirmed
	byLoad  bool   // the write was a GetOrLoad's load (diagnostics only)
}

// snap reads the model for a read that begins now. delDone is read first:
// a Delete that began after it (and so may have overlapped the read) shows
// as delBegun moving past it.
func (st *keyState) snap() snapshot {
	var s snapshot
	s.delDone = st.delDone.Load()
	s.seq = st.seq.Load()
	s.present = st.present.Load()
	s.delSeq = st.delSeq.Load()
	s.byLoad = st.byLoad.Load()
	return s
}

// deleteOverlapped reports whether a Delete was under way at any time
// since s was taken.
func (st *keyState) deleteOverlapped(s snapshot) bool {
	return st.delBegun.Load() != s.delDone
}

type opKind int

const (
	opGet opKind = iota
	opSet
	opGetOrLoad
	opDelete
	numOps
)

var opNames = [numOps]string{"get", "set", "getorload", "delete"}

// hist is a latency histogram with buckets a factor of 2^(1/8) apart,
// from 1 µs up.
type hist struct {
	n       uint64
	buckets [256]uint64
}

func bucketOf(d time.Duration) int {
	us := float64(d) / float64(time.Microsecond)
	if us <= 1 {
		return 0
	}
	return min(int(math.Log2(us)*8)+1, 255)
}

func bucketUpper(b int) time.Duration {
	return time.Duration(math.Exp2(float64(b)/8) * float64(time.Microsecond))
}

func (h *hist) add(d time.Duration) { h.n++; h.buckets[bucketOf(d)]++ }

func (h *hist) merge(o *hist) {
	h.n += o.n
	for i := range h.buckets {
		h.buckets[i] += o.buckets[i]
	}
}

func (h *hist) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(h.n)))
	var seen uint64
	for i, c := range h.buckets {
		seen += c
		if seen >= want {
			return bucketUpper(i)
		}
	}
	return bucketUpper(255)
}

// report is the outcome of a run.
type report struct {
	elapsed    time.Duration
	ops        [numOps]hist
	errs       map[string]uint64 // unexpected errors by kind
	misses     uint64
	mismatches uint64
	// missAfterLoad counts the mismatches that were misses after a
	// GetOrLoad had stored the key: a loader's store does not end the
	// sharing of a loader-less Get's read under way (packcache bug).
	missAfterLoad uint64
	examples      []string
	goroutines    [2]int    // at start, at end
	heap          [2]uint64 // HeapAlloc at start, at end
	heapSlop      uint64
	leakDetail    string
	bytesStored   uint64
}

func (r *report) failures() []string {
	var f []string
	if r.mismatches > 0 {
		f = append(f, fmt.Sprintf("%d mismatched reads, e.g. %s", r.mismatches, strings.Join(r.examples, "; ")))
	}
	var n uint64
	for _, c := range r.errs {
		n += c
	}
	if n > 0 {
		f = append(f, fmt.Sprintf("%d unexpected errors: %v", n, r.errs))
	}
	if r.goroutines[1] > r.goroutines[0] {
		f = append(f, fmt.Sprintf("goroutines: %d at start, %d after Close\n%s", r.goroutines[0], r.goroutines[1], r.leakDetail))
	}
	if r.heap[1] > r.heap[0]+r.heapSlop {
		f = append(f, fmt.Sprintf("heap: %d MiB at start, %d MiB at end (allowed +%d MiB)", r.heap[0]>>20, r.heap[1]>>20, r.heapSlop>>20))
	}
	var total uint64
	for i := range r.ops {
		total += r.ops[i].n
	}
	if total == 0 {
		f = append(f, "no operations completed")
	}
	return f
}

func errKind(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "context"
	case errors.Is(err, packcache.ErrCircuitOpen):
		return "circuit-open"
	case errors.Is(err, packcache.ErrRedis):
		return "redis"
	case errors.Is(err, packcache.ErrCorrupt):
		return "corrupt"
	case errors.Is(err, packcache.ErrTooLarge):
		return "too-large"
	case errors.Is(err, packcache.ErrUnknownHeader):
		return "unknown-header"
	case errors.Is(err, packcache.ErrSerialization):
		return "serialization"
	default:
		return "other"
	}
}

// goroutinesBackTo waits up to 5 seconds (timers and connection closers
// may take a moment) for the goroutine count to fall to start, and returns
// the count, with every goroutine's stack if it did not.
func goroutinesBackTo(start int) (n int, stacks string) {
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		n = runtime.NumGoroutine()
		if n <= start || time.Now().After(end) {
			break
		}
	}
	if n > start {
		buf := make([]byte, 1<<20)
		stacks = string(buf[:runtime.Stack(buf, true)])
	}
	return n, stacks
}

// corpus is the text payloads are cut from: words (compressible) with runs
// of random hex (not), so every codec has work of both kinds.
func makeCorpus(n int, r *mrand.Rand) string {
	words := strings.Fields(`the a lecture notes exam tomorrow room please read chapter question
		answer thanks professor deadline homework assignment group project slides posted link meeting`)
	var sb strings.Builder
	sb.Grow(n + 64)
	buf := make([]byte, 32)
	for sb.Len() < n {
		if r.IntN(8) == 0 {
			for i := range buf {
				buf[i] = byte(r.Uint32())
			}
			sb.WriteString(hex.EncodeToString(buf))
		} else {
			sb.WriteString(words[r.IntN(len(words))])
		}
		sb.WriteByte(' ')
	}
	return sb.String()[:n]
}

// server is a redis-server the soak started.
type server struct {
	addr string
	proc *os.Process // this server's process only: the soak signals nothing else
	stop func()      // resumes it if paused, stops it, removes its directory
}

// pause stops the server with SIGSTOP: connections stay open, nothing is
// answered, and what clients write is read when it resumes.
func (s *server) pause() error { return s.proc.Signal(syscall.SIGSTOP) }

// resume continues a paused server (SIGCONT).
func (s *server) resume() error { return s.proc.Signal(syscall.SIGCONT) }

// redisServer is the server binary the soak starts: $PACKCACHE_REDIS_SERVER
// (a path or a name on PATH, such as valkey-server), as for the tests,
// else redis-server.
func redisServer() string {
	if v := os.Getenv("PACKCACHE_REDIS_SERVER"); v != "" {
		return v
	}
	return "redis-server"
}

// startRedis starts a redis-server (see redisServer) on a free port (never
// 6379) in a temporary directory.
func startRedis() (*server, error) {
	bin, err := exec.LookPath(redisServer())
	if err != nil {
		return nil, fmt.Errorf("no -addr or REDIS_ADDR given and %s not found: %w", redisServer(), err)
	}
	dir, err := os.MkdirTemp("", "packcache-soak-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 5 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if port == 6379 {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir, "--protected-mode", "no",
			"--daemonize", "no", "--loglevel", "warning", "--logfile", dir+"/redis.log")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		stop := func() {
			// A stopped process acts on SIGTERM only once continued.
			cmd.Process.Signal(syscall.SIGCONT)
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(5 * time.Second):
				cmd.Process.Kill()
				<-exited
			}
			os.RemoveAll(dir)
		}
		c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 200 * time.Millisecond, MaxRetries: -1, ContextTimeoutEnabled: true})
		deadline := time.Now().Add(10 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
			lastErr = c.Ping(ctx).Err()
			cancel()
			if lastErr == nil {
				break
			}
			select {
			case <-exited:
			default:
				if time.Now().Before(deadline) {
					time.Sleep(20 * time.Millisecond)
					continue
				}
			}
			break
		}
		if lastErr == nil {
			// The PONG may come from another process that took the port
			// before this redis-server could bind it (another test
			// package's servers start beside the soak's): a soak against
			// someone else's cluster node read CLUSTERDOWN on every call.
			lastErr = ownServer(c, cmd.Process.Pid)
		}
		c.Close()
		if lastErr == nil {
			return &server{addr: addr, proc: cmd.Process, stop: stop}, nil
		}
		stop()
		dir, _ = os.MkdirTemp("", "packcache-soak-")
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("redis-server did not start: %v", lastErr)
}

// ownServer returns an error unless the server c talks to is the process
// pid.
func ownServer(c *redis.Client, pid int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return fmt.Errorf("INFO server: %w", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			if v != strconv.Itoa(pid) {
				return fmt.Errorf("port served by another process (pid %s, ours %d)", v, pid)
			}
			return nil
		}
	}
	return errors.New("INFO server names no process_id")
}

func run(cfg config, out io.Writer) (*report, error) {
	addr, stopRedis := cfg.addr, func() {}
	external := addr != ""
	if !external {
		srv, err := startRedis()
		if err != nil {
			return nil, err
		}
		addr, stopRedis = srv.addr, srv.stop
	}
	defer stopRedis()

	var rnd [6]byte
	rand.Read(rnd[:])
	base := "soak:" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(rnd[:]) + ":"
	codecs := []struct {
		name string
		c    codec.Codec
	}{{"lz4", codec.LZ4}, {"snappy", codec.Snappy}, {"zstd", codec.Zstd}, {"none", codec.None}}

	r := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 1))
	corpus := makeCorpus(cfg.maxSize+4096, r)
	keys := make([]string, cfg.keys)
	states := make([]keyState, cfg.keys)
	for i := range keys {
		keys[i] = base + codecs[i%len(codecs)].name + ":" + strconv.Itoa(i)
	}

	rep := &report{errs: map[string]uint64{}, heapSlop: cfg.heapSlop}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rep.heap[0] = ms.HeapAlloc
	rep.goroutines[0] = runtime.NumGoroutine()

	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: cfg.workers + 8, ContextTimeoutEnabled: true})
	opts := []packcache.Option{packcache.WithTTL(time.Hour), packcache.WithLoadTimeout(30 * time.Second)}
	for _, c := range codecs {
		opts = append(opts, packcache.WithPrefix(base+c.name+":", packcache.Policy{Codec: c.c, CompressAbove: 512}))
	}
	cache, err := packcache.New[Value](rdb, opts...)
	if err != nil {
		rdb.Close()
		return nil, err
	}

	var (
		seq      atomic.Uint64
		mu       sync.Mutex // guards rep.errs, rep.examples
		stored   atomic.Uint64
		mismatch atomic.Uint64
		// reads that missed although a GetOrLoad had stored the key
		// before they began: see the report's note.
		missAfterLoad atomic.Uint64
		misses        atomic.Uint64
	)
	bad := func(format string, args ...any) {
		mismatch.Add(1)
		mu.Lock()
		if len(rep.examples) < 5 {
			rep.examples = append(rep.examples, fmt.Sprintf(format, args...))
		}
		mu.Unlock()
	}
	unexpected := func(op string, err error) {
		mu.Lock()
		rep.errs[op+"/"+errKind(err)]++
		if len(rep.examples) < 5 {
			rep.examples = append(rep.examples, op+": "+err.Error())
		}
		mu.Unlock()
	}
	newValue := func(wr *mrand.Rand, key string) Value {
		// Log-uniform size in [minSize, maxSize].
		lo, hi := math.Log(float64(cfg.minSize)), math.Log(float64(cfg.maxSize))
		n := int(math.Exp(lo + wr.Float64()*(hi-lo)))
		off := wr.IntN(len(corpus) - n + 1)
		v := Value{Key: key, Seq: seq.Add(1), Payload: corpus[off : off+n]}
		v.Sum = checksum(v.Payload)
		return v
	}
	// check verifies a read of key i that began with the model in state s0.
	check := func(i int, op string, v Value, err error, s0 snapshot) {
		st := &states[i]
		if errors.Is(err, packcache.ErrMiss) {
			misses.Add(1)
			if s0.present && !st.deleteOverlapped(s0) {
				by := "Set"
				if s0.byLoad {
					by = "GetOrLoad"
					missAfterLoad.Add(1)
				}
				bad("%s %s: miss, but seq %d was written by %s before the read began and no delete overlapped", op, keys[i], s0.seq, by)
			}
			return
		}
		if err != nil {
			unexpected(op, err)
			return
		}
		switch {
		case v.Key != keys[i]:
			bad("%s %s: value of key %q", op, keys[i], v.Key)
		case checksum(v.Payload) != v.Sum:
			bad("%s %s: seq %d payload of %d bytes fails its checksum", op, keys[i], v.Seq, len(v.Payload))
		case v.Seq < s0.seq:
			bad("%s %s: stale seq %d, %d was confirmed before the read", op, keys[i], v.Seq, s0.seq)
		case !s0.present && v.Seq <= s0.delSeq && !st.deleteOverlapped(s0):
			bad("%s %s: seq %d read back after its delete", op, keys[i], v.Seq)
		case v.Seq > seq.Load():
			bad("%s %s: seq %d never issued", op, keys[i], v.Seq)
		}
	}

	deadline := time.Now().Add(cfg.duration)
	hists := make([][numOps]hist, cfg.workers)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range cfg.workers {
		wg.Go(func() {
			wr := mrand.New(mrand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			h := &hists[w]
			for time.Now().Before(deadline) {
				i := wr.IntN(cfg.keys)
				k, st := keys[i], &states[i]
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				var op opKind
				switch p := wr.IntN(100); {
				case p < 50:
					op = opGet
				case p < 75:
					op = opSet
				case p < 90:
					op = opGetOrLoad
				default:
					op = opDelete
				}
				var t0 time.Time
				switch op {
				case opGet:
					s0 := st.snap()
					t0 = time.Now()
					v, err := cache.Get(ctx, k)
					h[op].add(time.Since(t0))
					check(i, "get", v, err, s0)
				case opSet:
					st.mu.Lock()
					v := newValue(wr, k)
					t0 = time.Now()
					err := cache.Set(ctx, k, v)
					h[op].add(time.Since(t0))
					if err != nil {
						unexpected("set", err)
					} else {
						st.seq.Store(v.Seq)
						st.byLoad.Store(false)
						st.present.Store(true)
						stored.Add(uint64(len(v.Payload)))
					}
					st.mu.Unlock()
				case opGetOrLoad:
					// Its load stores, so it is a write: under the key's
					// lock, loading the model's value (a new one after a
					// Delete).
					st.mu.Lock()
					s0 := st.snap()
					var loaded *Value
					t0 = time.Now()
					v, err := cache.GetOrLoad(ctx, k, func(ctx context.Context) (Value, error) {
						nv := newValue(wr, k)
						loaded = &nv
						return nv, nil
					})
					h[op].add(time.Since(t0))
					if err == nil && loaded != nil {
						if v.Seq != loaded.Seq {
							bad("getorload %s: loaded seq %d, got %d", k, loaded.Seq, v.Seq)
						}
						st.seq.Store(loaded.Seq)
						st.byLoad.Store(true)
						st.present.Store(true)
					} else {
						check(i, "getorload", v, err, s0)
					}
					st.mu.Unlock()
				case opDelete:
					st.mu.Lock()
					st.delBegun.Add(1)
					t0 = time.Now()
					err := cache.Delete(ctx, k)
					h[op].add(time.Since(t0))
					if err != nil {
						unexpected("delete", err)
					} else {
						st.delSeq.Store(st.seq.Load())
						st.present.Store(false)
					}
					st.delDone.Add(1)
					st.mu.Unlock()
				}
				cancel()
			}
		})
	}
	wg.Wait()
	rep.elapsed = time.Since(start)
	for w := range hists {
		for op := range numOps {
			rep.ops[op].merge(&hists[w][op])
		}
	}
	hists = nil
	rep.mismatches = mismatch.Load()
	rep.missAfterLoad = missAfterLoad.Load()
	rep.misses = misses.Load()
	rep.bytesStored = stored.Load()

	stats := cache.Stats()
	// Clean up: with an external server, our keys only.
	if external {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		for i := 0; i < len(keys); i += 100 {
			cache.Delete(ctx, keys[i:min(i+100, len(keys))]...)
		}
		cancel()
	}
	cache.Close()
	rdb.Close()
	cache, rdb, corpus, keys, states = nil, nil, "", nil, nil

	rep.goroutines[1], rep.leakDetail = goroutinesBackTo(rep.goroutines[0])
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	rep.heap[1] = ms.HeapAlloc

	fmt.Fprintf(out, "soak: %v, %d workers, %d keys, values %d B..%d B, redis %s\n",
		rep.elapsed.Round(time.Millisecond), cfg.workers, cfg.keys, cfg.minSize, cfg.maxSize, map[bool]string{true: "external " + addr, false: "own " + addr}[external])
	var total uint64
	for op := range numOps {
		total += rep.ops[op].n
	}
	fmt.Fprintf(out, "soak: %d ops, %.0f ops/s, %d MiB of payload written, %d misses\n",
		total, float64(total)/rep.elapsed.Seconds(), rep.bytesStored>>20, rep.misses)
	fmt.Fprintf(out, "%-10s %10s %10s %10s %10s %10s\n", "op", "count", "ops/s", "p50", "p99", "p999")
	for op := range numOps {
		h := &rep.ops[op]
		fmt.Fprintf(out, "%-10s %10d %10.0f %10v %10v %10v\n", opNames[op], h.n, float64(h.n)/rep.elapsed.Seconds(),
			h.quantile(0.5).Round(time.Microsecond), h.quantile(0.99).Round(time.Microsecond), h.quantile(0.999).Round(time.Microsecond))
	}
	codecNames := make([]string, 0, len(stats.Codecs))
	for name := range stats.Codecs {
		codecNames = append(codecNames, name)
	}
	sort.Strings(codecNames)
	for _, name := range codecNames {
		cs := stats.Codecs[name]
		ratio := 0.0
		if cs.BytesIn > 0 {
			ratio = float64(cs.BytesOut) / float64(cs.BytesIn)
		}
		fmt.Fprintf(out, "codec %-7s %8d values, %6d MiB in, stored at %.2f\n", name, cs.Values, cs.BytesIn>>20, ratio)
	}
	fmt.Fprintf(out, "cache: hits %d, misses %d, sets %d, loads %d, coalesced %d, decode errors %d, redis errors %d\n",
		stats.Hits, stats.Misses, stats.Sets, stats.Loads, stats.CoalescedWaits, stats.DecodeErrors, stats.RedisErrors)
	errs := "none"
	if len(rep.errs) > 0 {
		errs = fmt.Sprint(rep.errs)
	}
	fmt.Fprintf(out, "errors by kind: %s; mismatches: %d (of which misses after a GetOrLoad store: %d)\n", errs, rep.mismatches, rep.missAfterLoad)
	fmt.Fprintf(out, "goroutines: %d at start, %d after Close; heap: %d MiB at start, %d MiB at end\n",
		rep.goroutines[0], rep.goroutines[1], rep.heap[0]>>20, rep.heap[1]>>20)
	return rep, nil
}
