package packcacheotel

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// redisErrorType names the kind of a Redis failure for error.type, from a
// small vocabulary, so that the metric's series stay few whatever the
// messages say. The checks that cost no allocation come first.
func redisErrorType(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		// The cache's Redis budget ran out (the end of a caller's own
		// deadline is not reported as a Redis failure).
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, redis.ErrPoolTimeout):
		return "pool_timeout"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "network"
	}
	if code, ok := replyOf(err); ok {
		return code
	}
	if timeout, ok := netErrorOf(err); ok {
		if timeout {
			return "timeout"
		}
		return "network"
	}
	return "_OTHER"
}

// replyOf returns the code of the Redis error reply in err's chain.
func replyOf(err error) (string, bool) {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return "", false
	}
	return replyCode(reply.Error()), true
}

// netErrorOf reports whether err's chain holds a net.Error, and whether it
// is a timeout.
func netErrorOf(err error) (timeout, ok bool) {
	var nerr net.Error
	if !errors.As(err, &nerr) {
		return false, false
	}
	return nerr.Timeout(), true
}

// replyCode returns the code that begins a Redis error reply ("LOADING
// Redis is loading the dataset in memory" gives "LOADING"), or "ERR" for a
// reply that begins with none: by convention a code is one upper-case
// word.
func replyCode(msg string) string {
	n := 0
	for n < len(msg) && n <= maxCode && 'A' <= msg[n] && msg[n] <= 'Z' {
		n++
	}
	if n == 0 || n > maxCode || (n < len(msg) && msg[n] != ' ') {
		return "ERR"
	}
	return msg[:n]
}

// maxCode bounds the length of a reply code. Redis's are short words
// (LOADING, CLUSTERDOWN, WRONGTYPE); anything longer is not one.
const maxCode = 20
