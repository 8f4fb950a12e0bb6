package redistest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// Timeouts. Every wait in this package is bounded by one of these. They
// bound failures, never what a test checks, and those that wait for a
// server to start are generous: on a machine loaded by the parallel
// tests under -race, a server took more than 10 s to answer its first
// PING (each PING then waited 250 ms).
const (
	startTimeout   = time.Minute     // until a started redis-server answers PING
	stopTimeout    = 5 * time.Second // after SIGTERM, before SIGKILL
	killTimeout    = 5 * time.Second // after SIGKILL
	clusterTimeout = time.Minute     // until a cluster is healthy
	adminTimeout   = 5 * time.Second // one admin command: a paused server holds it this long
	pingTimeout    = time.Second
	pollInterval   = 20 * time.Millisecond
)

// liveProcs counts redis-server processes started and not yet reaped.
var liveProcs atomic.Int64

// ports reserves ports this process handed out (including cluster bus
// ports), so concurrent starts in one test binary never pick the same port.
var ports = struct {
	mu   sync.Mutex
	used map[int]bool
}{used: map[int]bool{6379: true, 16379: true}}

func reservePorts(ps ...int) bool {
	ports.mu.Lock()
	defer ports.mu.Unlock()
	for _, p := range ps {
		if ports.used[p] {
			return false
		}
	}
	for _, p := range ps {
		ports.used[p] = true
	}
	return true
}

// pickPort returns a currently free 127.0.0.1 port. For cluster nodes the
// cluster bus port (port+10000) must be free too.
func pickPort(cluster bool) (int, error) {
	var lastErr error
	for range 200 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("find a free port: %w", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		if !cluster {
			_ = l.Close()
			if reservePorts(p) {
				return p, nil
			}
			continue
		}
		if p+10000 > 65535 {
			_ = l.Close()
			continue
		}
		l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		_ = l.Close()
		if err != nil {
			lastErr = err
			continue
		}
		_ = l2.Close()
		if reservePorts(p, p+10000) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("no free port (and cluster bus port) found after 200 tries; last error: %v", lastErr)
}

// process is one run of redis-server.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once Wait has returned
	err  error         // Wait's result; read only after done is closed
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Server is a redis-server process (or, as a labelled fallback, a
// miniredis) that a test started with Start, or a node of a Cluster.
//
// A Server's methods are safe for concurrent use. Methods taking a
// testing.TB report failures with tb.Fatalf and so must be called from the
// goroutine running the test.
type Server struct {
	addr    string
	port    int
	bin     string
	dir     string
	ownDir  bool     // remove dir on close (servers not tied to a test)
	cluster *Cluster // set for nodes of a Cluster
	cmode   bool     // started with --cluster-enabled yes
	// nodeTimeout is its --cluster-node-timeout; 0 is failoverNodeTimeout.
	nodeTimeout time.Duration
	args        []string // extra arguments given to Start

	admin adminConn

	mu     sync.Mutex // guards the fields below
	proc   *process   // nil while stopped
	mini   *miniredis.Miniredis
	miniUp bool // the miniredis is listening
	paused bool
	closed bool
}

// serverConfig describes a real redis-server to start.
type serverConfig struct {
	bin     string
	dir     string
	ownDir  bool
	cluster bool
	// nodeTimeout is a cluster node's --cluster-node-timeout; 0 is
	// failoverNodeTimeout.
	nodeTimeout time.Duration
	args        []string
}

// startServer starts a redis-server on a fresh free port, retrying with a
// new port if the chosen one was taken in the meantime.
func startServer(cfg serverConfig) (*Server, error) {
	var lastErr error
	for range 5 {
		port, err := pickPort(cfg.cluster)
		if err != nil {
			return nil, err
		}
		s := &Server{
			addr:   net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			port:   port,
			bin:    cfg.bin,
			dir:    cfg.dir,
			ownDir: cfg.ownDir,
			args:   cfg.args,
		}
		s.admin.addr = s.addr
		s.cmode, s.nodeTimeout = cfg.cluster, cfg.nodeTimeout
		s.mu.Lock()
		err = s.startLocked()
		s.mu.Unlock()
		if err == nil {
			return s, nil
		}
		lastErr = err
		var se *startError
		if !errors.As(err, &se) || !se.addrInUse {
			break
		}
	}
	return nil, lastErr
}

// startMini starts the miniredis fallback.
func startMini() (*Server, error) {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		return nil, fmt.Errorf("start miniredis: %w", err)
	}
	s := &Server{addr: m.Addr(), mini: m, miniUp: true}
	s.port, _ = strconv.Atoi(m.Port())
	s.admin.addr = s.addr
	return s, nil
}

func (s *Server) logPath() string   { return filepath.Join(s.dir, "redis.log") }
func (s *Server) stdioPath() string { return filepath.Join(s.dir, "stdio.log") }

func (s *Server) cmdline() []string {
	a := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--protected-mode", "no",
		"--daemonize", "no",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--logfile", s.logPath(),
		"--loglevel", "warning",
		"--repl-diskless-sync-delay", "0", // a replica syncs at once, not after 5 s
	}
	if s.cmode {
		timeout := s.nodeTimeout
		if timeout == 0 {
			timeout = failoverNodeTimeout
		}
		a = append(a,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(s.dir, "nodes.conf"),
			"--cluster-node-timeout", strconv.FormatInt(timeout.Milliseconds(), 10),
			"--cluster-announce-ip", "127.0.0.1",
		)
	}
	return append(a, s.args...)
}

