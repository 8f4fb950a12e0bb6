package packcache_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// The write-never-undone guarantee: once Set or Delete of a key returns,
// no load that began before it, in this process or any other, on any node,
// leaves its value in Redis; and no Get of this process that starts
// afterwards returns that load's value. Each test below starts a slow load,
// makes the write while the load is under way, then lets the load finish.

// slowLoader is a loader whose first call blocks until released; later
// calls return at once. It reports each call's start.
type slowLoader struct {
	calls   atomic.Int64
	entered chan struct{}
	release chan struct{}
	first   Channel // what the blocked first call returns
	later   Channel // what later calls return
}

func newSlowLoader(first, later Channel) *slowLoader {
	return &slowLoader{entered: make(chan struct{}, 16), release: make(chan struct{}), first: first, later: later}
}

func (l *slowLoader) Load(ctx context.Context, key string) (Channel, error) {
	n := l.calls.Add(1)
	l.entered <- struct{}{}
	if n == 1 {
		select {
		case <-l.release:
		case <-ctx.Done():
			return Channel{}, ctx.Err()
		}
		return l.first, nil
	}
	return l.later, nil
}

// otherClient returns a client of its own for tg, as another process
// would have.
func otherClient(t *testing.T, tg redistest.Target) redis.UniversalClient {
	if tg.Server != nil {
		return tg.Server.Universal(t)
	}
	return tg.Cluster.Universal(t)
}

func TestWriteNotUndoneByOlderLoad(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		for _, write := range []string{"Set", "Delete", "SetMany", "DeleteMany"} {
			for _, writer := range []string{"same-cache", "other-cache"} {
				t.Run(write+"/"+writer, func(t *testing.T) {
					testWriteNotUndone(t, tg, write, writer)
				})
			}
		}
	})
}

func testWriteNotUndone(t *testing.T, tg redistest.Target, write, writer string) {
	ctx := ctxT(t)
	key := "undone:" + t.Name()
	old, fresh, reloaded := Channel{ID: "v1-old"}, Channel{ID: "v2-written"}, Channel{ID: "v3-reloaded"}
	ld := newSlowLoader(old, reloaded)
	opts := []packcache.Option{packcache.WithLoader[Channel](ld)}
	if writer == "other-cache" {
		// A write by another process is not forgotten here: within the
		// share window a Get may still share a read begun before it
		// (WithShareWindow). Without a window, a Get begun after the
		// write reads afresh.
		opts = append(opts, packcache.WithShareWindow(packcache.Off))
	}
	c := mustNew[Channel](t, tg.Client, opts...)
	w := c
	if writer == "other-cache" {
		w = mustNew[Channel](t, otherClient(t, tg))
	}
	tg.Client.Del(ctx, key)

	first := make(chan Channel, 1)
	go func() { v, _ := c.Get(ctx, key); first <- v }()
	<-ld.entered // the load has begun (its lease is in place)
	if raw := rawGet(t, tg.Client, key); raw[0] != codec.HeaderLease {
		t.Fatalf("during the load the key holds %q, want a lease", raw)
	}
	var err error
	switch write {
	case "Set":
		err = w.Set(ctx, key, fresh)
	case "SetMany":
		err = w.SetMany(ctx, map[string]Channel{key: fresh, key + ":other": fresh})
	case "Delete":
		err = w.Delete(ctx, key)
	case "DeleteMany":
		err = w.Delete(ctx, key, key+":other")
	}
	if err != nil {
		t.Fatal(err)
	}
	deleted := strings.HasPrefix(write, "Delete")

	// A Get that starts after the write returned, while the old load is
	// still under way, must not join it.
	after := make(chan Channel, 1)
	go func() { v, _ := c.Get(ctx, key); after <- v }()
	if deleted {
		<-ld.entered // it loads anew
	}
	select {
	case v := <-after:
		if want := map[bool]Channel{true: reloaded, false: fresh}[deleted]; v.ID != want.ID {
			t.Fatalf("Get begun after %s returned %q, want %q", write, v.ID, want.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Get begun after %s waited for the older load", write)
	}

	close(ld.release) // the old load ends now, after the write
	if v := <-first; v.ID != old.ID {
		t.Fatalf("the Get begun before the write got %q, want the old load's %q", v.ID, old.ID)
	}
	var got Channel
	if deleted {
		got = reloaded // the load begun after the Delete may store
	} else {
		got = fresh
	}
	raw, rerr := tg.Client.Get(ctx, key).Bytes()
	if rerr != nil {
		t.Fatalf("after the old load: %v", rerr)
	}
	if strings.Contains(string(raw), old.ID) || !strings.Contains(string(raw), got.ID) {
		t.Fatalf("after the old load ended Redis holds %q, want %q", raw, got.ID)
	}
	if v, err := c.Get(ctx, key); err != nil || v.ID != got.ID {
		t.Fatalf("Get at the end = %q, %v; want %q", v.ID, err, got.ID)
	}
	if st := c.Stats(); st.Superseded != 1 {
		t.Fatalf("Superseded = %d, want 1 (the old load's store refused)", st.Superseded)
	}
}

// TestWriteNotUndoneAcrossProcesses runs the load in one OS process and the
// write in another, both ways, for Set and Delete, on a single node and on
// the cluster.
func TestWriteNotUndoneAcrossProcesses(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		for _, write := range []string{"set", "delete"} {
			for _, loaderHere := range []bool{true, false} {
				name := write + "/load-in-child"
				if loaderHere {
					name = write + "/write-in-child"
				}
				t.Run(name, func(t *testing.T) { testAcrossProcesses(t, tg, write, loaderHere) })
			}
		}
	})
}

