// Package netcount counts the bytes a server writes to its connections:
// the bytes on the wire of its responses, headers and framing included,
// for the HTTP benchmarks of packbench and examples/broadcast.
package netcount

import (
	"net"
	"sync/atomic"
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
