package dictset

import (
	"fmt"
	"sync"

	"github.com/packcache/packcache/codec"
)

// fetches coalesces a Set's fetches: one under way per id, whose result
// every caller that asks for the id meanwhile gets. Nothing is kept once
// a fetch is done: what to remember is the Set's to decide (it adds an
// entry before the fetch ends, and looks there before asking).
//
// It is the one piece of the Set that coalesces, kept apart so that the
// cache's one coalescing type can take its place.
type fetches struct {
	mu sync.Mutex
	m  map[uint32]*call
}

// A call is a fetch under way, and its entry once done.
type call struct {
	done chan struct{}
	dups int // callers that wait for it, beside the one that runs it
	e    *entry
}

// do runs fn for id and returns its entry, unless a call for id is under
// way: then it waits for that call and returns the entry it returns. A
// caller that waits cannot stop waiting; fn must return in bounded time.
// If fn panics, the panic goes on in the caller that ran it, and the
// callers that waited get an entry whose error says so.
func (f *fetches) do(id uint32, fn func() *entry) *entry {
	f.mu.Lock()
	if c, ok := f.m[id]; ok {
		c.dups++
		f.mu.Unlock()
		<-c.done
		return c.e
	}
	c := &call{done: make(chan struct{})}
	if f.m == nil {
		f.m = map[uint32]*call{}
	}
	f.m[id] = c
	f.mu.Unlock()

	defer func() {
		if c.e == nil { // fn panicked: the waiters must neither hang nor find nothing
			c.e = &entry{id: id, err: fmt.Errorf("fetching zstd dictionary %s: the fetch panicked", codec.DictionaryKey(id))}
		}
		f.mu.Lock()
		delete(f.m, id)
		f.mu.Unlock()
		close(c.done)
	}()
	c.e = fn()
	return c.e
}
