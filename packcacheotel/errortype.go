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
// messages say.
func redisErrorType(err error) string {
	var reply redis.Error
	var nerr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		// The cache's Redis budget ran out (the caller's own deadline is
		// not a failure of Redis's and is not reported).
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, redis.ErrPoolTimeout):
		return "pool_timeout"
	case errors.As(err, &reply):
		return replyCode(reply.Error())
	case errors.As(err, &nerr):
		if nerr.Timeout() {
			return "timeout"
		}
		return "network"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "network"
	}
	return "_OTHER"
}

// replyCode returns the code that begins a Redis error reply ("LOADING
// Redis is loading the dataset in memory" gives "LOADING"), or "ERR" for a
// reply that begins with no code: by convention a code is one upper-case
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

// maxCode bounds the length of a reply code; Redis's longest is
// CROSSSLOT, CLUSTERDOWN, MISCONF and the like.
const maxCode = 20
