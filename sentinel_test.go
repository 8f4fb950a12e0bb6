package packcache_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
)

// TestSentinel runs a round trip through a Sentinel-managed master: the
// third kind of redis.UniversalClient the cache is for. The sentinel is
// redis-server in sentinel mode, started and stopped by this test.
func TestSentinel(t *testing.T) {
	master := redistest.Start(t)
	redistest.RequireReal(t, master, "a sentinel process")
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not on PATH")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := t.TempDir()
	host, mport, _ := net.SplitHostPort(master.Addr())
	conf := filepath.Join(dir, "sentinel.conf")
	os.WriteFile(conf, []byte(fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\nlogfile %s\nsentinel monitor packcache %s %s 1\n",
		port, dir, filepath.Join(dir, "sentinel.log"), host, mport)), 0o644)
	cmd := exec.Command(bin, conf, "--sentinel")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	saddr := fmt.Sprintf("127.0.0.1:%d", port)
	ctx := ctxT(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		sc := redis.NewSentinelClient(&redis.Options{Addr: saddr})
		addr, err := sc.GetMasterAddrByName(ctx, "packcache").Result()
		sc.Close()
		if err == nil && len(addr) == 2 && addr[1] == mport {
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "sentinel.log"))
			t.Fatalf("sentinel never reported the master: %v\n%s", err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}

	rdb := redis.NewUniversalClient(&redis.UniversalOptions{
		MasterName: "packcache", Addrs: []string{saddr}, ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { rdb.Close() })
	if _, ok := rdb.(*redis.Client); !ok {
		t.Fatalf("UniversalClient with MasterName is a %T, want a failover *redis.Client", rdb)
	}
	c := mustNew[Channel](t, rdb, packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
		return makeChannel(1, 50_000), nil
	})))
	want := makeChannel(1, 50_000)
	got, err := c.Get(ctx, "via:sentinel")
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("read-through Get via Sentinel: %v", err)
	}
	raw := master.Client(t).Get(ctx, "via:sentinel").Val()
	if !strings.HasPrefix(raw, "\x04") {
		t.Fatalf("value not stored zstd-compressed on the master: % x", raw[:4])
	}
}
