package dictset

import (
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// joined returns how many callers have joined a fetch another began.
func (f *fetches) joins() int { return int(f.joined.Load()) }

// until yields until cond holds: the goroutines it waits for need no time
// of their own, only to be run.
func until(cond func() bool) {
	for !cond() {
		runtime.Gosched()
	}
}

// TestFetchesShared: callers that ask for an id while its call is under
// way wait for it and get its entry; fn runs once.
func TestFetchesShared(t *testing.T) {
	t.Parallel()
	const n = 50
	var f fetches
	release := make(chan struct{})
	var runs atomic.Int64
	want := &entry{id: 7}
	fn := func() *entry {
		runs.Add(1)
		<-release
		return want
	}
	got := make([]*entry, n)
	var wg sync.WaitGroup
	wg.Go(func() { got[0] = f.do(7, fn) })
	until(func() bool { return runs.Load() == 1 }) // under way
	for i := 1; i < n; i++ {
		wg.Go(func() { got[i] = f.do(7, fn) })
	}
	until(func() bool { return f.joins() == n-1 })
	close(release)
	wg.Wait()
	if runs.Load() != 1 {
		t.Errorf("fn ran %d times, want 1", runs.Load())
	}
	for i, e := range got {
		if e != want {
			t.Fatalf("caller %d got %v, not the call's entry", i, e)
		}
	}
	if e := f.do(7, func() *entry { return &entry{id: 7} }); e == want {
		t.Error("the call is still shared once done")
	}
}

// TestFetchesByID: calls for different ids do not wait for each other.
func TestFetchesByID(t *testing.T) {
	t.Parallel()
	var f fetches
	release := make(chan struct{})
	var wg sync.WaitGroup
	var started atomic.Bool
	wg.Go(func() { f.do(1, func() *entry { started.Store(true); <-release; return &entry{id: 1} }) })
	until(started.Load)
	if e := f.do(2, func() *entry { return &entry{id: 2} }); e.id != 2 {
		t.Errorf("id 2 got entry %d", e.id)
	}
	close(release)
	wg.Wait()
}

// TestFetchesNotKept: a call done is not remembered: the next caller runs
// fn again.
func TestFetchesNotKept(t *testing.T) {
	t.Parallel()
	var f fetches
	runs := 0
	for range 3 {
		f.do(5, func() *entry { runs++; return &entry{id: 5} })
	}
	if runs != 3 {
		t.Errorf("3 calls one after another ran fn %d times, want 3", runs)
	}
}

// TestFetchesPanic: a fn that panics fails every caller of its fetch, the
// one that ran it included, with an entry whose error says so, instead of
// crashing the process or leaving them hanging; the next call runs fn
// again.
func TestFetchesPanic(t *testing.T) {
	t.Parallel()
	var f fetches
	release := make(chan struct{})
	var wg sync.WaitGroup
	var started atomic.Bool
	var ran, waited *entry
	wg.Go(func() {
		ran = f.do(9, func() *entry { started.Store(true); <-release; panic("boom") })
	})
	until(started.Load)
	wg.Go(func() {
		waited = f.do(9, func() *entry { t.Error("a second fn ran while the first was under way"); return nil })
	})
	until(func() bool { return f.joins() == 1 })
	close(release)
	wg.Wait()
	for who, e := range map[string]*entry{"the caller that ran fn": ran, "the waiting caller": waited} {
		if e == nil || e.d != nil || e.err == nil || !strings.Contains(e.err.Error(), "panicked: boom") {
			t.Fatalf("%s got %+v, want an error saying the fetch panicked", who, e)
		}
	}
	if e := f.do(9, func() *entry { return &entry{id: 9} }); e.err != nil {
		t.Errorf("the next call: %v", e.err)
	}
}