func testAcrossProcesses(t *testing.T, tg redistest.Target, write string, loaderHere bool) {
	ctx := ctxT(t)
	key := "xproc:" + t.Name()
	tg.Client.Del(ctx, key)
	old, fresh := Channel{ID: "v1-old"}, Channel{ID: "v2-written"}
	if loaderHere {
		ld := newSlowLoader(old, old)
		c := mustNew[Channel](t, tg.Client, packcache.WithLoader[Channel](ld))
		first := make(chan Channel, 1)
		go func() { v, _ := c.Get(ctx, key); first <- v }()
		<-ld.entered
		out := runChild(t, tg, "write", write, key, fresh.ID)
		if out != "done" {
			t.Fatalf("child: %q", out)
		}
		close(ld.release)
		if v := <-first; v.ID != old.ID {
			t.Fatalf("the Get begun before the write got %q", v.ID)
		}
	} else {
		cmd, stdin, stdout := startChild(t, tg, "load", key, old.ID)
		if line := readLine(t, stdout); line != "loading" {
			t.Fatalf("child: %q", line)
		}
		w := mustNew[Channel](t, tg.Client)
		var err error
		if write == "set" {
			err = w.Set(ctx, key, fresh)
		} else {
			err = w.Delete(ctx, key)
		}
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(stdin, "go")
		if line := readLine(t, stdout); line != "got "+old.ID {
			t.Fatalf("child's Get: %q", line)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("child: %v", err)
		}
	}
	raw, err := tg.Client.Get(ctx, key).Result()
	switch {
	case write == "delete" && err != redis.Nil:
		t.Fatalf("after the Delete and the older load, Redis holds %q (%v), want nothing", raw, err)
	case write == "set" && (err != nil || !strings.Contains(raw, fresh.ID)):
		t.Fatalf("after the Set and the older load, Redis holds %q (%v), want %q", raw, err, fresh.ID)
	}
}

// The child process: PACKCACHE_TEST_CHILD names what it does; its
// arguments follow in PACKCACHE_TEST_ARGS. See TestMain.
const childEnv = "PACKCACHE_TEST_CHILD"

