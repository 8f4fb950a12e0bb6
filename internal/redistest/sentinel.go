package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartSentinel starts a redis-server in Sentinel mode, on a free port,
// monitoring master under the name name (with a quorum of one), and
// returns its address once it reports the master. It is stopped when the
// test ends. It needs a real redis-server: on the miniredis fallback it
// fails under PACKCACHE_REQUIRE_REDIS=1 and skips otherwise.
func StartSentinel(tb testing.TB, master *Server, name string) string {
	tb.Helper()
	RequireReal(tb, master, "a Sentinel process")
	bin := findServer()          // there is one: master is real
	port, err := pickPort(false) // reserved, as Start's ports are
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	host, mport, _ := net.SplitHostPort(master.Addr())
	conf := filepath.Join(dir, "sentinel.conf")
	err = os.WriteFile(conf, fmt.Appendf(nil, "port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\nlogfile %s\nsentinel monitor %s %s %s 1\n",
		port, dir, filepath.Join(dir, "sentinel.log"), name, host, mport), 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, conf, "--sentinel")
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		terminate(cmd.Process)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			forceKill(cmd.Process)
			<-done
		}
	})
	saddr := fmt.Sprintf("127.0.0.1:%d", port)
	deadline := time.Now().Add(startTimeout)
	for {
		sc := redis.NewSentinelClient(&redis.Options{Addr: saddr})
		addr, err := sc.GetMasterAddrByName(context.Background(), name).Result()
		sc.Close()
		if err == nil && len(addr) == 2 && addr[1] == mport {
			return saddr
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "sentinel.log"))
			tb.Fatalf("redistest: sentinel never reported the master: %v\n%s", err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
