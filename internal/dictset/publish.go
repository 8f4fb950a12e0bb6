package dictset

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
)

// A Writer is a dictionary a policy writes with, and its publication in
// Redis. Set.Writer returns one; it is safe for concurrent use.
type Writer struct {
	d         *codec.Dictionary
	key       string       // codec.DictionaryKey of d's id
	mu        sync.Mutex   // one publication at a time
	published atomic.Int64 // unix nanoseconds of the last publication that succeeded; 0: none; lost: due again
	failed    atomic.Int64 // unix nanoseconds of the last that Redis failed
	checked   atomic.Int64 // unix nanoseconds of the last check that Redis holds it (checkEvery)
}

// lost is published's value once a write found Redis without the
// dictionary: a publication long past, so that the next write publishes
// it again.
const lost = 1

// Key is the key under which w's dictionary is published,
// codec.DictionaryKey of its id: the key a write with it may check
// (see Lost).
func (w *Writer) Key() string { return w.key }

// publishScript stores the dictionary ARGV[1] under KEYS[1] without
// expiry unless the key already holds exactly it (a SET NX that also puts
// right a key holding anything else, or given an expiry). It returns 1 if
// it wrote.
var publishScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PERSIST', KEYS[1])
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
return 1`)

// Published reports whether a write may use w's dictionary: whether Redis
// holds it, as far as this process knows. The first write publishes it
// through r (the writes that come meanwhile wait for it), and a write
// publishes it again once a minute, after Lost, and when a check that
// Redis holds it, made by one write a second (checkEvery), finds it
// missing (the others go on). A publication that
// failed is returned as err, for the caller to report; if the dictionary
// was never published, Published reports false, the value is to be stored
// without the dictionary, and so are the writes of the next second when
// Redis failed (r.Failed).
func (w *Writer) Published(ctx context.Context, r Redis) (ok bool, err error) {
	last := w.published.Load()
	now := time.Now().UnixNano()
	switch {
	case last != 0 && now-last < int64(republishEvery):
		if now-w.checked.Load() < int64(checkEvery) || w.held(r, now) || !w.published.CompareAndSwap(last, lost) {
			return true, nil
		}
		return w.Published(ctx, r) // lost: published again now
	case now-w.failed.Load() < int64(retryAfter):
		return last != 0, nil
	case last != 0:
		if !w.mu.TryLock() {
			return true, nil // another write publishes it again
		}
	default:
		w.mu.Lock()
	}
	defer w.mu.Unlock()
	if w.published.Load() != last || time.Now().UnixNano()-w.failed.Load() < int64(retryAfter) {
		// Another write published it, or failed to, while this one
		// waited.
		return w.published.Load() != 0, nil
	}
	dk := w.key
	err = r.RunScript(ctx, publishScript, dk, w.d.Bytes())
	if err == nil {
		now := time.Now().UnixNano()
		w.checked.Store(now) // it holds it now
		w.published.Store(now)
		return true, nil
	}
	if r.Failed(err) {
		w.failed.Store(time.Now().UnixNano())
	}
	what := "so stored without it"
	if last != 0 {
		what = "again"
	}
	return last != 0, fmt.Errorf("publishing zstd dictionary %s, %s: %w", dk, what, err)
}

// held reports whether Redis holds w's dictionary, asking it at most once
// per checkEvery, by one write at a time (the others go on): true unless
// Redis said it does not. A check that failed says nothing, and the
// minute's publication still comes.
func (w *Writer) held(r Redis, now int64) bool {
	if !w.mu.TryLock() {
		return true
	}
	defer w.mu.Unlock()
	if last := w.checked.Load(); now-last < int64(checkEvery) || !w.checked.CompareAndSwap(last, now) {
		return true
	}
	b, err := r.GetRange(w.key, 0, 0)
	return err != nil || len(b) > 0
}

// Lost tells w that a write found Redis without its dictionary (evicted,
// deleted, or lost in a restart) while values written with it remain:
// it publishes it again through r at once, unless another write is
// publishing it or Redis failed a publication within the second; then
// the next write through Published does. Writes go on using the
// dictionary meanwhile: readers that hold it read their values, and
// readers that lack it find it once it is back. An error is the
// publication's, for the caller to report. Before the first publication
// Lost does nothing: no value was written with the dictionary.
func (w *Writer) Lost(ctx context.Context, r Redis) error {
	for {
		last := w.published.Load()
		if last == 0 {
			return nil
		}
		if last == lost || w.published.CompareAndSwap(last, lost) {
			break
		}
	}
	_, err := w.Published(ctx, r)
	return err
}