func childArgs(t *testing.T, tg redistest.Target, mode string, args ...string) []string {
	env := os.Environ()
	addrs := ""
	if tg.Server != nil {
		addrs = "single=" + tg.Server.Addr()
	} else {
		addrs = "cluster=" + strings.Join(tg.Cluster.Addrs(), ",")
	}
	return append(env, childEnv+"="+mode, "PACKCACHE_TEST_ARGS="+strings.Join(append([]string{addrs}, args...), "|"))
}

func runChild(t *testing.T, tg redistest.Target, mode string, args ...string) string {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = childArgs(t, tg, mode, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child %s: %v: %s", mode, err, out)
	}
	return strings.TrimSpace(string(out))
}

func startChild(t *testing.T, tg redistest.Target, mode string, args ...string) (*exec.Cmd, io.Writer, *bufio.Reader) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = childArgs(t, tg, mode, args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, stdin, bufio.NewReader(stdout)
}

func readLine(t *testing.T, r *bufio.Reader) string {
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("reading the child: %v (%q)", err, line)
	}
	return strings.TrimSpace(line)
}

// child runs the other process's side of TestWriteNotUndoneAcrossProcesses
// and returns its exit code.
func child(mode string) int {
	args := strings.Split(os.Getenv("PACKCACHE_TEST_ARGS"), "|")
	kind, addrs, _ := strings.Cut(args[0], "=")
	opts := &redis.UniversalOptions{Addrs: strings.Split(addrs, ","), IsClusterMode: kind == "cluster", ContextTimeoutEnabled: true}
	rdb := redis.NewUniversalClient(opts)
	defer rdb.Close()
	ctx := context.Background()
	fail := func(err error) int { fmt.Println("error:", err); return 1 }
	switch mode {
	case "write":
		c, err := packcache.New[Channel](rdb)
		if err != nil {
			return fail(err)
		}
		defer c.Close()
		op, key, val := args[1], args[2], args[3]
		if op == "set" {
			err = c.Set(ctx, key, Channel{ID: val})
		} else {
			err = c.Delete(ctx, key)
		}
		if err != nil {
			return fail(err)
		}
		fmt.Println("done")
	case "load":
		key, val := args[1], args[2]
		in := bufio.NewReader(os.Stdin)
		c, err := packcache.New[Channel](rdb, packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
			fmt.Println("loading")
			if _, err := in.ReadString('\n'); err != nil {
				return Channel{}, err
			}
			return Channel{ID: val}, nil
		})))
		if err != nil {
			return fail(err)
		}
		defer c.Close()
		v, err := c.Get(ctx, key)
		if err != nil {
			return fail(err)
		}
		fmt.Println("got " + v.ID)
	case "groups": // TestGroupsTwoProcesses
		if err := groupsChild(rdb, args[1:]); err != nil {
			return fail(err)
		}
	case "dict-read":
		if err := dictChild(rdb, args[1:]); err != nil {
			return fail(err)
		}
	default:
		return fail(errors.New("unknown child mode " + mode))
	}
	return 0
}

// TestLeaseReleasedWhenLoadFails: a load that fails, returns DoNotCache,
// or finds nothing (without negative caching) removes its lease, so that
// readers do not take the key for a load in progress.
func TestLeaseReleasedWhenLoadFails(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		ctx := ctxT(t)
		outcomes := map[string]error{
			"error":      errors.New("database down"),
			"notfound":   packcache.ErrNotFound,
			"donotcache": packcache.DoNotCache,
		}
		for name, lerr := range outcomes {
			key := "release:" + name
			c := mustNew[Channel](t, tg.Client, packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
				return Channel{ID: key}, lerr
			})))
			c.Get(ctx, key)
			if n := tg.Client.Exists(ctx, key).Val(); n != 0 {
				t.Errorf("%s: the key holds %q after the load", name, tg.Client.Get(ctx, key).Val())
			}
		}
	})
}

