package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	gocache "github.com/go-redis/cache/v9"
	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
)

// A peer is one way of caching a Channel in Redis.
type peer struct {
	name    string
	set     func(ctx context.Context, key string, v Channel) error
	get     func(ctx context.Context, key string) (Channel, error)
	through func(ctx context.Context, key string) error // read-through Get for the surge
	del     func(ctx context.Context, key string) error
	loads   *atomic.Int64
	decodes *atomic.Int64
	close   func()

	csc *countingClient // rueidis peers: DoCache's client-side cache hits and misses
}

type peerRow struct {
	set, get             spread
	setAllocs, getAllocs float64
	strlen, usage        int64
}

type peerResults struct {
	done  bool
	rows  map[string]peerRow
	surge map[string]surgeRow
	size  int

	rawSetAllocs  float64 // packcache.Cache[[]byte] Set, default options
	marshalAllocs float64 // json.Marshal of the Channel alone
}

// mallocsPer returns the mean allocations of f over n calls.
func mallocsPer(n int, f func() error) (float64, error) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m0 := ms.Mallocs
	for range n {
		if err := f(); err != nil {
			return 0, err
		}
	}
	runtime.ReadMemStats(&ms)
	return float64(ms.Mallocs-m0) / float64(n), nil
}

const (
	pPlain    = "(a) go-redis + encoding/json"
	pBaseline = "(b) go-redis + zstd + packcache.JSON (baseline)"
	pGC       = "(c) go-redis/cache (msgpack+s2)"
	pGCLocal  = "(c) go-redis/cache + TinyLFU"
	pPCDef    = "(d) packcache default"
	pPCNoWin  = "(d) packcache WithShareWindow(Off)"
)

var zbufs = sync.Pool{New: func() any { b := make([]byte, 0, 256<<10); return &b }}

func handPeer(e *env, name string, compress bool, ch Channel) *peer {
	p := &peer{name: name, loads: new(atomic.Int64), decodes: new(atomic.Int64), close: func() {}}
	p.set = func(ctx context.Context, key string, v Channel) error {
		var b []byte
		var err error
		if compress {
			b, err = packcache.JSON.Marshal(nil, &v)
		} else {
			b, err = json.Marshal(v)
		}
		if err != nil {
			return err
		}
		if compress {
			if b, err = codec.Zstd.Encode(nil, b); err != nil {
				return err
			}
		}
		return e.rdb.Set(ctx, key, b, time.Hour).Err()
	}
	p.get = func(ctx context.Context, key string) (Channel, error) {
		var v Channel
		b, err := e.rdb.Get(ctx, key).Bytes()
		if err != nil {
			return v, err
		}
		p.decodes.Add(1)
		if !compress {
			return v, json.Unmarshal(b, &v)
		}
		buf := zbufs.Get().(*[]byte)
		defer zbufs.Put(buf)
		out, err := codec.Zstd.Decode((*buf)[:0], b, (64 << 20))
		if err != nil {
			return v, err
		}
		*buf = out[:0]
		return v, packcache.JSON.Unmarshal(out, &v)
	}
	p.through = func(ctx context.Context, key string) error {
		_, err := p.get(ctx, key)
		if errors.Is(err, redis.Nil) {
			p.loads.Add(1)
			time.Sleep(loaderDelay)
			return p.set(ctx, key, ch)
		}
		return err
	}
	p.del = func(ctx context.Context, key string) error { return e.rdb.Del(ctx, key).Err() }
	return p
}

