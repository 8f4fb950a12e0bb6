package packcache_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
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
	default:
		return fail(errors.New("unknown child mode " + mode))
	}
	return 0
}

// TestLeaseReleasedWhenLoadFails: a load that fails, returns DoNotCache,
// or finds nothing (without negative caching) removes its lease, so that
// readers do not take the key for a load in progress.
func TestLeaseReleasedWhenLoadFails(t *testing.T) {
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

// TestLeaseCostsOneRoundTrip: a read-through miss costs a GET, the lease
// script, the loader and the store script: one round trip more than a GET
// and a SET. A hit costs one GET and nothing else.
func TestLeaseCostsOneRoundTrip(t *testing.T) {
	s, rdb := single(t)
	redistest.RequireReal(t, s, "counts commands with INFO commandstats")
	ctx := ctxT(t)
	c := mustNew[Channel](t, rdb, packcache.WithShareWindow(packcache.Off), packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
		return Channel{ID: key}, nil
	})))
	c.Get(ctx, "warm-the-scripts")
	s.ResetStats(t)
	if _, err := c.Get(ctx, "rt"); err != nil {
		t.Fatal(err)
	}
	calls := s.CommandCount(t, "get") - 2 + s.CommandCount(t, "evalsha") + s.CommandCount(t, "eval") // the scripts' own GETs are not round trips
	if calls != 3 {
		t.Fatalf("a miss made %d round trips, want 3 (GET, lease, store)", calls)
	}
	s.ResetStats(t)
	if _, err := c.Get(ctx, "rt"); err != nil {
		t.Fatal(err)
	}
	if g, e := s.CommandCount(t, "get"), s.CommandCount(t, "evalsha"); g != 1 || e != 0 {
		t.Fatalf("a hit made %d GETs and %d scripts, want 1 and 0", g, e)
	}
}