// TestMissCostsTwoRoundTrips: a read-through miss costs the read, which
// places the lease (SET NX GET), and the store script: two round trips, as
// a GET and a SET. A hit costs the one read and nothing else; a Get
// without a loader stays a plain GET.
func TestMissCostsTwoRoundTrips(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	redistest.RequireReal(t, s, "counts commands with INFO commandstats")
	ctx := ctxT(t)
	for _, pol := range []string{"plain", "refresh"} {
		t.Run(pol, func(t *testing.T) {
			opts := []packcache.Option{packcache.WithShareWindow(packcache.Off), packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
				return Channel{ID: key}, nil
			}))}
			if pol == "refresh" { // reads pipeline PTTL with the read
				opts = append(opts, packcache.WithTTL(time.Hour), packcache.WithPrefix("", packcache.Policy{RefreshAfter: time.Minute}))
			}
			c := mustNew[Channel](t, rdb, opts...)
			c.Get(ctx, "warm-the-scripts:"+pol)
			stores := c.Stats().Stores
			s.ResetStats(t)
			key := "rt:" + pol
			if _, err := c.Get(ctx, key); err != nil {
				t.Fatal(err)
			}
			count := func() (set, get, scripts, pttl int64) {
				return s.CommandCount(t, "set"), s.CommandCount(t, "get"), s.CommandCount(t, "evalsha") + s.CommandCount(t, "eval"), s.CommandCount(t, "pttl")
			}
			set, get, scripts, pttl := count()
			// The store script makes one GET and one SET of its own: not
			// round trips. PTTL rides in the read's pipeline.
			if set != 2 || get != 1 || scripts != 1 {
				t.Fatalf("a miss made %d SETs, %d GETs, %d scripts; want 2, 1, 1 (SET NX GET, then the store)", set, get, scripts)
			}
			if trips := set + get - scripts; trips != 2 {
				t.Fatalf("a miss made %d round trips, want 2", trips)
			}
			if want := map[string]int64{"plain": 0, "refresh": 1}[pol]; pttl != want {
				t.Fatalf("a miss made %d PTTLs, want %d", pttl, want)
			}
			if ttl := rdb.PTTL(ctx, key).Val(); pol == "refresh" && ttl < 59*time.Minute {
				t.Fatalf("the stored value's TTL is %v, want the policy's hour", ttl)
			}
			if st := c.Stats(); st.Stores != stores+1 || st.Superseded != 0 {
				t.Fatalf("stats: %d stores, %d superseded; want 1 and 0", st.Stores-stores, st.Superseded)
			}
			s.ResetStats(t)
			if v, err := c.Get(ctx, key); err != nil || v.ID != key {
				t.Fatalf("hit: %+v, %v", v, err)
			}
			if set, get, scripts, _ := count(); set != 1 || get != 0 || scripts != 0 {
				t.Fatalf("a hit made %d SETs, %d GETs and %d scripts, want one SET NX GET and nothing else", set, get, scripts)
			}
			if st := c.Stats(); st.Loads != 2 {
				t.Fatalf("%d loads, want 2 (the warm-up's and the miss's)", st.Loads)
			}
		})
	}
	plain := mustNew[Channel](t, rdb, packcache.WithShareWindow(packcache.Off))
	s.ResetStats(t)
	if _, err := plain.Get(ctx, "rt:plain"); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Get(ctx, "rt:absent"); !errors.Is(err, packcache.ErrMiss) {
		t.Fatalf("loader-less miss: %v", err)
	}
	if set, get := s.CommandCount(t, "set"), s.CommandCount(t, "get"); set != 0 || get != 2 {
		t.Fatalf("two loader-less Gets made %d SETs and %d GETs, want 0 and 2", set, get)
	}
	if n := rdb.Exists(ctx, "rt:absent").Val(); n != 0 {
		t.Fatal("a loader-less miss left something in the key")
	}
}

// rawState returns what key holds, "<nil>" for nothing and "<lease>" for a
// lease.
func rawState(t testing.TB, rdb redis.UniversalClient, key string) string {
	t.Helper()
	b, err := rdb.Get(context.Background(), key).Bytes()
	switch {
	case err == redis.Nil:
		return "<nil>"
	case err != nil:
		t.Fatalf("raw GET %q: %v", key, err)
	case len(b) > 0 && b[0] == 0x0C:
		return "<lease>"
	}
	return string(b)
}