func goCachePeer(e *env, name string, local bool, ch Channel) *peer {
	p := &peer{name: name, loads: new(atomic.Int64), decodes: new(atomic.Int64), close: func() {}}
	inner := gocache.New(&gocache.Options{})
	opt := &gocache.Options{Redis: e.rdb, Unmarshal: func(b []byte, v any) error {
		p.decodes.Add(1)
		return inner.Unmarshal(b, v)
	}}
	if local {
		opt.LocalCache = gocache.NewTinyLFU(1000, time.Minute)
	}
	cd := gocache.New(opt)
	p.set = func(ctx context.Context, key string, v Channel) error {
		return cd.Set(&gocache.Item{Ctx: ctx, Key: key, Value: v, TTL: time.Hour})
	}
	p.get = func(ctx context.Context, key string) (Channel, error) {
		var v Channel
		err := cd.Get(ctx, key, &v)
		return v, err
	}
	p.through = func(ctx context.Context, key string) error {
		var v Channel
		err := cd.Once(&gocache.Item{Ctx: ctx, Key: key, Value: &v, TTL: time.Hour, Do: func(*gocache.Item) (any, error) {
			p.loads.Add(1)
			time.Sleep(loaderDelay)
			return ch, nil
		}})
		if err == nil && len(v.Messages) != len(ch.Messages) {
			err = errors.New("wrong value")
		}
		return err
	}
	p.del = func(ctx context.Context, key string) error { return cd.Delete(ctx, key) }
	return p
}

func packcachePeer(e *env, name string, ch Channel, opts ...packcache.Option) (*peer, error) {
	s, err := packcacheSubject(e, name, ch, opts...)
	if err != nil {
		return nil, err
	}
	// Set/Get rows use a cache without the counting serializer.
	c, err := packcache.New[Channel](e.rdb, opts...)
	if err != nil {
		s.close()
		return nil, err
	}
	p := &peer{name: name, loads: s.loads, decodes: s.decodes}
	p.set = func(ctx context.Context, key string, v Channel) error { return c.Set(ctx, key, v) }
	p.get = func(ctx context.Context, key string) (Channel, error) { return c.Get(ctx, key) }
	p.through = s.get
	p.del = func(ctx context.Context, key string) error { return c.Delete(ctx, key) }
	p.close = func() { c.Close(); s.close() }
	return p, nil
}

// surgeSubject makes p a subject of surges of read-through Gets of ch
// (go-redis/cache's Once). Closing it is left to p's owner.
func (p *peer) surgeSubject(ch Channel) *surgeSubject {
	return &surgeSubject{
		name: p.name,
		prepare: func(ctx context.Context, key string, warm bool) error {
			if warm {
				return p.set(ctx, key, ch)
			}
			return p.del(ctx, key)
		},
		get:     p.through,
		loads:   p.loads,
		decodes: p.decodes,
	}
}

// seqAcc accumulates one peer's sequential Set/Get samples.
type seqAcc struct {
	set, get   []float64
	setM, getM uint64
	n, reps    int
	warmedUp   bool
}