// startError is a failed start of redis-server, with the tail of its logs.
type startError struct {
	msg       string
	addrInUse bool
	log       string
}

func (e *startError) Error() string {
	if e.log == "" {
		return e.msg + " (redis-server wrote no log)"
	}
	return e.msg + "\n--- redis-server log tail ---\n" + e.log
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// tail returns at most the last 4 KiB of path written after offset.
func tail(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const max = 4 << 10
	if size := fileSize(path); size-offset > max {
		offset = size - max
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(f)
	return strings.TrimSpace(string(b))
}

// startLocked starts the process on s.port and waits until it answers PING.
// s.mu must be held.
func (s *Server) startLocked() error {
	logOff, stdioOff := fileSize(s.logPath()), fileSize(s.stdioPath())
	logs := func() string {
		var parts []string
		if t := tail(s.stdioPath(), stdioOff); t != "" {
			parts = append(parts, t)
		}
		if t := tail(s.logPath(), logOff); t != "" {
			parts = append(parts, t)
		}
		return strings.Join(parts, "\n")
	}

	stdio, err := os.OpenFile(s.stdioPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, s.cmdline()...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = stdio, stdio // *os.File: no copying goroutines
	cmd.SysProcAttr = sysProcAttr()
	err = cmd.Start()
	_ = stdio.Close()
	if err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	liveProcs.Add(1)
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		liveProcs.Add(-1)
		close(p.done)
	}()
	s.proc, s.paused = p, false
	s.admin.close()

	fail := func(msg string) error {
		_ = s.stopLocked()
		l := logs()
		return &startError{
			msg:       fmt.Sprintf("redis-server on %s: %s", s.addr, msg),
			addrInUse: strings.Contains(strings.ToLower(l), "already in use"),
			log:       l,
		}
	}
	deadline := time.Now().Add(startTimeout)
	for {
		if p.exited() {
			return fail(fmt.Sprintf("exited during startup (%v)", p.err))
		}
		if _, err := s.admin.do(pingTimeout, "PING"); err == nil {
			break
		} else if time.Now().After(deadline) {
			return fail(fmt.Sprintf("did not answer PING within %v (last error: %v)", startTimeout, err))
		}
		time.Sleep(pollInterval)
	}
	// Make sure the PONG came from our process and not from something else
	// that grabbed the port before redis-server could bind it.
	info, err := s.admin.doString(adminTimeout, "INFO", "server")
	if err != nil {
		return fail(fmt.Sprintf("INFO server: %v", err))
	}
	if pid := parseInfo(info)["process_id"]; pid != strconv.Itoa(cmd.Process.Pid) {
		e := fail(fmt.Sprintf("port is served by another process (pid %s, ours %d)", pid, cmd.Process.Pid))
		e.(*startError).addrInUse = true
		return e
	}
	return nil
}

// stopLocked stops the process: SIGCONT if paused, SIGTERM, then SIGKILL
// after stopTimeout. It always reaps the process. s.mu must be held.
func (s *Server) stopLocked() error { return s.endLocked(false) }

// endLocked ends the server process: with SIGTERM, then SIGKILL if it
// lingers; or, with kill, with SIGKILL at once, as a crash would.
func (s *Server) endLocked(kill bool) error {
	p := s.proc
	if p == nil {
		return nil
	}
	s.admin.close()
	if s.paused {
		_ = resume(p.cmd.Process)
		s.paused = false
	}
	if !p.exited() {
		if kill {
			_ = forceKill(p.cmd.Process)
		} else {
			_ = terminate(p.cmd.Process)
		}
		select {
		case <-p.done:
		case <-time.After(stopTimeout):
			_ = forceKill(p.cmd.Process)
			select {
			case <-p.done:
			case <-time.After(killTimeout):
				return fmt.Errorf("redis-server pid %d on %s did not exit after SIGKILL", p.cmd.Process.Pid, s.addr)
			}
		}
	}
	s.proc = nil
	return nil
}

// close stops the server for good and removes its directory if it owns it.
func (s *Server) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.admin.close()
	if s.mini != nil {
		s.mini.Close()
		s.miniUp = false
		return nil
	}
	err := s.stopLocked()
	if s.ownDir && err == nil {
		err = os.RemoveAll(s.dir)
	}
	return err
}

// kill ends the server with SIGKILL.
func (s *Server) kill() error { return s.end(true) }

func (s *Server) stop() error { return s.end(false) }

// end stops the server (kill: with SIGKILL at once), or closes the
// listener of the miniredis fallback.
func (s *Server) end(kill bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mini != nil {
		s.mini.Close()
		s.miniUp = false
		return nil
	}
	return s.endLocked(kill)
}

// restart restarts the server and, for a cluster node whose peers are all
// up and not paused, waits until the cluster is healthy again.
func (s *Server) restart() error {
	if err := s.restartProc(); err != nil {
		return err
	}
	if c := s.cluster; c != nil {
		for _, n := range c.nodes {
			if !n.running() || n.isPaused() {
				return nil // the cluster cannot become healthy yet
			}
		}
		return c.waitHealthy(clusterTimeout)
	}
	return nil
}

// restartProc restarts the server and waits only for PING.
func (s *Server) restartProc() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("server already closed by its cleanup")
	}
	if s.mini != nil {
		defer s.mu.Unlock()
		s.mini.Close()
		s.miniUp = false
		if err := s.mini.StartAddr(s.addr); err != nil {
			return fmt.Errorf("restart miniredis on %s: %w", s.addr, err)
		}
		s.miniUp = true
		// A real redis-server without persistence comes back empty.
		s.mini.FlushAll()
		return nil
	}
	err := s.stopLocked()
	if err == nil {
		// Same port: retry briefly if it is momentarily unavailable.
		for i := 0; ; i++ {
			err = s.startLocked()
			var se *startError
			if err == nil || !errors.As(err, &se) || !se.addrInUse || i == 20 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	s.mu.Unlock()
	return err
}

// running reports whether the server is up (not stopped, not crashed).
func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mini != nil {
		return s.miniUp
	}
	return s.proc != nil && !s.proc.exited()
}