func TestRefreshOverwritesIdenticalSet(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	redistest.RequireReal(t, s, "needs TTLs to run down in real time")
	ctx := ctxT(t)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var calls atomic.Int64
	ld := packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
		if calls.Add(1) == 1 {
			entered <- struct{}{}
			<-release
			return "loaded-before-the-write", nil
		}
		return "later", nil
	})
	c, err := packcache.New[string](rdb, packcache.WithLoader[string](ld),
		packcache.WithTTL(10*time.Second), packcache.WithPrefix("", packcache.Policy{RefreshAfter: 100 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "k", "A"); err != nil {
		t.Fatal(err)
	}
	rdb.PExpire(ctx, "k", 10*time.Second-150*time.Millisecond) // 150 ms old: due for refresh
	if v, err := c.Get(ctx, "k"); err != nil || v != "A" {
		t.Fatalf("Get = %q, %v", v, err)
	}
	<-entered // the refresh's loader runs
	// The write: the source now says "A" again, and the writer Sets it.
	if err := c.Set(ctx, "k", "A"); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := c.Close(); err != nil { // waits for the refresh
		t.Fatal(err)
	}
	if got := rawState(t, rdb, "k"); got != `"A"` {
		t.Errorf("after Set(k, A) returned, Redis holds %s: a refresh begun before the Set undid it", got)
	}
}

// Same, with Delete and a later load that stores the same bytes again.
func TestRefreshOverwritesDeleteThenReload(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	redistest.RequireReal(t, s, "needs TTLs to run down in real time")
	ctx := ctxT(t)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var calls atomic.Int64
	ld := packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
		if calls.Add(1) == 1 {
			entered <- struct{}{}
			<-release
			return "loaded-before-the-delete", nil
		}
		return "A", nil
	})
	c, err := packcache.New[string](rdb, packcache.WithLoader[string](ld),
		packcache.WithTTL(10*time.Second), packcache.WithPrefix("", packcache.Policy{RefreshAfter: 100 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	c.Set(ctx, "k", "A")
	rdb.PExpire(ctx, "k", 10*time.Second-150*time.Millisecond) // 150 ms old: due for refresh
	c.Get(ctx, "k")                                            // starts the refresh
	<-entered
	if err := c.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, "k"); err != nil || v != "A" { // loads A afresh, stores it
		t.Fatalf("Get after Delete = %q, %v", v, err)
	}
	close(release)
	c.Close()
	if got := rawState(t, rdb, "k"); got != `"A"` {
		t.Errorf("Redis holds %s: the refresh begun before Delete stored its value", got)
	}
}

func TestLeaseLeftAfterSerializationError(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	// As JSON would fail on a NaN.
	c := mustNew[string](t, rdb, packcache.WithSerializer(brokenSerializer{err: errors.New("json: unsupported value: NaN")}),
		packcache.WithLoader[string](packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) { return "NaN", nil })))
	_, err := c.Get(ctx, "nan")
	if !errors.Is(err, packcache.ErrSerialization) {
		t.Fatalf("Get = %v, want ErrSerialization", err)
	}
	if got := rawState(t, rdb, "nan"); got != "<nil>" {
		ttl, _ := rdb.PTTL(ctx, "nan").Result()
		t.Errorf("after the failed Get returned, key holds %s (PTTL %v)", got, ttl)
	}
}

func TestLeaseLeftAfterTooLarge(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[string](t, rdb, packcache.WithMaxValueSize(100), packcache.WithLoader[string](packcache.LoaderFunc[string](
		func(ctx context.Context, key string) (string, error) { return strings.Repeat("x", 500), nil })))
	// Too large to store, but the loader's value all the same (see
	// TestLoadedValueTooLargeToStore); the lease must not stay behind.
	if v, err := c.Get(ctx, "big"); err != nil || len(v) != 500 {
		t.Fatalf("Get = %d bytes, %v; want the loaded value", len(v), err)
	}
	if got := rawState(t, rdb, "big"); got != "<nil>" {
		t.Errorf("after the failed Get returned, key holds %s", got)
	}
	// And meanwhile a Get without a loader (another cache) reports a miss,
	// a Get with a loader loads without storing.
}