// seqRep runs one rep of n Sets then n Gets of key through p.
func seqRep(ctx context.Context, p *peer, key string, v Channel, acc *seqAcc) error {
	var ms runtime.MemStats
	if !acc.warmedUp {
		if err := p.set(ctx, key, v); err != nil {
			return err
		}
		if _, err := p.get(ctx, key); err != nil {
			return err
		}
		acc.warmedUp = true
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	m0 := ms.Mallocs
	t := time.Now()
	for range acc.n {
		if err := p.set(ctx, key, v); err != nil {
			return err
		}
	}
	acc.set = append(acc.set, float64(time.Since(t).Nanoseconds())/float64(acc.n))
	runtime.ReadMemStats(&ms)
	acc.setM += ms.Mallocs - m0
	m0 = ms.Mallocs
	t = time.Now()
	for range acc.n {
		got, err := p.get(ctx, key)
		if err != nil {
			return err
		}
		if len(got.Messages) != len(v.Messages) {
			return fmt.Errorf("%s: wrong value", p.name)
		}
	}
	acc.get = append(acc.get, float64(time.Since(t).Nanoseconds())/float64(acc.n))
	runtime.ReadMemStats(&ms)
	acc.getM += ms.Mallocs - m0
	acc.reps++
	return nil
}

func (acc *seqAcc) row() peerRow {
	var row peerRow
	row.set, row.get = spreadOf(acc.set), spreadOf(acc.get)
	row.setAllocs = float64(acc.setM) / float64(acc.n*acc.reps)
	row.getAllocs = float64(acc.getM) / float64(acc.n*acc.reps)
	return row
}

func (e *env) suitePeers(ctx context.Context) error {
	size := 128 << 10
	ch := makeChannel(7, size)
	raw, _ := json.Marshal(ch)
	n := opsFor(len(raw), e.cfg.quick, e.cfg.ops)

	def, err := packcachePeer(e, pPCDef, ch)
	if err != nil {
		return err
	}
	nowin, err := packcachePeer(e, pPCNoWin, ch, packcache.WithShareWindow(packcache.Off))
	if err != nil {
		def.close()
		return err
	}
	peers := []*peer{
		handPeer(e, pPlain, false, ch),
		handPeer(e, pBaseline, true, ch),
		goCachePeer(e, pGC, false, ch),
		goCachePeer(e, pGCLocal, true, ch),
		def, nowin,
	}
	defer func() {
		for _, p := range peers {
			p.close()
		}
	}()
	for _, mk := range []struct {
		name string
		f    func(*env, string, Channel) (*peer, error)
	}{{pRueidis, rueidisPeer}, {pAside, asidePeer}} {
		p, err := mk.f(e, mk.name, ch)
		if err != nil {
			return err
		}
		peers = append(peers, p)
	}

	res := peerResults{rows: map[string]peerRow{}, surge: map[string]surgeRow{}, size: len(raw)}
	e.header("peers", fmt.Sprintf("One %d-byte chat channel (Channel struct). (a) uses encoding/json; (b) uses packcache.JSON, packcache's default serializer (goccy/go-json at the time of writing), so it differs from packcache only in the cache machinery. Sequential Set then Get of one key: ns/op median (min–max) of %d runs of %d ops, the runs of all peers interleaved; allocs/op from runtime.MemStats.Mallocs (whole process, so go-redis's allocations count). "+
		"packcache default keeps a finished read shared for 10 ms (WithShareWindow), so its sequential Gets of one key mostly skip Redis; the WithShareWindow(Off) row reads Redis and decodes on every Get (the hit path). go-redis/cache + TinyLFU answers Gets from its local cache but still decodes each time. "+
		"(e) are rueidis %s: DoCache of GET with client-side caching (RESP3, CLIENT TRACKING ON OPTIN; client-side TTL %v), and rueidisaside's Get over the same (its Set is a SET through its rueidis client); both store exactly what packcache default stores (packcache.JSON, zstd behind packcache's header byte) and decode (zstd, packcache.JSON) every answer, as (b) does. Get ratio = packcache default / peer; hit-path ratio = packcache WithShareWindow(Off) / peer.",
		len(raw), e.cfg.reps, n, rueidisVersion(), rueidisTTL))
	fmt.Fprintln(e.out, "| peer | Set µs | Set allocs/op | Get µs | Get allocs/op | Get ops/s | STRLEN | MEMORY USAGE | Get ratio | hit-path ratio | STRLEN ratio |")
	fmt.Fprintln(e.out, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	// Reps are interleaved across peers (rep 1 of every peer, then rep 2,
	// ...) so that a noisy moment of a shared machine falls on all of them
	// alike rather than on whichever peer ran then.
	accs := make([]*seqAcc, len(peers))
	for i := range peers {
		accs[i] = &seqAcc{n: n}
	}
	for range e.cfg.reps {
		for i, p := range peers {
			if err := seqRep(ctx, p, e.key("peers", p.name), ch, accs[i]); err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
		}
	}
	for i, p := range peers {
		k := e.key("peers", p.name)
		row := accs[i].row()
		var err error
		if row.strlen, row.usage, err = e.stored(ctx, k); err != nil {
			return err
		}
		res.rows[p.name] = row
		p.del(ctx, k)
	}
	d := res.rows[pPCDef]
	for _, p := range peers {
		row := res.rows[p.name]
		fmt.Fprintf(e.out, "| %s | %s | %.1f | %s | %.1f | %.0f | %d | %d | %.3g | %.3g | %.2f |\n", p.name, row.set.us(), row.setAllocs, row.get.us(), row.getAllocs,
			1e9/row.get.med, row.strlen, row.usage, d.get.med/row.get.med, res.rows[pPCNoWin].get.med/row.get.med, float64(d.strlen)/float64(row.strlen))
	}
	fmt.Fprintf(e.out, "\n%s\n", notLikeForLike)
	fmt.Fprintln(e.out, "> - Get: the (e) rows answer sequential Gets from rueidis's client-side cache (a Set invalidates it, and the first Get after the Sets reads Redis): what a Get costs there is the decode of the cached reply, the bytes shared by every Get, with no read of Redis, as go-redis/cache + TinyLFU's. packcache default's Gets share one decoded value for 10 ms; only packcache WithShareWindow(Off), (a), (b) and (c) without TinyLFU read Redis on every Get.")
	fmt.Fprintln(e.out, "> - Stored format: (b), (d) and (e) store the same zstd frame of packcache.JSON ((b) without packcache's header byte), (a) plain encoding/json, (c) msgpack+s2: the STRLEN column compares formats, not only machinery.")

	fmt.Fprintf(e.out, "\n### peers: surge\n\n%d goroutines released at once on the same channel, warm (stored by the peer itself) and cold (absent; the loader sleeps %v, then the value is stored). go-redis/cache uses Once; hand-written peers and rueidis DoCache GET, and on a miss load and SET; rueidisaside uses its Get with the loader (a lock by SET NX GET, then a script that stores the value; the others wait for the key's invalidation). Warm, rueidis's client-side cache is as the Set left it: empty, since the Set invalidated it (the near suite's surge fills it first).\n\n", e.cfg.surgeN, loaderDelay)
	var subjects []*surgeSubject
	for _, p := range peers {
		if p.name == pPCNoWin {
			continue
		}
		subjects = append(subjects, p.surgeSubject(ch))
	}
	subjects = append(subjects, noopSubject())
	if err := e.surgeTable(ctx, "peers", subjects, res.surge); err != nil {
		return err
	}
	fmt.Fprintf(e.out, "\n%s a Get of the (e) peers that finds the value decodes it (rueidis: from the cached reply, shared by every Get), as (a)-(c) do; packcache shares one decoded value among the Gets of a share window: the decodes column counts the difference. Cold, (a), (b) and rueidis DoCache each load and SET, and decode nothing; rueidisaside's waiters decode what its one load stored.\n", notLikeForLike)
	rc, err := packcache.New[[]byte](e.rdb)
	if err != nil {
		return err
	}
	defer rc.Close()
	rk := e.key("peers", "raw")
	rc.Set(ctx, rk, raw)
	if res.rawSetAllocs, err = mallocsPer(n, func() error { return rc.Set(ctx, rk, raw) }); err != nil {
		return err
	}
	rc.Delete(ctx, rk)
	if res.marshalAllocs, err = mallocsPer(n, func() error { _, err := json.Marshal(ch); return err }); err != nil {
		return err
	}
	res.done = true
	e.peer = res
	e.targets()
	return nil
}

// targets prints PASS/FAIL for the performance targets.
func (e *env) targets() {
	r := e.peer
	rows, sg := r.rows, r.surge
	fmt.Fprintf(e.out, "\n### targets\n\n")
	if e.cfg.quick {
		fmt.Fprintln(e.out, "> -quick: counts too small for these to mean much.")
		fmt.Fprintln(e.out)
	}
	fmt.Fprintln(e.out, "| target | measured | result |")
	fmt.Fprintln(e.out, "|---|---|---|")
	pf := func(ok bool) string {
		if ok {
			return "PASS"
		}
		return "**FAIL**"
	}
	line := func(target, measured string, ok bool) {
		fmt.Fprintf(e.out, "| %s | %s | %s |\n", target, measured, pf(ok))
	}
	hit, base := rows[pPCNoWin], rows[pBaseline]
	line("Get hit path (WithShareWindow(Off)) ≤ 1.05× baseline (b) time",
		fmt.Sprintf("%.1f µs vs %.1f µs = %.3f×", hit.get.med/1e3, base.get.med/1e3, hit.get.med/base.get.med), hit.get.med <= 1.05*base.get.med)
	// The Redis time budget (WithRedisTimeout) is a context of packcache's
	// own, one allocation, with a Done shared by the budgets of one tick;
	// the shared call is one more.
	line("Get hit path allocs ≤ baseline (b) + 3",
		fmt.Sprintf("%.1f vs %.1f", hit.getAllocs, base.getAllocs), hit.getAllocs <= base.getAllocs+3)
	def := rows[pPCDef]
	line(fmt.Sprintf("Set ≤ 20 allocs at %s: packcache.Cache[[]byte] (packcache's own allocations)", human(r.size)), fmt.Sprintf("%.1f allocs/op", r.rawSetAllocs), r.rawSetAllocs <= 20)
	line(fmt.Sprintf("Set ≤ 20 allocs at %s: Cache[Channel], default serializer included", human(r.size)),
		fmt.Sprintf("%.1f allocs/op (encoding/json.Marshal of the same value alone: %.1f)", def.setAllocs, r.marshalAllocs), def.setAllocs <= 20)

	w, gw := sg[pPCDef+"/warm"], sg[pGC+"/warm"]
	speed := float64(gw.wall) / float64(w.wall)
	line("warm surge ≥ 100× faster than go-redis/cache Once", fmt.Sprintf("%.1f ms vs %.1f ms = %.0f×", ms(w.wall), ms(gw.wall), speed), speed >= 100)
	// A Get shares a read begun at most one share window before it (the
	// window's bound), so reads of one key begin at least a window apart:
	// a surge lasting W costs at most W/window + 1 GETs and decodes.
	// packcache's reads with a loader are SET NX GETs (which write
	// nothing where the key holds a value): a read is a GET or a SET.
	maxReads := int64(w.wall/(10*time.Millisecond)) + 1
	line(fmt.Sprintf("warm surge: at most one read (GET or SET NX GET) and one decode per share window (%v) of its wall time, + 1", (10*time.Millisecond)),
		fmt.Sprintf("%d reads, %d decodes (at most %d)", w.gets+w.sets, w.decodes, maxReads), w.gets+w.sets <= maxReads && w.decodes <= maxReads)
	line("warm surge: peak heap < 64 MiB", fmt.Sprintf("%.1f MiB", float64(w.peakHeap)/(1<<20)), w.peakHeap < 64<<20)
	c := sg[pPCDef+"/cold"]
	// The first read places the lease (SET NX GET); the value is stored
	// by one script (EVALSHA, and EVAL if the server had not seen it).
	line("cold surge: 1 loader call; 1 store script (the first read placed the lease)", fmt.Sprintf("%d loader calls, %d scripts", c.loads, c.scripts), c.loads == 1 && c.scripts >= 1 && c.scripts <= 2)
	// Waking the 20,000 waiters costs what a warm surge costs; the load
	// must add no more than its own time.
	line(fmt.Sprintf("cold surge: wall ≤ loader (%v) + the warm surge's wall + 20 ms", loaderDelay),
		fmt.Sprintf("%.1f ms (bound %.1f ms)", ms(c.wall), ms(loaderDelay+w.wall+20*time.Millisecond)), c.wall <= loaderDelay+w.wall+20*time.Millisecond)
	gc := rows[pGC]
	line("sequential Get (defaults) ops/s ≥ go-redis/cache", fmt.Sprintf("%.0f vs %.0f ops/s (vs + TinyLFU: %.0f)", 1e9/def.get.med, 1e9/gc.get.med, 1e9/rows[pGCLocal].get.med), def.get.med <= gc.get.med)
	line("zstd stored bytes ≤ 0.75× go-redis/cache", fmt.Sprintf("%d vs %d B = %.3f×", def.strlen, gc.strlen, float64(def.strlen)/float64(gc.strlen)), float64(def.strlen) <= 0.75*float64(gc.strlen))
}
