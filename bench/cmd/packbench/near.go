package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gocache "github.com/go-redis/cache/v9"
	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
)

// ---------------------------------------------------------------- near

// The near suite measures packcache's near cache (WithLocalCache) on one
// hot key: Get throughput against the share window, plain reads and
// go-redis/cache's local TinyLFU; how soon another process's write is
// seen; and a surge.

// nearLocal is the near cache the suite measures.
var nearLocal = packcache.LocalCache{MaxBytes: 64 << 20, TTL: time.Minute}

// The subjects, by name.
const (
	nDef     = "packcache default"
	nNoWin   = "packcache WithShareWindow(Off)"
	nNear    = "packcache WithLocalCache"
	nNearNoW = "packcache WithLocalCache + WithShareWindow(Off)"
	nGCLocal = "go-redis/cache + TinyLFU"
	nGCOnce  = "go-redis/cache Once"
	nGCLOnce = "go-redis/cache + TinyLFU Once"
)

// nearWait bounds the wait for a near cache to serve: it serves only once
// its invalidation stream has proved itself (a heartbeat's reply, some
// 10-50 ms after the cache starts) and keeps only values read from Redis.
const nearWait = 5 * time.Second

// awaitNear calls get until the near cache answers one (hits grows), and
// fails if it does not within nearWait.
func awaitNear(get func() error, hits func() uint64) error {
	deadline := time.Now().Add(nearWait)
	for {
		before := hits()
		if err := get(); err != nil {
			return err
		}
		if hits() > before {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the near cache did not serve within %v: it needs CLIENT TRACKING (Redis 6.0 or later)", nearWait)
		}
		time.Sleep(time.Millisecond)
	}
}

// nearSurgeSubject is packcacheSubject with the near cache: a warm key is
// in the near cache, not only in Redis, before the surge is released.
func nearSurgeSubject(e *env, name string, ch Channel, opts ...packcache.Option) (*surgeSubject, error) {
	s, err := packcacheSubject(e, name, ch, append([]packcache.Option{packcache.WithLocalCache(nearLocal)}, opts...)...)
	if err != nil {
		return nil, err
	}
	store := s.prepare
	s.prepare = func(ctx context.Context, key string, warm bool) error {
		if err := store(ctx, key, warm); err != nil || !warm {
			return err
		}
		return awaitNear(func() error { return s.get(ctx, key) }, s.nearHits)
	}
	return s, nil
}

// surgePair makes the two packcache subjects of the warm surges that the
// surge and near suites both judge (surgeTargets): packcache default, and
// with the near cache. closeBoth closes them.
func surgePair(e *env, ch Channel) (def, near *surgeSubject, closeBoth func(), err error) {
	if def, err = packcacheSubject(e, nDef, ch); err != nil {
		return nil, nil, nil, err
	}
	if near, err = nearSurgeSubject(e, nNear, ch); err != nil {
		def.close()
		return nil, nil, nil, err
	}
	return def, near, func() { def.close(); near.close() }, nil
}

// A getSubject is one way of reading a Channel, for throughput and for
// the latency of another process's writes.
type getSubject struct {
	name  string
	set   func(ctx context.Context, key string, v Channel) error
	get   func(ctx context.Context, key string) (Channel, error)
	del   func(ctx context.Context, key string) error
	hits  func() uint64 // near hits so far; nil for go-redis/cache
	near  bool          // it has a near cache
	close func()

	// refill, if set, waits after a write for the near cache to serve
	// what Redis holds (rueidis: awaitRefill); awaitNear otherwise.
	refill func(get func() error) error
}

func packcacheGetSubject(rdb *redis.Client, name string, opts ...packcache.Option) (*getSubject, error) {
	c, err := packcache.New[Channel](rdb, opts...)
	if err != nil {
		return nil, err
	}
	return &getSubject{
		name: name,
		set:  func(ctx context.Context, key string, v Channel) error { return c.Set(ctx, key, v) },
		get:  c.Get,
		del:  func(ctx context.Context, key string) error { return c.Delete(ctx, key) },
		hits: func() uint64 { return c.Stats().NearHits },
		close: func() {
			c.Close()
		},
	}, nil
}

func goCacheGetSubject(e *env, name string, local bool, ch Channel) *getSubject {
	p := goCachePeer(e, name, local, ch)
	return &getSubject{name: name, set: p.set, get: p.get, del: p.del, close: p.close}
}

