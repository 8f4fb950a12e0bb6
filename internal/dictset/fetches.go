package dictset

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/singleflight"
)

// fetches coalesces a Set's fetches, with the cache's one coalescing type
// (internal/singleflight): one under way per id, whose result every caller
// that asks for the id meanwhile gets. Nothing is kept once a fetch is
// done (a Group with no share window): what to remember is the Set's to
// decide (it adds an entry before the fetch ends, and looks there before
// asking).
type fetches struct {
	g      singleflight.Group[*entry, fetchWork]
	joined atomic.Int64 // callers that shared a fetch another began, for tests
}

// A fetchWork is one fetch, as a Group's work.
type fetchWork struct {
	f  *fetches
	fn func() *entry
}

func (w fetchWork) Run(context.Context, *singleflight.Call[*entry]) (*entry, error) {
	return w.fn(), nil
}

func (w fetchWork) Joining(context.Context, string, bool) error {
	w.f.joined.Add(1)
	return nil
}

// ShareUntil keeps no finished fetch: see fetches.
func (*entry) ShareUntil(error) int64 { return 0 }

// do runs fn for id on the caller's goroutine and returns its entry,
// unless a call for id is under way: then it waits for that call and
// returns the entry it returns. A caller that waits cannot stop waiting;
// fn must return in bounded time. If fn panics, every caller, the one
// that ran it included, gets an entry whose error says so; if it calls
// runtime.Goexit, the callers that wait for it do.
func (f *fetches) do(id uint32, fn func() *entry) *entry {
	e, err, _ := f.g.Do(context.Background(), strconv.FormatUint(uint64(id), 16), fetchWork{f, fn})
	if err != nil {
		return &entry{id: id, err: fmt.Errorf("fetching zstd dictionary %s: the fetch failed: %w", codec.DictionaryKey(id), err)}
	}
	return e
}
