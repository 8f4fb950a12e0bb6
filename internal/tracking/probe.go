package tracking

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// A RefusedError is a server's refusal of CLIENT TRACKING: Addr is the
// server ("" for the master a Sentinel client reaches), Reply what it
// answered.
type RefusedError struct {
	Addr  string
	Reply string
}

func (e *RefusedError) Error() string {
	at := ""
	if e.Addr != "" {
		at = " at " + e.Addr
	}
	return fmt.Sprintf("the server%s answered %q", at, e.Reply)
}

// Probe asks each master rdb writes to whether it accepts CLIENT
// TRACKING, on a connection of its own that it closes, and returns a
// *RefusedError for the first that answers with an error (an unknown or
// renamed command, an ACL that forbids it). A server it cannot reach, or
// that fails before the question, is no refusal: Probe returns nil, and the
// tracker reports whatever keeps it from starting.
func Probe(ctx context.Context, rdb redis.UniversalClient) error {
	switch c := rdb.(type) {
	case *redis.Client:
		addr := c.Options().Addr
		if addr == "FailoverClient" { // go-redis's name for a Sentinel client's
			addr = ""
		}
		return probe(ctx, addr, c.Options())
	case *redis.ClusterClient:
		var mu sync.Mutex
		var first error
		_ = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			if err := probe(ctx, n.Options().Addr, n.Options()); err != nil {
				mu.Lock()
				first = cmpOr(first, err)
				mu.Unlock()
			}
			return nil
		})
		return first
	}
	return nil
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func probe(ctx context.Context, addr string, opt *redis.Options) error {
	o := *opt
	o.Protocol = 2
	o.ContextTimeoutEnabled = true
	// One try, and a pool larger than the one dial that can fail: go-redis
	// starts a goroutine redialling, which outlives Close by up to a
	// second, once its pool's size in dials have failed.
	o.MaxRetries = -1
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns = 2, 0, 1
	Own(&o)
	c := redis.NewClient(&o)
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		return nil // not reached, or refused before the question
	}
	cn := c.Conn()
	defer cn.Close()
	refused := func(err error) error {
		var rerr redis.Error
		if errors.As(err, &rerr) && err != redis.Nil {
			return &RefusedError{Addr: addr, Reply: strings.TrimSpace(err.Error())}
		}
		return nil
	}
	id, err := cn.ClientID(ctx).Result()
	if err != nil {
		return refused(err)
	}
	err = cn.Do(ctx, "CLIENT", "TRACKING", "on", "REDIRECT", id, "BCAST", "PREFIX", "packcache-probe:").Err()
	return refused(err)
}
