package dictset

import (
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// waiting returns how many callers wait for the call for id under way, or
// -1 if none is.
func (f *fetches) waiting(id uint32) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.m[id]; ok {
		return c.dups
	}
	return -1
}

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
	until(func() bool { return f.waiting(7) == 0 })
	for i := 1; i < n; i++ {
		wg.Go(func() { got[i] = f.do(7, fn) })
	}
	until(func() bool { return f.waiting(7) == n-1 })
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
	if f.waiting(7) != -1 || len(f.m) != 0 {
		t.Error("the call is still listed once done")
	}
}

// TestFetchesByID: calls for different ids do not wait for each other.
func TestFetchesByID(t *testing.T) {
	t.Parallel()
	var f fetches
	release := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { f.do(1, func() *entry { <-release; return &entry{id: 1} }) })
	until(func() bool { return f.waiting(1) == 0 })
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

// TestFetchesPanic: a fn that panics panics in the caller that ran it;
// the callers waiting for it get an entry whose error says so instead of
// hanging, and the next call runs fn again.
func TestFetchesPanic(t *testing.T) {
	t.Parallel()
	var f fetches
	release := make(chan struct{})
	var wg sync.WaitGroup
	var recovered any
	wg.Go(func() {
		defer func() { recovered = recover() }()
		f.do(9, func() *entry { <-release; panic("boom") })
	})
	until(func() bool { return f.waiting(9) == 0 })
	var waited *entry
	wg.Go(func() {
		waited = f.do(9, func() *entry { t.Error("a second fn ran while the first was under way"); return nil })
	})
	until(func() bool { return f.waiting(9) == 1 })
	close(release)
	wg.Wait()
	if recovered != "boom" {
		t.Errorf("the caller that ran fn recovered %v, want its panic", recovered)
	}
	if waited == nil || waited.d != nil || waited.err == nil || !strings.Contains(waited.err.Error(), "panicked") {
		t.Fatalf("the waiting caller got %+v, want an error saying the fetch panicked", waited)
	}
	if e := f.do(9, func() *entry { return &entry{id: 9} }); e.err != nil {
		t.Errorf("the next call: %v", e.err)
	}
}
