package main

// -net: Redis in a network namespace of packbench's own, reached over a veth
// pair shaped with tbf in both directions, optionally behind an in-process
// proxy that delays every read. Everything created here is removed again on
// exit, on error paths and on SIGINT/SIGTERM (see atExit).

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// cleanups is a stack of undo steps, run once, newest first. The signal
// handler runs it too, so that a SIGINT during setup leaves nothing behind.
type cleanups struct {
	mu    sync.Mutex
	steps []func()
	done  bool
}

var atExit cleanups

// interrupted is set by the signal handler, which tears down and exits;
// suites failing because of that teardown wait for the exit instead of
// reporting errors.
var interrupted atomic.Bool

func waitIfInterrupted() {
	if interrupted.Load() {
		select {}
	}
}

// setupMu is held while resources are being created and their undo steps
// registered; the signal handler takes it before running atExit.
var setupMu sync.Mutex

func (c *cleanups) push(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done { // already torn down (signal during setup): undo at once
		f()
		return
	}
	c.steps = append(c.steps, f)
}

func (c *cleanups) run() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done = true
	for i := len(c.steps) - 1; i >= 0; i-- {
		c.steps[i]()
	}
	c.steps = nil
}

// netSetup describes the shaped network -net built.
type netSetup struct {
	ns, hostIf, nsIf string
	hostIP, nsIP     net.IP
	rate             string
	rateBps          int64 // bits per second
	burst            int64 // bytes
	delay            time.Duration
	redisAddr        string // redis-server inside the namespace
	proxyAddr        string // the delaying proxy, if any
}

func (s *netSetup) describe() string {
	d := fmt.Sprintf("over a veth pair (%s ↔ %s in netns %s, %s/30 ↔ %s/30) shaped with tbf at %s (burst %d B, latency 50ms) in both directions",
		s.hostIf, s.nsIf, s.ns, s.hostIP, s.nsIP, s.rate, s.burst)
	if s.delay > 0 {
		d += fmt.Sprintf(", plus %v one-way delay per direction (RTT +%v) from an in-process proxy on %s", s.delay, 2*s.delay, s.proxyAddr)
	}
	return d
}

// parseRate parses a tc rate ("1gbit", "100mbit", "500kbit", "10mbps") into
// bits per second. tc's bps units are bytes per second.
func parseRate(s string) (int64, error) {
	l := strings.ToLower(strings.TrimSpace(s))
	units := []struct {
		suf string
		mul float64
	}{
		{"tbit", 1e12}, {"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3},
		{"tibit", 1 << 40}, {"gibit", 1 << 30}, {"mibit", 1 << 20}, {"kibit", 1 << 10},
		{"gbps", 8e9}, {"mbps", 8e6}, {"kbps", 8e3},
		{"bit", 1}, {"bps", 8},
	}
	// longest suffix first so that "kibit" is not read as "...bit"
	best := -1
	for i, u := range units {
		if strings.HasSuffix(l, u.suf) && (best < 0 || len(u.suf) > len(units[best].suf)) {
			best = i
		}
	}
	if best < 0 {
		return 0, fmt.Errorf("rate %q: want a number and a unit such as 1gbit, 100mbit, 500kbit", s)
	}
	v, err := strconv.ParseFloat(strings.TrimSuffix(l, units[best].suf), 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("rate %q: want a positive number and a unit such as 1gbit, 100mbit", s)
	}
	bps := v * units[best].mul
	if bps < 8000 || bps > 1e13 {
		return 0, fmt.Errorf("rate %q: out of range", s)
	}
	return int64(bps), nil
}

// runCmd runs a command and returns its combined output in the error.
func runCmd(name string, args ...string) error {
	var out bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// pickSubnet returns a /30 inside 10.254.0.0/16 whose addresses no local
// interface uses.
func pickSubnet(pid int) (host, peer net.IP, err error) {
	var used []*net.IPNet
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				used = append(used, n)
			}
		}
	}
	for i := 0; i < 16384; i++ {
		idx := (pid + i*7919) % 16384 // 16384 /30s in a /16
		base := net.IPv4(10, 254, byte(idx>>6), byte((idx&63)*4)).To4()
		ours := &net.IPNet{IP: base, Mask: net.CIDRMask(30, 32)}
		clash := false
		for _, u := range used {
			ones, bits := u.Mask.Size()
			if bits == 32 && ones >= 16 && (u.Contains(base) || ours.Contains(u.IP)) || ours.Contains(u.IP) {
				clash = true
			}
		}
		if !clash {
			return net.IPv4(base[0], base[1], base[2], base[3]+1).To4(), net.IPv4(base[0], base[1], base[2], base[3]+2).To4(), nil
		}
	}
	return nil, nil, errors.New("no free /30 in 10.254.0.0/16")
}

