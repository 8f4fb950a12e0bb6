package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// respError is an error reply (-ERR ...) from the server. The connection is
// still usable after one.
type respError string

func (e respError) Error() string { return string(e) }

// adminConn is a minimal RESP2 connection used for the helper's own
// commands (readiness PING, INFO, CONFIG RESETSTAT, FLUSHALL, CLUSTER ...).
// It is deliberately independent of go-redis and of any testing.TB: it is
// dialed lazily, reconnects after a failure and bounds every call with a
// deadline, so it survives Stop/Restart and cannot hang on a paused server.
type adminConn struct {
	addr string

	mu   sync.Mutex
	conn net.Conn
	r    *bufio.Reader
}

// do sends one command and returns its reply: string (simple or bulk),
// int64, []any, nil, or a respError as the error.
func (a *adminConn) do(timeout time.Duration, args ...string) (any, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	reused := a.conn != nil
	v, err := a.doLocked(timeout, args)
	var re respError
	if err != nil && reused && !errors.As(err, &re) && !isTimeout(err) {
		// The cached connection may be stale (server restarted): retry
		// once on a fresh one.
		v, err = a.doLocked(timeout, args)
	}
	return v, err
}

func (a *adminConn) doLocked(timeout time.Duration, args []string) (any, error) {
	deadline := time.Now().Add(timeout)
	if a.conn == nil {
		c, err := net.DialTimeout("tcp", a.addr, timeout)
		if err != nil {
			return nil, err
		}
		a.conn, a.r = c, bufio.NewReader(c)
	}
	if err := a.conn.SetDeadline(deadline); err != nil {
		a.closeLocked()
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, s := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(s), s)
	}
	if _, err := io.WriteString(a.conn, b.String()); err != nil {
		a.closeLocked()
		return nil, err
	}
	v, err := readReply(a.r)
	var re respError
	if err != nil && !errors.As(err, &re) {
		a.closeLocked()
	}
	return v, err
}

func (a *adminConn) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closeLocked()
}

func (a *adminConn) closeLocked() {
	if a.conn != nil {
		_ = a.conn.Close()
		a.conn, a.r = nil, nil
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("malformed RESP line %q", line)
	}
	line = line[:len(line)-2]
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return nil, respError(line[1:])
	case ':':
		return strconv.ParseInt(line[1:], 10, 64)
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return nil, fmt.Errorf("malformed bulk length %q", line)
		}
		if n < 0 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return nil, fmt.Errorf("malformed array length %q", line)
		}
		if n < 0 {
			return nil, nil
		}
		arr := make([]any, n)
		for i := range arr {
			v, err := readReply(r)
			var re respError
			switch {
			case errors.As(err, &re):
				arr[i] = re
			case err != nil:
				return nil, err
			default:
				arr[i] = v
			}
		}
		return arr, nil
	default:
		return nil, fmt.Errorf("unexpected RESP2 reply %q", line)
	}
}

// doString runs a command whose reply is a (simple or bulk) string.
func (a *adminConn) doString(timeout time.Duration, args ...string) (string, error) {
	v, err := a.do(timeout, args...)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s: unexpected reply %#v", args[0], v)
	}
	return s, nil
}

// parseInfo parses "key:value" lines of INFO / CLUSTER INFO output.
func parseInfo(s string) map[string]string {
	m := make(map[string]string)
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m
}