// rateSample is one run of Gets for a fixed time.
type rateSample struct {
	ops       int64
	took      time.Duration
	redisGets int64
	mallocs   uint64
	nearHits  uint64
}

// getRate runs workers goroutines that Get key through s until d has
// passed, checking each value.
func (e *env) getRate(ctx context.Context, s *getSubject, key string, want, workers int, d time.Duration) (rateSample, error) {
	var r rateSample
	runtime.GC()
	before, err := e.cmdCalls(ctx)
	if err != nil {
		return r, err
	}
	var h0 uint64
	if s.hits != nil {
		h0 = s.hits()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m0 := ms.Mallocs

	var stop atomic.Bool
	var ops atomic.Int64
	var firstErr atomic.Pointer[error]
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			<-start
			var n int64
			for !stop.Load() {
				v, err := s.get(ctx, key)
				if err == nil && len(v.Messages) != want {
					err = errors.New("wrong value")
				}
				if err != nil {
					// A variable of its own: taking err's address would
					// move it to the heap, an allocation per Get.
					first := err
					firstErr.CompareAndSwap(nil, &first)
					break
				}
				n++
			}
			ops.Add(n)
		})
	}
	t0 := time.Now()
	close(start)
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	r.took = time.Since(t0)
	r.ops = ops.Load()

	runtime.ReadMemStats(&ms)
	r.mallocs = ms.Mallocs - m0
	if s.hits != nil {
		r.nearHits = s.hits() - h0
	}
	after, err := e.cmdCalls(ctx)
	if err != nil {
		return r, err
	}
	r.redisGets = after["get"] - before["get"]
	if p := firstErr.Load(); p != nil {
		return r, fmt.Errorf("%s: %w", s.name, *p)
	}
	if r.ops == 0 {
		return r, fmt.Errorf("%s: no Get finished in %v", s.name, d)
	}
	return r, nil
}

func (r rateSample) rate() float64 { return float64(r.ops) / r.took.Seconds() }

// nearResults holds what the near suite measured, for its targets.
type nearResults struct {
	rate   map[string]map[int]spread // subject -> goroutines -> Gets/s
	lat    map[string]*latResult
	surge  map[string]surgeRow // subject -> its warm surges, worstRuns
	maxLag time.Duration
}

func (e *env) suiteNear(ctx context.Context) error {
	size := 128 << 10
	rateFor := 500 * time.Millisecond
	if e.cfg.quick {
		size = 16 << 10
		rateFor = 30 * time.Millisecond
	}
	ch := makeChannel(7, size)
	raw, _ := json.Marshal(ch)
	res := &nearResults{
		rate:   map[string]map[int]spread{},
		lat:    map[string]*latResult{},
		maxLag: (500 * time.Millisecond),
	}
	if nearLocal.MaxLag > 0 {
		res.maxLag = nearLocal.MaxLag
	}
	e.header("near", fmt.Sprintf("The near cache: packcache.Cache[Channel] with WithLocalCache(LocalCache{MaxBytes: %d << 20, TTL: %v}) keeps decoded values in process, kept fresh by Redis CLIENT TRACKING invalidations; one hot %d-byte channel. "+
		"Against packcache default (the share window: a read of Redis at most every %v, shared), packcache WithShareWindow(Off) (a read of Redis and a decode per Get, unless a read is in flight), and go-redis/cache v9 with its local TinyLFU (cache.NewTinyLFU(1000, time.Minute): it keeps the serialized bytes and decodes them on every Get). "+
		"And rueidis (%s) with client-side caching, kept fresh by CLIENT TRACKING invalidations too (RESP3, OPTIN; client-side TTL %v): %s (a DoCache of GET) and %s (rueidisaside's Get over DoCache); they store what packcache stores and keep the reply, those bytes, shared by every Get, which decodes them (zstd, packcache.JSON), where packcache's near cache keeps the decoded value and hands it out.",
		nearLocal.MaxBytes>>20, nearLocal.TTL, len(raw), (10*time.Millisecond), rueidisVersion(), rueidisTTL, nRueidis, nAside))
	if err := e.nearRate(ctx, ch, rateFor, res); err != nil {
		return err
	}
	if err := e.nearLatency(ctx, ch, res); err != nil {
		return err
	}
	if err := e.nearSurge(ctx, ch, res); err != nil {
		return err
	}
	e.nearTargets(res)
	return nil
}

