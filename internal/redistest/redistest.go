// Package redistest starts throwaway Redis servers and clusters for tests.
//
// Start runs a fresh redis-server on a free 127.0.0.1 port with no
// persistence and stops it when the test ends; StartCluster does the same
// for a local Redis Cluster. Targets hands behavioural suites a single-node
// and a cluster topology that are started once per test binary and shared;
// a package using Targets must call Shutdown from TestMain:
//
//	func TestMain(m *testing.M) {
//		code := m.Run()
//		redistest.Shutdown()
//		os.Exit(code)
//	}
//
// The helper never connects to any Redis it did not start.
//
// The server binary is redis-server on PATH unless the environment
// variable PACKCACHE_REDIS_SERVER names another (a path or a name on
// PATH), such as a valkey-server or a Redis of another version; every
// helper, Sentinel included, starts that binary. ServerVersion says which
// server and version it is, so that a test can name a difference between
// servers.
//
// If redis-server is not on PATH (and PACKCACHE_REDIS_SERVER is unset), Start falls back to an embedded miniredis
// (Server.Real reports false), StartCluster skips, and Targets offers only
// the single-node target. Setting PACKCACHE_REQUIRE_REDIS=1 in the
// environment turns every such fallback or skip into a test failure, so CI
// cannot silently run against the fallback.
package redistest

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// RequireEnv is the environment variable that, when set to "1", makes a
// missing redis-server a test failure instead of a fallback or skip.
const RequireEnv = "PACKCACHE_REQUIRE_REDIS"

// serverBinary is the executable looked up on PATH when ServerEnv is
// unset. Tests of this package override it to exercise the fallback.
var serverBinary = "redis-server"

var fallbackOnce sync.Once

// requireReal reports whether a missing server fails the test: under
// PACKCACHE_REQUIRE_REDIS=1, or when PACKCACHE_REDIS_SERVER names one.
func requireReal() bool { return os.Getenv(RequireEnv) == "1" || os.Getenv(ServerEnv) != "" }

// findServer returns the path of the server binary (see ServerEnv), or ""
// if there is none.
func findServer() string {
	p, err := exec.LookPath(serverWanted())
	if err != nil {
		return ""
	}
	return p
}

// logFallback logs, once per process, that miniredis replaces redis-server.
func logFallback(tb testing.TB) {
	tb.Helper()
	fallbackOnce.Do(func() {
		tb.Logf("redistest: %s; falling back to embedded miniredis (set %s=1 to fail instead)", serverMissing(), RequireEnv)
	})
}

// Start starts a fresh redis-server on a free 127.0.0.1 port and registers a
// cleanup with tb that stops it. The server has no persistence (--save ""
// --appendonly no), sends a new replica its data at once
// (--repl-diskless-sync-delay 0, where Redis waits 5 s for more replicas
// to share the transfer), binds 127.0.0.1 only, runs in its own tb.TempDir
// (which also holds its log file, redis.log) and is started in its own
// process group. Extra args are appended to the redis-server command line,
// for example "--maxmemory", "1mb"; they must not change the port, bind
// address or directory. Start returns once the server answers PING and fails
// the test, including the tail of the server log, if that does not happen
// within 10 seconds.
//
// If redis-server is not on PATH, Start fails the test when
// PACKCACHE_REQUIRE_REDIS=1 and otherwise returns a miniredis-backed Server
// (args are then ignored), logging once per process that it does so.
func Start(tb testing.TB, args ...string) *Server {
	tb.Helper()
	bin := findServer()
	if bin == "" {
		if requireReal() {
			tb.Fatalf("redistest: %s", requiredMissing())
		}
		logFallback(tb)
		if len(args) > 0 {
			tb.Logf("redistest: miniredis fallback ignores redis-server args %q", args)
		}
		s, err := startMini()
		if err != nil {
			tb.Fatalf("redistest: %v", err)
		}
		tb.Cleanup(func() { _ = s.close() })
		return s
	}
	s, err := startServer(serverConfig{bin: bin, dir: tb.TempDir(), args: args})
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.close(); err != nil {
			tb.Errorf("redistest: stopping %s: %v", s.addr, err)
		}
	})
	return s
}

// RequireReal skips the test when s is the miniredis fallback rather than a
// real redis-server, giving why (what the test needs) as the reason. When
// PACKCACHE_REQUIRE_REDIS=1 it fails the test instead of skipping.
func RequireReal(tb testing.TB, s *Server, why string) {
	tb.Helper()
	if s != nil && s.Real() {
		return
	}
	if requireReal() {
		tb.Fatalf("redistest: this test needs a real redis-server (%s), but %s", why, requiredMissing())
	}
	tb.Skipf("redistest: skipped: this test needs a real redis-server (%s); %s, so this is the miniredis fallback", why, serverMissing())
}

// RequireServer is RequireReal for a test that has not started a server
// yet: it skips the test (fails it when PACKCACHE_REQUIRE_REDIS=1) unless
// the server binary (see ServerEnv) is there.
func RequireServer(tb testing.TB, why string) {
	tb.Helper()
	if findServer() != "" {
		return
	}
	RequireReal(tb, nil, why)
}

