package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/packcache/packcache"
)

// TestShutdownInOrder: the server first, then the cache, then the client:
// every request accepted is served, and Close has nothing to report.
func TestShutdownInOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	rep, err := run(ctx, config{For: 300 * time.Millisecond, Clients: 16}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Served == 0 {
		t.Fatal("no request served")
	}
	if rep.Failed != 0 || rep.Closed != 0 || rep.Lost != 0 {
		t.Errorf("%d requests failed, %d with ErrClosed, %d updates not invalidated; want none", rep.Failed, rep.Closed, rep.Lost)
	}
	if rep.CloseErr != nil {
		t.Errorf("cache.Close: %v", rep.CloseErr)
	}
}

// TestCacheClosedFirst shows what the README says of the wrong order:
// requests that reach the cache after Close fail with ErrClosed.
func TestCacheClosedFirst(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	rep, err := run(ctx, config{For: 300 * time.Millisecond, Clients: 16, CacheFirst: true}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Closed == 0 {
		t.Errorf("cache closed first: no request failed with ErrClosed (%d served, %d failed)", rep.Served, rep.Failed)
	}
}

// TestCloseReportsPending: with Redis gone, updates get ErrPending, and
// cache.Close says how many invalidations it could not apply.
func TestCloseReportsPending(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	rep, err := run(ctx, config{For: 200 * time.Millisecond, Clients: 8, RedisGone: true}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Pending < 5 {
		t.Fatalf("%d updates got ErrPending with Redis gone, want at least the 5 sent then (%d served, %d failed)", rep.Pending, rep.Served, rep.Failed)
	}
	if !errors.Is(rep.CloseErr, packcache.ErrRedis) || !strings.Contains(fmt.Sprint(rep.CloseErr), "pending invalidations not applied") {
		t.Errorf("cache.Close = %v, want an ErrRedis naming the pending invalidations", rep.CloseErr)
	}
	if rep.Failed != 0 {
		t.Errorf("%d requests failed: reads should be answered by the loader, updates left pending", rep.Failed)
	}
}