func (s *Server) signal(pause bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || s.proc.exited() {
		return fmt.Errorf("redis-server on %s is not running", s.addr)
	}
	if pause {
		if err := suspend(s.proc.cmd.Process); err != nil {
			return err
		}
		s.paused = true
		return nil
	}
	if err := resume(s.proc.cmd.Process); err != nil {
		return err
	}
	s.paused = false
	return nil
}

func (s *Server) isPaused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paused
}

func (s *Server) commandCount(cmd string) (int64, error) {
	info, err := s.admin.doString(adminTimeout, "INFO", "commandstats")
	if err != nil {
		return 0, err
	}
	name := "cmdstat_" + strings.ReplaceAll(strings.ToLower(strings.TrimSpace(cmd)), " ", "|")
	v, ok := parseInfo(info)[name]
	if !ok {
		return 0, nil
	}
	for _, f := range strings.Split(v, ",") {
		if n, ok := strings.CutPrefix(f, "calls="); ok {
			return strconv.ParseInt(n, 10, 64)
		}
	}
	return 0, fmt.Errorf("no calls= in %s:%s", name, v)
}

func (s *Server) resetStats() error {
	if s.mini != nil {
		return nil // miniredis keeps no statistics
	}
	_, err := s.admin.do(adminTimeout, "CONFIG", "RESETSTAT")
	return err
}

func (s *Server) flushAll() error {
	if s.mini != nil {
		s.mini.FlushAll()
		return nil
	}
	_, err := s.admin.do(adminTimeout, "FLUSHALL", "SYNC")
	return err
}