// Addr returns the server's "127.0.0.1:port" address. It does not change
// across Stop and Restart.
func (s *Server) Addr() string { return s.addr }

// Real reports whether s is a real redis-server process; it is false for the
// miniredis fallback.
func (s *Server) Real() bool { return s.mini == nil }

// Dir returns the server's working directory, which holds its log file
// redis.log. It is empty for the miniredis fallback.
func (s *Server) Dir() string { return s.dir }

// Client returns a new go-redis client for s, with go-redis defaults changed
// by opts, and registers a cleanup with tb that closes it. It honours
// context deadlines (ContextTimeoutEnabled), as packcache requires.
func (s *Server) Client(tb testing.TB, opts ...func(*redis.Options)) *redis.Client {
	tb.Helper()
	o := &redis.Options{Addr: s.addr, ContextTimeoutEnabled: true}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Universal returns a new single-node redis.UniversalClient for s, with
// go-redis defaults changed by opts, and registers a cleanup with tb that
// closes it. It honours context deadlines (ContextTimeoutEnabled).
func (s *Server) Universal(tb testing.TB, opts ...func(*redis.UniversalOptions)) redis.UniversalClient {
	tb.Helper()
	o := &redis.UniversalOptions{Addrs: []string{s.addr}, ContextTimeoutEnabled: true}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewUniversalClient(o)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop stops the server: SIGTERM (after SIGCONT if paused), then SIGKILL if
// it has not exited within 5 seconds. The port stays assigned to s so that
// Restart can bring the server back on the same address. Stopping a stopped
// server does nothing. For the miniredis fallback Stop closes the listener.
func (s *Server) Stop(tb testing.TB) {
	tb.Helper()
	if err := s.stop(); err != nil {
		tb.Fatalf("redistest: stop %s: %v", s.addr, err)
	}
}

// Kill ends the server with SIGKILL, as a crash or an OOM kill would: it
// has no chance to close its connections in order. As with Stop, the port
// stays assigned to s for Restart. Killing a stopped server does nothing.
// For the miniredis fallback Kill closes the listener, as Stop does.
func (s *Server) Kill(tb testing.TB) {
	tb.Helper()
	if err := s.kill(); err != nil {
		tb.Fatalf("redistest: kill %s: %v", s.addr, err)
	}
}

// Restart starts the server again on the same port (stopping it first if it
// is running) and waits until it answers PING. The restarted server is empty,
// since it has no persistence; the miniredis fallback is flushed to match.
// For a node of a Cluster whose other nodes are all up, Restart also waits
// until the whole cluster is healthy again, which takes a few seconds.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	if err := s.restart(); err != nil {
		tb.Fatalf("redistest: restart %s: %v", s.addr, err)
	}
}

// Pause suspends the server process with SIGSTOP: connections stay open but
// nothing is answered until Resume. It needs a real server (see RequireReal).
// Stop and the cleanup resume a paused server before stopping it.
func (s *Server) Pause(tb testing.TB) {
	tb.Helper()
	RequireReal(tb, s, "Pause (SIGSTOP of the server process)")
	if !canPause {
		tb.Skip("redistest: Pause is not supported on this platform")
	}
	if err := s.signal(true); err != nil {
		tb.Fatalf("redistest: pause %s: %v", s.addr, err)
	}
}

// Resume continues a server suspended by Pause with SIGCONT.
func (s *Server) Resume(tb testing.TB) {
	tb.Helper()
	RequireReal(tb, s, "Resume (SIGCONT of the server process)")
	if !canPause {
		tb.Skip("redistest: Resume is not supported on this platform")
	}
	if err := s.signal(false); err != nil {
		tb.Fatalf("redistest: resume %s: %v", s.addr, err)
	}
}

// CommandCount returns how many times cmd has been called on the server
// since it started or since the last ResetStats, from INFO commandstats.
// cmd is case-insensitive; name a subcommand as "config|get" or "config get".
// It uses the helper's own admin connection, so it does not disturb the
// test's clients (though every client's commands, including connection
// handshakes such as HELLO, are counted). The miniredis fallback has no
// command statistics: CommandCount skips the test there (see RequireReal).
func (s *Server) CommandCount(tb testing.TB, cmd string) int64 {
	tb.Helper()
	RequireReal(tb, s, fmt.Sprintf("CommandCount(%q) (INFO commandstats)", cmd))
	n, err := s.commandCount(cmd)
	if err != nil {
		tb.Fatalf("redistest: INFO commandstats on %s: %v", s.addr, err)
	}
	return n
}

// ResetStats resets the server's statistics, including the counts that
// CommandCount reports, with CONFIG RESETSTAT. It does nothing for the
// miniredis fallback.
func (s *Server) ResetStats(tb testing.TB) {
	tb.Helper()
	if err := s.resetStats(); err != nil {
		tb.Fatalf("redistest: CONFIG RESETSTAT on %s: %v", s.addr, err)
	}
}

// FlushAll deletes every key on the server.
func (s *Server) FlushAll(tb testing.TB) {
	tb.Helper()
	if err := s.flushAll(); err != nil {
		tb.Fatalf("redistest: FLUSHALL on %s: %v", s.addr, err)
	}
}