// nearRate measures Gets per second of one hot key.
func (e *env) nearRate(ctx context.Context, ch Channel, d time.Duration, res *nearResults) error {
	var subjects []*getSubject
	defer func() {
		for _, s := range subjects {
			s.close()
		}
	}()
	for _, mk := range []struct {
		name string
		opts []packcache.Option
	}{
		{nDef, nil},
		{nNoWin, []packcache.Option{packcache.WithShareWindow(packcache.Off)}},
		{nNear, []packcache.Option{packcache.WithLocalCache(nearLocal)}},
	} {
		s, err := packcacheGetSubject(e.rdb, mk.name, mk.opts...)
		if err != nil {
			return err
		}
		s.near = mk.name == nNear
		subjects = append(subjects, s)
	}
	subjects = append(subjects, goCacheGetSubject(e, nGCLocal, true, ch))
	rs, err := rueidisGetSubjects(e, ch)
	if err != nil {
		return err
	}
	subjects = append(subjects, rs...)
	for _, s := range subjects {
		key := e.key("near", "rate", s.name)
		if err := s.set(ctx, key, ch); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		if s.near {
			get := func() error { _, err := s.get(ctx, key); return err }
			var err error
			if s.refill != nil {
				err = s.refill(get)
			} else {
				err = awaitNear(get, s.hits)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
		}
	}

	workers := []int{1, 16}
	samples := map[string]map[int][]rateSample{}
	for _, s := range subjects {
		samples[s.name] = map[int][]rateSample{}
	}
	// Reps are interleaved across subjects, so that a noisy moment of a
	// shared machine falls on all of them alike.
	for range e.cfg.reps {
		for _, w := range workers {
			for _, s := range subjects {
				r, err := e.getRate(ctx, s, e.key("near", "rate", s.name), len(ch.Messages), w, d)
				if err != nil {
					return err
				}
				samples[s.name][w] = append(samples[s.name][w], r)
			}
		}
	}
	for _, s := range subjects {
		if err := s.del(ctx, e.key("near", "rate", s.name)); err != nil {
			return err
		}
	}

	fmt.Fprintf(e.out, "### near: Gets per second of one hot key\n\nEach subject Gets the key in a loop for %v, on 1 goroutine and on 16; Get/s: median (min–max) of %d runs, the runs of all subjects interleaved. Redis GETs per Get: INFO commandstats delta. Near hits: Gets answered by the near cache (Stats().NearHits; for rueidis, DoCache answers from its client-side cache, RedisResult.IsCacheHit). Allocs per Get: runtime.MemStats.Mallocs over all runs (whole process). Ratio: median Get/s over go-redis/cache + TinyLFU's in the same run.\n\n", d, e.cfg.reps)
	fmt.Fprintln(e.out, "| subject | goroutines | Get/s | µs per Get | Redis GETs per Get | near hits | allocs per Get | ratio to go-redis/cache + TinyLFU |")
	fmt.Fprintln(e.out, "|---|--:|--:|--:|--:|--:|--:|--:|")
	for _, w := range workers {
		for _, s := range subjects {
			rs := samples[s.name][w]
			var rates []float64
			var ops, gets int64
			var mallocs, hits uint64
			for _, r := range rs {
				rates = append(rates, r.rate())
				ops += r.ops
				gets += r.redisGets
				mallocs += r.mallocs
				hits += r.nearHits
			}
			sp := spreadOf(rates)
			if res.rate[s.name] == nil {
				res.rate[s.name] = map[int]spread{}
			}
			res.rate[s.name][w] = sp
			near := "–"
			if s.hits != nil {
				near = fmt.Sprintf("%.1f%%", 100*float64(hits)/float64(ops))
			}
			fmt.Fprintf(e.out, "| %s | %d | %s | %s | %.3f | %s | %.1f | %s |\n", s.name, w, rateSpread(sp), fmtUs(1e6/sp.med),
				float64(gets)/float64(ops), near, float64(mallocs)/float64(ops), fmtRatio(sp.med/spreadOf(rateOf(samples[nGCLocal][w])).med))
		}
	}
	fmt.Fprintf(e.out, "\n%s every Get of %s, %s and go-redis/cache + TinyLFU decodes the stored bytes it keeps (zstd and packcache.JSON; go-redis/cache: s2 and msgpack), so their Get/s is a decode's, and each caller gets a value of its own; packcache WithLocalCache and default hand every Get one decoded value they keep, shared by its callers (read-only, unless WithDecodePerCaller), so theirs is a lookup's.\n", notLikeForLike, nRueidis, nAside)
	return nil
}

// rueidisGetSubjects are the near suite's rueidis subjects.
func rueidisGetSubjects(e *env, ch Channel) ([]*getSubject, error) {
	rp, err := rueidisPeer(e, nRueidis, ch)
	if err != nil {
		return nil, err
	}
	ap, err := asidePeer(e, nAside, ch)
	if err != nil {
		rp.close()
		return nil, err
	}
	return []*getSubject{rueidisGetSubject(rp, nRueidis), rueidisGetSubject(ap, nAside)}, nil
}

func rateOf(rs []rateSample) []float64 {
	var out []float64
	for _, r := range rs {
		out = append(out, r.rate())
	}
	return out
}

func rateSpread(s spread) string { return fmt.Sprintf("%.0f (%.0f–%.0f)", s.med, s.min, s.max) }

// fmtUs prints microseconds with three significant digits or so.
func fmtUs(us float64) string {
	switch {
	case us >= 100:
		return fmt.Sprintf("%.0f", us)
	case us >= 1:
		return fmt.Sprintf("%.1f", us)
	}
	return fmt.Sprintf("%.3f", us)
}

func fmtRatio(r float64) string {
	if r >= 10 {
		return fmt.Sprintf("%.0f×", r)
	}
	return fmt.Sprintf("%.2f×", r)
}

// fmtLat prints a latency in µs below a millisecond and in ms above.
func fmtLat(d time.Duration) string {
	if d < time.Millisecond {
		return fmt.Sprintf("%.0f µs", float64(d)/1e3)
	}
	return fmt.Sprintf("%.2f ms", ms(d))
}

// latResult is how soon one subject saw another process's writes.
type latResult struct {
	writes int
	gap    time.Duration   // each write came gap to 2*gap after the previous one was seen
	seen   []time.Duration // sorted
	bound  time.Duration   // a write not seen within it counts as unseen
}

func (l *latResult) pct(p int) time.Duration { return l.seen[(len(l.seen)-1)*p/100] }

func (l *latResult) gapText() string { return fmt.Sprintf("%v–%v", l.gap, 2*l.gap) }

// Gaps between the reader's first sight of a value and the next write:
// settled is more than the share window, so that the near cache's last
// read of Redis is no longer shared when the write comes; soon is less.
const (
	gapSettled = 2 * (10 * time.Millisecond)
	gapSoon    = time.Millisecond
)

// nearLatency measures how soon a write by another process is seen: a
// second client, with connections of its own as another process would
// have, Sets a new value; the clock runs from that Set's return to the
// first Get of this process's cache that returns the new value. The
// reader Gets in a tight loop throughout, as a hot key's readers do: for
// a gap after it sees a value, then until it sees the next write's.
func (e *env) nearLatency(ctx context.Context, ch Channel, res *nearResults) error {
	writes, gcWrites, bound := 200, 3, 2*time.Second
	if e.cfg.quick {
		writes, gcWrites, bound = 10, 1, 200*time.Millisecond
	}
	other := redis.NewClient(&redis.Options{Addr: e.addr, PoolSize: 4, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, ContextTimeoutEnabled: true})
	defer other.Close()
	pcWriter, err := packcache.New[Channel](other)
	if err != nil {
		return err
	}
	defer pcWriter.Close()
	gcWriter := gocache.New(&gocache.Options{Redis: other})
	pcWrite := func(ctx context.Context, key string, v Channel) error { return pcWriter.Set(ctx, key, v) }
	gcWrite := func(ctx context.Context, key string, v Channel) error {
		return gcWriter.Set(&gocache.Item{Ctx: ctx, Key: key, Value: v, TTL: time.Hour})
	}

	var readers []*getSubject
	defer func() {
		for _, s := range readers {
			s.close()
		}
	}()
	reader := func(name string, near bool, opts ...packcache.Option) (*getSubject, error) {
		s, err := packcacheGetSubject(e.rdb, name, opts...)
		if err != nil {
			return nil, err
		}
		s.near = near
		readers = append(readers, s)
		return s, nil
	}
	near, err := reader(nNear, true, packcache.WithLocalCache(nearLocal))
	if err != nil {
		return err
	}
	nearNoW, err := reader(nNearNoW, true, packcache.WithLocalCache(nearLocal), packcache.WithShareWindow(packcache.Off))
	if err != nil {
		return err
	}
	def, err := reader(nDef, false)
	if err != nil {
		return err
	}
	noWin, err := reader(nNoWin, false, packcache.WithShareWindow(packcache.Off))
	if err != nil {
		return err
	}
	gcl := goCacheGetSubject(e, nGCLocal, true, ch)
	readers = append(readers, gcl)
	rs, err := rueidisGetSubjects(e, ch)
	if err != nil {
		return err
	}
	readers = append(readers, rs...)
	rds, aside := rs[0], rs[1]

	type run struct {
		s      *getSubject
		write  func(ctx context.Context, key string, v Channel) error
		writes int
		gap    time.Duration
	}
	runs := []run{
		{near, pcWrite, writes, gapSettled},
		{near, pcWrite, writes, gapSoon},
		{nearNoW, pcWrite, writes, gapSettled},
		{nearNoW, pcWrite, writes, gapSoon},
		{def, pcWrite, writes, gapSettled},
		{noWin, pcWrite, writes, gapSettled},
		{gcl, gcWrite, gcWrites, gapSettled},
		// rueidis reads packcache's stored format: the same writer.
		{rds, pcWrite, writes, gapSettled},
		{rds, pcWrite, writes, gapSoon},
		{aside, pcWrite, writes, gapSettled},
		{aside, pcWrite, writes, gapSoon},
	}
	var results []*latResult
	for _, r := range runs {
		s := r.s
		key := e.key("near", "latency", s.name)
		if err := s.set(ctx, key, ch); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		get := func() error { _, err := s.get(ctx, key); return err }
		if err := get(); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		l := &latResult{writes: r.writes, gap: r.gap, bound: bound}
		sawPrev := time.Now()
		for i := range r.writes {
			for gap := r.gap + rand.N(r.gap); time.Since(sawPrev) < gap; {
				if err := get(); err != nil {
					return fmt.Errorf("%s: %w", s.name, err)
				}
			}
			// The near cache holds the current value (it has had a
			// heartbeat's time since its last read of Redis).
			if s.near {
				if err := awaitNear(get, s.hits); err != nil {
					return fmt.Errorf("%s: %w", s.name, err)
				}
			}
			v := ch
			v.ID = fmt.Sprintf("write-%d", i)
			if err := r.write(ctx, key, v); err != nil {
				return fmt.Errorf("%s: the other process's Set: %w", s.name, err)
			}
			t0 := time.Now()
			for {
				got, err := s.get(ctx, key)
				if err != nil {
					return fmt.Errorf("%s: %w", s.name, err)
				}
				sawPrev = time.Now()
				if got.ID == v.ID {
					l.seen = append(l.seen, sawPrev.Sub(t0))
					break
				}
				if sawPrev.Sub(t0) > bound {
					break
				}
			}
		}
		slices.Sort(l.seen)
		results = append(results, l)
		if r.gap == gapSettled && res.lat[s.name] == nil {
			res.lat[s.name] = l
		}
		if err := s.del(ctx, key); err != nil {
			return err
		}
	}

	fmt.Fprintf(e.out, "\n### near: another process's write, seen\n\nA second go-redis client with connections of its own (another process, as far as Redis can tell) Sets a new value of the channel, through packcache (go-redis/cache for go-redis/cache's row; the rueidis rows read what packcache writes). The reader Gets in a tight loop throughout, as a hot key's readers do; the time runs from the Set's return to the first Get that returns the new value, so it includes that Get's own read of Redis and decode. Each write comes a random gap after the reader first saw the previous one (and, for the near caches, once the near cache serves again). A write not seen within %v counts as unseen. Bounds: the near cache's is MaxLag (%v) for writes Redis completed before a Get began; the share window's is the window (%v): a Get may share a read begun up to a window earlier, and with the near cache that includes the read that filled it, which the \"%v\" rows show.\n\n",
		bound, res.maxLag, (10 * time.Millisecond), (&latResult{gap: gapSoon}).gapText())
	fmt.Fprintln(e.out, "| subject | gap before each write | writes | seen | p50 | p99 | max |")
	fmt.Fprintln(e.out, "|---|---|--:|--:|--:|--:|--:|")
	for i, l := range results {
		name := runs[i].s.name
		if len(l.seen) == 0 {
			why := ""
			if name == nGCLocal {
				why = " (its local TTL is 1 min)"
			}
			fmt.Fprintf(e.out, "| %s | %s | %d | 0 | not seen within %v%s | – | – |\n", name, l.gapText(), l.writes, bound, why)
			continue
		}
		fmt.Fprintf(e.out, "| %s | %s | %d | %d | %s | %s | %s |\n", name, l.gapText(), l.writes, len(l.seen), fmtLat(l.pct(50)), fmtLat(l.pct(99)), fmtLat(l.seen[len(l.seen)-1]))
	}
	fmt.Fprintf(e.out, "\n%s the time includes the Get that returns the new value, and what that Get does differs: with packcache's near cache, a read of Redis and a decode of the new value, which it then keeps; with %s and %s, a read of Redis (CLIENT CACHING YES, MULTI, PTTL, GET, EXEC in one write) and a decode, after which the bytes are kept and every later Get decodes them again. The invalidations differ in kind too: packcache's near cache has CLIENT TRACKING in broadcast mode (BCAST, by key prefix) on a connection of its own; rueidis tracks the keys each connection read (OPTIN) and gets their invalidations on that connection. Either way a goroutine of the reading process reads the invalidation, and the wait for it to run counts: the rueidis readers here decode in a tight loop (each Get a decode), and their long tail is most likely that wait: a check outside packbench, with such a reader, found a bare net.Conn in the same process reading the invalidation as late as rueidis did, and a client in another process reading it within a few ms.\n", notLikeForLike, nRueidis, nAside)
	return nil
}

// nearSurge runs warm surges with and without the near cache, and of
// go-redis/cache's Once, reps times interleaved.
func (e *env) nearSurge(ctx context.Context, ch Channel, res *nearResults) error {
	def, near, closeBoth, err := surgePair(e, ch)
	if err != nil {
		return err
	}
	defer closeBoth()
	gc := goCachePeer(e, nGCOnce, false, ch).surgeSubject(ch)
	gcl := goCachePeer(e, nGCLOnce, true, ch).surgeSubject(ch)
	subjects := []*surgeSubject{def, near, gc, gcl}
	for _, mk := range []struct {
		name string
		f    func(*env, string, Channel) (*peer, error)
	}{{nRueidis, rueidisPeer}, {nAside, asidePeer}} {
		p, err := mk.f(e, mk.name, ch)
		if err != nil {
			return err
		}
		s := p.rueidisNearSurgeSubject(ch)
		defer s.close()
		subjects = append(subjects, s)
	}
	subjects = append(subjects, noopSubject())
	if res.surge, err = e.surge(ctx, "near", subjects, "warm", worstRuns); err != nil {
		return err
	}

	fmt.Fprintf(e.out, "\n### near: a surge on one warm key\n\n%d goroutines released at once on the warm key (stored; for the near cache and rueidis, also served by it before the release), each one Get (go-redis/cache: Once; rueidisaside: its Get with a loader), %d times, the subjects interleaved. Wall, p50, p99: median (min–max for wall) over the runs; Redis GETs, decodes, peak heap growth: the most in any run; near hits: the fewest; errors: all runs. A cold surge is the same with and without the near cache: a loaded value is stored, which is a write, and enters the near cache only when a Get reads it back.\n\n", e.cfg.surgeN, e.surgeReps())
	fmt.Fprintln(e.out, "| subject | wall ms | p50 ms | p99 ms | Redis GETs | decodes | near hits | peak heap growth MiB | errors | go-redis/cache Once wall ÷ this |")
	fmt.Fprintln(e.out, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	gcWall := res.surge[nGCOnce].wallMs.med
	for _, s := range subjects {
		r := res.surge[s.name]
		hits := "–"
		if s.nearHits != nil {
			hits = fmt.Sprint(r.nearHits)
		}
		fmt.Fprintf(e.out, "| %s | %.1f (%.1f–%.1f) | %.1f | %.1f | %d | %d | %s | %.1f | %d | %s |\n", s.name, r.wallMs.med, r.wallMs.min, r.wallMs.max,
			ms(r.p50), ms(r.p99), r.gets, r.decodes, hits, float64(r.peakHeap)/(1<<20), r.errs, fmtRatio(gcWall/r.wallMs.med))
	}
	dw, nw := res.surge[nDef].wallMs.med, res.surge[nNear].wallMs.med
	gclWall := res.surge[nGCLOnce].wallMs.med
	fmt.Fprintf(e.out, "\ngo-redis/cache Once took %s as long as packcache default and %s as long as packcache with the near cache; go-redis/cache + TinyLFU Once, %s and %s. The near cache's surge took %s of the default's.\n",
		fmtRatio(gcWall/dw), fmtRatio(gcWall/nw), fmtRatio(gclWall/dw), fmtRatio(gclWall/nw), fmtRatio(nw/dw))
	rw, aw := res.surge[nRueidis].wallMs.med, res.surge[nAside].wallMs.med
	fmt.Fprintf(e.out, "%s took %s as long as packcache with the near cache, and %s %s.\n", nRueidis, fmtRatio(rw/nw), nAside, fmtRatio(aw/nw))
	fmt.Fprintf(e.out, "\n%s a Get of %s or %s that its client-side cache answers (near hits) reads no Redis, as the near cache's do, but decodes the cached bytes (the decodes column), where the near cache hands every Get the one decoded value it keeps, shared: the walls compare a decode per Get with none.\n", notLikeForLike, nRueidis, nAside)
	return nil
}

// A target is a performance target and how a run did against it.
type target struct {
	what, measured string
	ok             bool
}

func (e *env) printTargets(title string, ts []target) {
	fmt.Fprintf(e.out, "\n### %s\n\n", title)
	if e.cfg.quick {
		fmt.Fprintln(e.out, "> -quick: counts too small for these to mean much.")
		fmt.Fprintln(e.out)
	}
	fmt.Fprintln(e.out, "| target | measured | result |")
	fmt.Fprintln(e.out, "|---|---|---|")
	for _, t := range ts {
		res := "PASS"
		if !t.ok {
			res = "**FAIL**"
		}
		fmt.Fprintf(e.out, "| %s | %s | %s |\n", t.what, t.measured, res)
	}
}

// surgeTargets are the targets of a warm surge of packcache without and
// with the near cache against go-redis/cache's Once (walls in ms).
func surgeTargets(def, near, gc float64, nearGets, nearDecodes int64) []target {
	return []target{
		{"warm surge ≥ 100× faster than go-redis/cache Once",
			fmt.Sprintf("%.1f ms vs %.1f ms = %.0f×", def, gc, gc/def), gc >= 100*def},
		{"warm surge with the near cache ≥ 100× faster than go-redis/cache Once",
			fmt.Sprintf("%.1f ms vs %.1f ms = %.0f×", near, gc, gc/near), gc >= 100*near},
		{"warm surge with the near cache: 0 Redis GETs, 0 decodes",
			fmt.Sprintf("%d GETs, %d decodes", nearGets, nearDecodes), nearGets == 0 && nearDecodes == 0},
	}
}

func (e *env) nearTargets(res *nearResults) {
	near := res.surge[nNear]
	ts := surgeTargets(res.surge[nDef].wallMs.med, near.wallMs.med, res.surge[nGCOnce].wallMs.med, near.gets, near.decodes)
	var parts []string
	ok := true
	for _, w := range []int{1, 16} {
		n, g := res.rate[nNear][w].med, res.rate[nGCLocal][w].med
		mode := "sequential"
		if w > 1 {
			mode = fmt.Sprintf("%d goroutines", w)
		}
		parts = append(parts, fmt.Sprintf("%s: %.0f vs %.0f Get/s = %.0f×", mode, n, g, n/g))
		ok = ok && n >= 100*g
	}
	ts = append(ts, target{"Get/s with the near cache ≥ 100× go-redis/cache + TinyLFU's", strings.Join(parts, "; "), ok})
	l := res.lat[nNear]
	if len(l.seen) == 0 {
		ts = append(ts, target{fmt.Sprintf("another process's write seen by the near cache within MaxLag (%v)", res.maxLag), "none seen", false})
	} else {
		worst := l.seen[len(l.seen)-1]
		ts = append(ts, target{fmt.Sprintf("another process's write seen by the near cache within MaxLag (%v)", res.maxLag),
			fmt.Sprintf("%d of %d seen, p99 %s, max %s", len(l.seen), l.writes, fmtLat(l.pct(99)), fmtLat(worst)),
			len(l.seen) == l.writes && worst <= res.maxLag})
	}
	e.printTargets("near: targets", ts)
}
