// Package httpbench holds what the HTTP benchmarks of packbench and
// examples/broadcast share: a listener that counts the bytes a server
// writes (its responses on the wire, headers and framing included), a
// fetch that reads a body as sent, and the handler Cache.Serve is measured
// against.
package httpbench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"

	"github.com/packcache/packcache"
)

// A Listener counts the bytes written to the connections it accepts.
type Listener struct {
	net.Listener
	written atomic.Int64
}

// Wrap returns a Listener counting what is written to l's connections.
func Wrap(l net.Listener) *Listener { return &Listener{Listener: l} }

// Written returns the bytes written so far to every connection accepted.
func (l *Listener) Written() int64 { return l.written.Load() }

// Accept accepts a connection of the wrapped listener, counted.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c, written: &l.written}, nil
}

type conn struct {
	net.Conn
	written *atomic.Int64
}

func (c *conn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

// Fetch GETs url with hc, sending accept as Accept-Encoding (none if
// empty), and copies the body, as sent, to body: it returns the bytes
// copied and the Content-Encoding. A status other than 200 is an error.
func Fetch(ctx context.Context, hc *http.Client, url, accept string, body io.Writer) (n int64, coding string, err error) {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return 0, "", err
	}
	if accept != "" {
		req.Header.Set("Accept-Encoding", accept)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	n, err = io.Copy(body, resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: status %d", url, resp.StatusCode)
	}
	return n, resp.Header.Get("Content-Encoding"), err
}

// GetAndEncode is the handler an application writes without Serve: Get
// the value of the request's key, then json.NewEncoder(w).Encode(v),
// whatever the client accepts.
func GetAndEncode[T any](c *packcache.Cache[T], key func(*http.Request) string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, err := c.Get(r.Context(), key(r))
		if err != nil {
			http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v)
	})
}