// setupNet builds the namespace, the shaped veth pair and redis-server
// inside, and registers every undo step with atExit as it goes. On error the
// caller runs atExit; the error says what could not be set up.
func setupNet(rate string, delay time.Duration) (*netSetup, error) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("needs Linux network namespaces (this is %s)", runtime.GOOS)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("not root (creating a network namespace, a veth pair and tbf qdiscs needs CAP_NET_ADMIN; run as root)")
	}
	ipBin, err := exec.LookPath("ip")
	if err != nil {
		return nil, errors.New("no `ip` on PATH (install iproute2)")
	}
	tcBin, err := exec.LookPath("tc")
	if err != nil {
		return nil, errors.New("no `tc` on PATH (install iproute2)")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, errors.New("redis-server not on PATH")
	}
	if delay < 0 || delay > 10*time.Second {
		return nil, fmt.Errorf("-net-delay %v: want 0 to 10s", delay)
	}
	bps, err := parseRate(rate)
	if err != nil {
		return nil, err
	}
	pid := os.Getpid()
	s := &netSetup{
		ns:      fmt.Sprintf("pkb-%d", pid),
		hostIf:  fmt.Sprintf("pkbh%d", pid%10000),
		nsIf:    fmt.Sprintf("pkbn%d", pid%10000),
		rate:    rate,
		rateBps: bps,
		delay:   delay,
	}
	// tbf needs a bucket of at least one packet; veth hands it GSO packets of
	// up to 64 KiB, which tbf would otherwise split. 1 ms of rate, >= 64 KiB.
	s.burst = max(bps/8/1000, 64<<10)
	if s.hostIP, s.nsIP, err = pickSubnet(pid); err != nil {
		return nil, err
	}
	if _, err := net.InterfaceByName(s.hostIf); err == nil {
		return nil, fmt.Errorf("interface %s already exists (left over from an earlier run? remove it with `ip link del %s`)", s.hostIf, s.hostIf)
	}

	// Pushed first, so it runs last: after teardown, say if anything is left.
	atExit.push(func() {
		var left []string
		if out, err := exec.Command(ipBin, "netns", "list").Output(); err == nil {
			for _, line := range strings.Split(string(out), "\n") {
				if f := strings.Fields(line); len(f) > 0 && f[0] == s.ns {
					left = append(left, "netns "+s.ns)
				}
			}
		}
		if _, err := net.InterfaceByName(s.hostIf); err == nil {
			left = append(left, "link "+s.hostIf)
		}
		if len(left) > 0 {
			fmt.Fprintf(os.Stderr, "packbench: -net cleanup: still present: %s\n", strings.Join(left, ", "))
		}
	})
	if err := runCmd(ipBin, "netns", "add", s.ns); err != nil {
		return nil, fmt.Errorf("netns creation refused: %w", err)
	}
	atExit.push(func() {
		if err := runCmd(ipBin, "netns", "del", s.ns); err != nil {
			fmt.Fprintln(os.Stderr, "packbench: -net cleanup:", err)
		}
	})
	if err := runCmd(ipBin, "link", "add", s.hostIf, "type", "veth", "peer", "name", s.nsIf, "netns", s.ns); err != nil {
		return nil, fmt.Errorf("veth creation refused: %w", err)
	}
	atExit.push(func() {
		// Deleting one end deletes both; the namespace end also goes with
		// the namespace. Ignore "cannot find device" if it is gone already.
		if _, err := net.InterfaceByName(s.hostIf); err == nil {
			if err := runCmd(ipBin, "link", "del", s.hostIf); err != nil {
				fmt.Fprintln(os.Stderr, "packbench: -net cleanup:", err)
			}
		}
	})
	nsx := func(args ...string) error { return runCmd(ipBin, append([]string{"netns", "exec", s.ns}, args...)...) }
	steps := [][]string{
		{ipBin, "addr", "add", s.hostIP.String() + "/30", "dev", s.hostIf},
		{ipBin, "link", "set", s.hostIf, "up"},
		{ipBin, "-n", s.ns, "addr", "add", s.nsIP.String() + "/30", "dev", s.nsIf},
		{ipBin, "-n", s.ns, "link", "set", s.nsIf, "up"},
		{ipBin, "-n", s.ns, "link", "set", "lo", "up"},
	}
	for _, st := range steps {
		if err := runCmd(st[0], st[1:]...); err != nil {
			return nil, err
		}
	}
	tbf := []string{"qdisc", "add", "dev", "", "root", "tbf", "rate", rate, "burst", strconv.FormatInt(s.burst, 10), "latency", "50ms"}
	tbf[3] = s.hostIf
	if err := runCmd(tcBin, tbf...); err != nil {
		return nil, fmt.Errorf("tbf refused: %w", err)
	}
	tbf[3] = s.nsIf
	if err := nsx(append([]string{tcBin}, tbf...)...); err != nil {
		return nil, fmt.Errorf("tbf refused: %w", err)
	}

	// The namespace is ours alone, so any port is free in it.
	addr, stop, err := startRedisIn([]string{ipBin, "netns", "exec", s.ns}, s.nsIP.String(), func() int { return 6379 })
	if err != nil {
		return nil, fmt.Errorf("redis-server in netns %s: %w", s.ns, err)
	}
	atExit.push(stop)
	s.redisAddr = addr

	if delay > 0 {
		p, err := startDelayProxy(s.redisAddr, delay)
		if err != nil {
			return nil, fmt.Errorf("delay proxy: %w", err)
		}
		atExit.push(p.close)
		s.proxyAddr = p.addr()
	}
	return s, nil
}