type crossHook struct {
	mu       sync.Mutex
	n        int
	arrived2 chan struct{} // the second acquire pipeline has arrived
	first    chan struct{} // the first has sent its first command
	second   chan struct{} // the second is done
	enabled  atomic.Bool
}

func (h *crossHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *crossHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func isAcquire(cmd redis.Cmder) bool {
	a := cmd.Args()
	// evalsha sha 1 key lease ms over
	return len(a) == 7 && (cmd.Name() == "evalsha" || cmd.Name() == "eval") && a[6] == ""
}

func (h *crossHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !h.enabled.Load() || len(cmds) != 2 || !isAcquire(cmds[0]) {
			return next(ctx, cmds)
		}
		h.mu.Lock()
		h.n++
		n := h.n
		h.mu.Unlock()
		switch n {
		case 1:
			<-h.arrived2
			err := next(ctx, cmds[:1])
			close(h.first)
			<-h.second
			if err2 := next(ctx, cmds[1:]); err == nil {
				err = err2
			}
			return err
		case 2:
			close(h.arrived2)
			<-h.first
			// The other key first, so that each batch wins one key.
			err := next(ctx, []redis.Cmder{cmds[1], cmds[0]})
			close(h.second)
			return err
		}
		return next(ctx, cmds)
	}
}

type stormLog struct {
	mu    sync.Mutex
	start map[string]time.Time // loaded value -> when its loader call began
	seq   atomic.Int64
}

func (l *stormLog) load(ctx context.Context, key string) (string, error) {
	n := l.seq.Add(1)
	v := "L" + key + "#" + strconv.FormatInt(n, 10)
	l.mu.Lock()
	l.start[v] = time.Now()
	l.mu.Unlock()
	d := time.Duration(n%7) * 3 * time.Millisecond
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return "", ctx.Err()
	}
	if n%11 == 0 {
		return "", packcache.ErrNotFound
	}
	return v, nil
}

func TestWriteStorm(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"plain", "refresh+stale", "nocoalesce+window0"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel() // each mode on a set of shared servers of its own
			forEachTarget(t, func(t *testing.T, tg redistest.Target) { stormOnce(t, tg, mode) })
		})
	}
}

