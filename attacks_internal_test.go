package packcache

import (
	"testing"
	"time"
)

// forget cools the hot slot before taking the group's mutex; a finish that
// holds the mutex at that moment puts the call (read before the write) back
// into the hot slot after the cool, and lookHot then serves it.
func TestAdv2ForgetVsFinishHotSlot(t *testing.T) {
	g := &group[ival, fnWork]{}
	g.window = int64(time.Second)
	now := time.Now().UnixNano()
	c, _ := g.acquire("k", now, false) // a read begun before the write

	// finish(...) has taken the mutex (it is about to hold c).
	g.mu.Lock()
	forgot := make(chan struct{})
	go func() { g.forget("k"); close(forgot) }() // the write's forget: cools, then waits for the mutex
	time.Sleep(50 * time.Millisecond)
	// the rest of finish, as it runs under the mutex:
	c.val, c.finished = 1, true
	if g.m["k"] == c {
		g.hold("k", c, time.Now().UnixNano())
	}
	g.mu.Unlock()
	<-forgot

	if hc, ok := g.lookHot("k", time.Now().UnixNano()); ok {
		t.Fatalf("after forget returned, lookHot still serves the call read before the write (val %d, detached %v)", hc.val, hc.detached.Load())
	}
}