// delayProxy forwards TCP connections to a target and holds every chunk it
// reads back by a fixed delay before writing it on, in both directions.
// Chunks queue (at most proxyQueue per direction), so pipelined traffic is
// delayed, not serialised.
type delayProxy struct {
	l      net.Listener
	target string
	delay  time.Duration
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

const proxyQueue = 256

func startDelayProxy(target string, delay time.Duration) (*delayProxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &delayProxy{l: l, target: target, delay: delay, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *delayProxy) addr() string { return p.l.Addr().String() }

func (p *delayProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *delayProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.forget(c)
			u, err := net.DialTimeout("tcp", p.target, 5*time.Second)
			if err != nil {
				return
			}
			if !p.track(u) {
				return
			}
			defer p.forget(u)
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); p.pipe(u, c) }()
			go func() { defer wg.Done(); p.pipe(c, u) }()
			wg.Wait()
		}()
	}
}

func (p *delayProxy) forget(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

type chunk struct {
	due time.Time
	b   []byte
}

// pipe copies src to dst, each read delayed by p.delay.
func (p *delayProxy) pipe(dst, src net.Conn) {
	q := make(chan chunk, proxyQueue)
	go func() {
		defer close(q)
		buf := make([]byte, 64<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				q <- chunk{time.Now().Add(p.delay), append([]byte(nil), buf[:n]...)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		if d := time.Until(c.due); d > 0 {
			time.Sleep(d)
		}
		if _, err := dst.Write(c.b); err != nil {
			src.Close() // unblocks the reader
			for range q {
			}
			break
		}
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}

func (p *delayProxy) close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.l.Close()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
}