func stormOnce(t *testing.T, tg redistest.Target, mode string) {
	ctx := ctxT(t)
	lg := &stormLog{start: map[string]time.Time{}}
	ld := packcache.LoaderFunc[string](lg.load)
	base := []packcache.Option{packcache.WithLoader[string](ld), packcache.WithPrefix("", packcache.Policy{NegativeTTL: time.Second}), packcache.WithLoadTimeout(2 * time.Second)}
	switch mode {
	case "refresh+stale":
		base = append(base, packcache.WithTTL(60*time.Millisecond), packcache.WithPrefix("", packcache.Policy{RefreshAfter: 20 * time.Millisecond}), packcache.WithPrefix("", packcache.Policy{StaleFor: time.Second}))
	case "nocoalesce+window0":
		base = append(base, packcache.WithCoalescing(false), packcache.WithShareWindow(packcache.Off))
	}
	c1, err := packcache.New[string](tg.Client, base...)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := packcache.New[string](otherClient(t, tg), append(base, packcache.WithLock(30*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"s:a", "s:b", "s:c", "s:{d}1", "s:{d}2"}
	type write struct {
		val   string // "" for delete
		began time.Time
	}
	last := make([]write, len(keys))
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for r := range 6 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			cc := c1
			if r%2 == 1 {
				cc = c2
			}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := keys[(r+i)%len(keys)]
				switch i % 3 {
				case 0:
					cc.Get(ctx, k)
				case 1:
					cctx, cancel := context.WithTimeout(ctx, time.Duration(i%5)*time.Millisecond)
					cc.GetOrLoad(cctx, k, func(ctx context.Context) (string, error) { return lg.load(ctx, k) })
					cancel()
				case 2:
					cc.GetOrLoadMany(ctx, keys[:3+(i%3)], func(ctx context.Context, ks []string) (map[string]string, error) {
						m := map[string]string{}
						for _, k := range ks {
							if v, err := lg.load(ctx, k); err == nil {
								m[k] = v
							}
						}
						return m, nil
					})
				}
			}
		}()
	}
	var writers sync.WaitGroup
	var violations atomic.Int64
	for ki, k := range keys {
		writers.Add(1)
		go func() {
			defer writers.Done()
			cc := c1
			if ki%2 == 1 {
				cc = c2
			}
			for i := range 400 {
				w := write{began: time.Now()}
				if i%4 == 3 {
					if err := cc.Delete(ctx, k); err != nil {
						t.Errorf("Delete: %v", err)
						return
					}
				} else {
					w.val = "W" + k + "#" + strconv.Itoa(i)
					if err := cc.Set(ctx, k, w.val); err != nil {
						t.Errorf("Set: %v", err)
						return
					}
					got, err := cc.Get(ctx, k)
					if err == nil && got != w.val {
						lg.mu.Lock()
						st, loaded := lg.start[got]
						lg.mu.Unlock()
						if !loaded || st.Before(w.began) {
							violations.Add(1)
							t.Errorf("%s: Get right after Set(%s) returned %s (loader began %v before the Set)", k, w.val, got, w.began.Sub(st))
						}
					}
				}
				last[ki] = w
				time.Sleep(time.Duration(i%5) * time.Millisecond)
			}
		}()
	}
	writers.Wait()
	close(stop)
	readers.Wait()
	if err := c1.Close(); err != nil {
		t.Error(err)
	}
	if err := c2.Close(); err != nil {
		t.Error(err)
	}
	for ki, k := range keys {
		got := rawState(t, tg.Client, k)
		w := last[ki]
		switch {
		case got == "<lease>":
			t.Errorf("%s: a lease is left after every call and load ended", k)
		case w.val != "" && got == `"`+w.val+`"`:
		case got == "<nil>" || got == "\x0e":
		default:
			v := strings.Trim(got, `"`)
			lg.mu.Lock()
			st, loaded := lg.start[v]
			lg.mu.Unlock()
			if !loaded {
				t.Errorf("%s: Redis holds %q, last write %q: an older write", k, got, w.val)
			} else if st.Before(w.began) {
				t.Errorf("%s: Redis holds %q, loaded by a call begun %v before the last write (%q)", k, got, w.began.Sub(st), w.val)
			}
		}
	}
}

func TestStaleReloadRacingDelete(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	redistest.RequireReal(t, s, "needs TTLs to run down in real time")
	ctx := ctxT(t)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	ld := packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
		entered <- struct{}{}
		<-release
		return "reloaded", nil
	})
	c := mustNew[string](t, rdb, packcache.WithLoader[string](ld), packcache.WithTTL(50*time.Millisecond), packcache.WithPrefix("", packcache.Policy{StaleFor: time.Minute}))
	c.Set(ctx, "st", "A")
	rdb.PExpire(ctx, "st", time.Minute-30*time.Millisecond) // kept for TTL + StaleFor: 80 ms old, past its 50 ms TTL
	go c.Get(ctx, "st")                                     // stale: reloads
	<-entered
	c.Delete(ctx, "st")
	close(release)
	c.Close()
	if got := rawState(t, rdb, "st"); got != "<nil>" {
		t.Errorf("stale reload stored over Delete: %s", got)
	}
}

