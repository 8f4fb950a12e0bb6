package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/packcache/packcache/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// requireServer skips the test when the server the soak starts (see
// redisServer) is missing, or fails it under PACKCACHE_REQUIRE_REDIS=1 or
// when PACKCACHE_REDIS_SERVER names it.
func requireServer(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath(redisServer()); err != nil {
		if os.Getenv("PACKCACHE_REQUIRE_REDIS") == "1" || os.Getenv("PACKCACHE_REDIS_SERVER") != "" {
			t.Fatalf("%s not found: %v", redisServer(), err)
		}
		t.Skipf("%s not found", redisServer())
	}
}

// TestSoakShort runs the soak for 3 seconds against a redis-server of its
// own. It skips when the server is missing (see requireServer).
func TestSoakShort(t *testing.T) {
	requireServer(t)
	t.Parallel() // beside TestSoakOutage, each in a process of its own
	if !redistest.Alone(t) {
		return
	}
	cfg := config{duration: 3 * time.Second, workers: 16, keys: 100, minSize: 100, maxSize: 256 << 10, heapSlop: 64 << 20}
	var out bytes.Buffer
	start := time.Now()
	rep, err := run(cfg, &out)
	t.Logf("soak output (%v):\n%s", time.Since(start).Round(time.Millisecond), out.String())
	if err != nil {
		t.Fatal(err)
	}
	fails := rep.failures()
	if len(fails) > 0 {
		t.Fatal(strings.Join(fails, "\n"))
	}
}

// TestSoakOutage runs the outage mode for 7 seconds (two or three stops of
// its own redis-server): no read begun once a resume had settled may be
// stale, no write may be undone, and every failed write must have returned
// ErrPending. It skips when the server is missing (see requireServer).
func TestSoakOutage(t *testing.T) {
	requireServer(t)
	t.Parallel() // beside TestSoakShort, each in a process of its own
	if !redistest.Alone(t) {
		return
	}
	cfg := defaultOutageConfig()
	cfg.duration = 7 * time.Second
	var out bytes.Buffer
	rep, err := runOutage(cfg, &out)
	t.Logf("soak -outage output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if n := rep.own.stale.Load(); n > 0 {
		t.Errorf("%d stale reads after a resume settled", n)
	}
	if n := rep.other.stale.Load(); n > 0 {
		t.Errorf("%d stale values in Redis after a resume settled", n)
	}
	if rep.undone > 0 {
		t.Errorf("%d writes undone", rep.undone)
	}
	if rep.pending.Load() == 0 {
		t.Errorf("no write got ErrPending in %d outages: the run checked nothing", rep.outages)
	}
	if fails := rep.failures(); len(fails) > 0 {
		t.Fatal(strings.Join(fails, "\n"))
	}
}

// TestSoakCLI checks the flags and the exit status of a clean run.
func TestSoakCLI(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := cli([]string{"-workers", "0"}, &out, &errOut); code != 2 {
		t.Errorf("-workers 0: exit %d, want 2", code)
	}
	if code := cli([]string{"-nosuchflag"}, &out, &errOut); code != 2 {
		t.Errorf("unknown flag: exit %d, want 2", code)
	}
	// The outage mode stops the server it uses: never one it did not start.
	if code := cli([]string{"-outage", "-addr", "127.0.0.1:6379"}, &out, &errOut); code != 2 {
		t.Errorf("-outage -addr: exit %d, want 2", code)
	}
	if code := cli([]string{"-outage", "-keys", "0"}, &out, &errOut); code != 2 {
		t.Errorf("-outage -keys 0: exit %d, want 2", code)
	}
}

// TestOwnServer: startRedis keeps a server only if the PONG came from its
// own process; ownServer tells the process by INFO's process_id.
func TestOwnServer(t *testing.T) {
	requireServer(t)
	srv, err := startRedis()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.stop()
	c := redis.NewClient(&redis.Options{Addr: srv.addr, ContextTimeoutEnabled: true})
	defer c.Close()
	if err := ownServer(c, srv.proc.Pid); err != nil {
		t.Fatalf("the soak's own server: %v", err)
	}
	if err := ownServer(c, srv.proc.Pid+1); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("another pid: %v, want an error naming another process", err)
	}
}
