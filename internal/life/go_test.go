package life

import (
	"bytes"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// goroutineID is the calling goroutine's number, from its stack's header.
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	return string(bytes.Fields(buf)[1])
}

// TestGoReusesParked: work given to Go while an earlier piece's goroutine
// is parked runs on that goroutine, and nothing more is registered.
func TestGoReusesParked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l Life
		l.Init()
		ids := make(chan string, 2)
		l.Go(func() { ids <- goroutineID() })
		first := <-ids
		synctest.Wait() // parked
		if n := l.parked.Load(); n != 1 {
			t.Fatalf("%d goroutines parked after one piece of work, want 1", n)
		}
		l.Go(func() { ids <- goroutineID() })
		if second := <-ids; second != first {
			t.Fatalf("the second piece ran on goroutine %s, not on the parked %s", second, first)
		}
		if n := l.Running(); n != 1 {
			t.Fatalf("Running = %d with one goroutine, want 1", n)
		}
		<-l.Close()
	})
}

// TestGoParkedEndsAfterParkFor: a parked goroutine ends parkFor after its
// work, with no Close.
func TestGoParkedEndsAfterParkFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l Life
		l.Init()
		l.Go(func() {})
		synctest.Wait()
		if n := l.Running(); n != 1 {
			t.Fatalf("Running = %d while parked, want 1", n)
		}
		time.Sleep(parkFor - time.Nanosecond)
		synctest.Wait()
		if n := l.Running(); n != 1 {
			t.Fatalf("Running = %d before parkFor passed, want 1", n)
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if n := l.Running(); n != 0 {
			t.Fatalf("Running = %d parkFor after the work, want 0", n)
		}
	})
}

// TestCloseEndsParked: Close's idle channel closes at once when only
// parked goroutines are left, without waiting out parkFor.
func TestCloseEndsParked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l Life
		l.Init()
		l.Go(func() {})
		synctest.Wait()
		start := time.Now()
		<-l.Close()
		if d := time.Since(start); d != 0 {
			t.Fatalf("Close waited %v for a parked goroutine", d)
		}
		if l.TryGo(func() { t.Error("TryGo ran work after Close") }) {
			t.Fatal("TryGo accepted work after Close began")
		}
	})
}

// TestGoAfterClose: Go, unlike TryGo, runs work after Close has begun
// (a goroutine started by a call under way), and Close waits for it.
func TestGoAfterClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l Life
		l.Init()
		if !l.Enter() {
			t.Fatal("Enter refused")
		}
		idle := l.Close()
		release := make(chan struct{})
		l.Go(func() { <-release })
		l.Exit()
		synctest.Wait()
		select {
		case <-idle:
			t.Fatal("idle while Go's work runs")
		default:
		}
		close(release)
		<-idle
	})
}

// TestGoParksAtMostMaxParked: after more pieces of work at once than
// maxParked, maxParked goroutines park and the rest end.
func TestGoParksAtMostMaxParked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l Life
		l.Init()
		var wg sync.WaitGroup
		release := make(chan struct{})
		for range maxParked + 10 {
			wg.Add(1)
			l.Go(func() { wg.Done(); <-release })
		}
		wg.Wait()
		if n := l.Running(); n != maxParked+10 {
			t.Fatalf("Running = %d, want %d", n, maxParked+10)
		}
		close(release)
		synctest.Wait()
		if n, p := l.Running(), l.parked.Load(); n != maxParked || p != maxParked {
			t.Fatalf("after the work: Running = %d, parked = %d, want %d each", n, p, maxParked)
		}
		<-l.Close()
	})
}

// TestGoGoexit: work that calls runtime.Goexit ends its goroutine, which
// is no longer counted.
func TestGoGoexit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l Life
		l.Init()
		l.Go(runtime.Goexit)
		synctest.Wait()
		if n, p := l.Running(), l.parked.Load(); n != 0 || p != 0 {
			t.Fatalf("after Goexit: Running = %d, parked = %d, want 0", n, p)
		}
	})
}