func TestLockTakeoverRacingSet(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	pEntered, pRelease := make(chan struct{}, 1), make(chan struct{})
	p := mustNew[string](t, rdb, packcache.WithLoader[string](packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
		pEntered <- struct{}{}
		<-pRelease
		return "fromP", nil
	})))
	qEntered, qRelease := make(chan struct{}, 1), make(chan struct{})
	q := mustNew[string](t, rdb.(*redis.Client), packcache.WithLock(100*time.Millisecond), packcache.WithLoader[string](packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
		qEntered <- struct{}{}
		<-qRelease
		return "fromQ", nil
	})))
	w := mustNew[string](t, rdb)
	go p.Get(ctx, "tk")
	<-pEntered
	qDone := make(chan string)
	go func() { v, _ := q.Get(ctx, "tk"); qDone <- v }()
	<-qEntered // Q took P's lease over after 100ms
	if err := w.Set(ctx, "tk", "written"); err != nil {
		t.Fatal(err)
	}
	close(qRelease)
	<-qDone
	close(pRelease)
	p.Close()
	q.Close()
	if got := rawState(t, rdb, "tk"); got != `"written"` {
		t.Errorf("after takeover + Set, Redis holds %s", got)
	}
}

// TestLeaseFoundBeforePlacerRegistered: a load that finds a lease of its
// own cache whose placer has not registered its load yet waits for it,
// however long the placer's goroutine takes (here: held by a hook after
// its SET NX GET, as a busy machine holds it waiting for a CPU), as long
// as the key holds the lease, and then joins it: one loader call. It used
// to wait 100 ms and then load beside it without storing (a cold surge on
// a busy machine made 2 loads: TestSurgeBackgroundContext).
func TestLeaseFoundBeforePlacerRegistered(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rdb := s.Client(t)
	ctx := ctxT(t)
	const key = "placer:k"
	h := &placerHook{key: key, release: make(chan struct{}), placed: make(chan struct{})}
	rdb.AddHook(h)
	var loads atomic.Int64
	load := func(ctx context.Context, key string) (string, error) {
		loads.Add(1)
		return "v", nil
	}
	c := mustNew[string](t, rdb, packcache.WithShareWindow(packcache.Off))
	a := make(chan error, 1)
	go func() {
		_, err := c.GetOrLoad(ctx, key, func(ctx context.Context) (string, error) { return load(ctx, key) })
		a <- err
	}()
	<-h.placed // A's lease is in the key, and A is held before it registers its load
	b := make(chan error, 1)
	go func() {
		m, err := c.GetOrLoadMany(ctx, []string{key}, func(ctx context.Context, keys []string) (map[string]string, error) {
			v, err := load(ctx, keys[0])
			return map[string]string{keys[0]: v}, err
		})
		if err == nil && m[key] != "v" {
			err = fmt.Errorf("got %q", m[key])
		}
		b <- err
	}()
	// B reads the key again while it waits (every 20 ms): ten reads are
	// well past the 100 ms after which it used to load beside A.
	waitFor(t, time.Minute, "B reading the key ten times, or loading", func() bool { return h.gets.Load() >= 10 || loads.Load() > 0 })
	close(h.release)
	if err := <-a; err != nil {
		t.Fatalf("A: %v", err)
	}
	if err := <-b; err != nil {
		t.Fatalf("B: %v", err)
	}
	if n := loads.Load(); n != 1 {
		t.Fatalf("loader called %d times, want 1 (B joins A's load once A registers it)", n)
	}
}

// placerHook holds the first SET of key (a read placing its lease) once
// its reply is in, until release is closed, telling placed; and counts
// the pipelines that GET key.
type placerHook struct {
	key             string
	once            atomic.Bool
	placed, release chan struct{}
	gets            atomic.Int64
}

func (h *placerHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *placerHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if args := cmd.Args(); cmd.Name() == "set" && len(args) > 1 && args[1] == h.key && h.once.CompareAndSwap(false, true) {
			close(h.placed)
			<-h.release
		}
		return err
	}
}

func (h *placerHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if args := cmd.Args(); cmd.Name() == "get" && len(args) > 1 && args[1] == h.key {
				h.gets.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}
