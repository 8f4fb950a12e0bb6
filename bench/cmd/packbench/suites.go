package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/chart"
)

type namedCodec struct {
	name string
	c    codec.Codec
}

var (
	plainCodec = namedCodec{"plain", codec.None}
	sizeCodecs = []namedCodec{
		plainCodec,
		{"lz4", codec.LZ4}, {"lz4hc", codec.LZ4HC}, {"snappy", codec.Snappy},
		{"zstd-fastest", codec.Zstd}, {"zstd-default", codec.ZstdDefault},
		{"zstd-better", codec.ZstdBetter}, {"zstd-best", codec.ZstdBest},
		{"brotli-1", brotli1},
	}
	costCodecs = []namedCodec{
		{"none", codec.None}, {"lz4", codec.LZ4}, {"lz4hc", codec.LZ4HC}, {"snappy", codec.Snappy},
		{"zstd", codec.Zstd}, {"zstd-best", codec.ZstdBest}, {"brotli-1", brotli1},
	}
	bulkCodecs    = []namedCodec{{"none", codec.None}, {"lz4", codec.LZ4}, {"snappy", codec.Snappy}, {"zstd", codec.Zstd}}
	backlogCodecs = []namedCodec{plainCodec, {"lz4", codec.LZ4}, {"snappy", codec.Snappy}, {"zstd", codec.Zstd}, {"zstd-best", codec.ZstdBest}}
)

func human(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func mib(n int64) string { return fmt.Sprintf("%.1f", float64(n)/(1<<20)) }

// ---------------------------------------------------------------- sizes

func (e *env) suiteSizes(ctx context.Context) error {
	docs := e.docs
	if docs == nil {
		sizes := []int{130, 1200, 10 << 10, 100 << 10, 1 << 20, 4 << 20}
		if e.cfg.quick {
			sizes = sizes[:3]
		}
		for i, s := range sizes {
			docs = append(docs, doc{name: "orders " + human(s), raw: makeOrders(uint64(i+1), s)})
		}
	}
	e.header("sizes", "Stored bytes per codec: packcache.Cache[json.RawMessage] with WithCodec(c) and WithCompressAbove(CompressAll); \"plain\" is WithCodec(codec.None), the JSON verbatim. "+
		"\"stored as\" says what packcache chose: it stores plain when compression saves nothing (MinSaving=1). Ratio is STRLEN / plain STRLEN.")
	fmt.Fprintln(e.out, "| document | JSON bytes | codec | STRLEN | MEMORY USAGE | ratio | stored as |")
	fmt.Fprintln(e.out, "|---|--:|---|--:|--:|--:|---|")
	for di, d := range docs {
		var plain int64
		for _, nc := range sizeCodecs {
			c, err := packcache.New[json.RawMessage](e.rdb, packcache.WithCodec(nc.c), packcache.WithCompressAbove(packcache.CompressAll))
			if err != nil {
				return err
			}
			k := e.key("sizes", fmt.Sprint(di), nc.name)
			if err := c.Set(ctx, k, d.raw); err != nil {
				return err
			}
			c.Close()
			sl, mu, err := e.stored(ctx, k)
			if err != nil {
				return err
			}
			if nc == plainCodec {
				plain = sl
			}
			first, err := e.rdb.GetRange(ctx, k, 0, 0).Result()
			if err != nil {
				return err
			}
			as := "plain"
			if len(first) == 1 && codec.IsHeader(first[0]) {
				as = fmt.Sprintf("0x%02x", first[0])
			}
			ratio := float64(sl) / float64(plain)
			fmt.Fprintf(e.out, "| %s | %d | %s | %d | %d | %.3f | %s |\n", d.name, len(d.raw), nc.name, sl, mu, ratio, as)
			// The chart draws chat messages up to 2 KB (threshold suite)
			// and these documents above that: one line of two kinds of
			// document would zigzag where they overlap.
			if nc != plainCodec && len(d.raw) > 2048 {
				e.sizeRatios[nc.name] = append(e.sizeRatios[nc.name], chart.Point{X: float64(len(d.raw)), Y: ratio})
			}
			if err := e.rdb.Del(ctx, k).Err(); err != nil {
				return err
			}
		}
	}
	return nil
}

// ---------------------------------------------------------------- threshold

func (e *env) suiteThreshold(ctx context.Context) error {
	steps := []int{100, 200, 300, 400, 500, 600, 800, 1000, 1200, 1500, 2000}
	const samples = 20
	type sample struct {
		size int
		docs [][]byte
	}
	var rows []sample
	what := fmt.Sprintf("Compressed/plain size for single chat messages (mean of %d messages per size). Compressed size is codec.AppendValue's output, header byte included: what packcache stores when it compresses (it stores plain when that saves nothing). Break-even: the smallest size from which every larger size compresses smaller than plain.", samples)
	if e.docs != nil {
		what = "Compressed/plain size for JSON objects/arrays taken from inside the -corpus documents, the one nearest each size (one document per size). Break-even as for messages."
		for _, p := range corpusPieces(e.docs, steps) {
			rows = append(rows, sample{len(p.raw), [][]byte{p.raw}})
		}
	} else {
		for _, s := range steps {
			r := sample{size: s}
			for i := range samples {
				r.docs = append(r.docs, makeMessage(uint64(s*1000+i), s))
			}
			rows = append(rows, r)
		}
	}
	codecs := sizeCodecs[1:]
	e.header("threshold", what)
	fmt.Fprint(e.out, "| size |")
	for _, nc := range codecs {
		fmt.Fprintf(e.out, " %s |", nc.name)
	}
	fmt.Fprint(e.out, "\n|--:|")
	for range codecs {
		fmt.Fprint(e.out, "--:|")
	}
	fmt.Fprintln(e.out)
	ratios := make([][]float64, len(rows))
	for ri, r := range rows {
		fmt.Fprintf(e.out, "| %d |", r.size)
		for _, nc := range codecs {
			sum := 0.0
			for _, d := range r.docs {
				out, err := codec.AppendValue(nil, nc.c, d)
				if err != nil {
					return err
				}
				sum += float64(len(out)) / float64(len(d))
			}
			ratio := sum / float64(len(r.docs))
			ratios[ri] = append(ratios[ri], ratio)
			fmt.Fprintf(e.out, " %.3f |", ratio)
			e.sizeRatios[nc.name] = append(e.sizeRatios[nc.name], chart.Point{X: float64(r.size), Y: ratio})
		}
		fmt.Fprintln(e.out)
	}
	fmt.Fprint(e.out, "| **break-even** |")
	for ci := range codecs {
		be := "none ≤ " + fmt.Sprint(rows[len(rows)-1].size)
		for ri := len(rows) - 1; ri >= 0 && ratios[ri][ci] < 1; ri-- {
			be = fmt.Sprintf("%d B", rows[ri].size)
		}
		fmt.Fprintf(e.out, " %s |", be)
	}
	fmt.Fprintln(e.out)
	fmt.Fprintf(e.out, "\n(packcache's DefaultCompressAbove is %d B.)\n", (1024))
	return nil
}

// ---------------------------------------------------------------- cost

type spread struct{ med, min, max float64 } // ns per op

func spreadOf(xs []float64) spread {
	s := slices.Clone(xs)
	slices.Sort(s)
	return spread{med: s[len(s)/2], min: s[0], max: s[len(s)-1]}
}

func (s spread) us() string {
	return fmt.Sprintf("%.1f (%.1f–%.1f)", s.med/1e3, s.min/1e3, s.max/1e3)
}

func opsFor(size int, quick bool, override int) int {
	if override > 0 {
		return override
	}
	if quick {
		return max(5, min(50, (64<<10)/max(size, 1)))
	}
	switch {
	case size <= 2<<10:
		return 2000
	case size <= 16<<10:
		return 1000
	case size <= 256<<10:
		return 200
	}
	return 30
}

// setGet runs reps rounds of n Sets then n Gets of key, returning ns/op per
// round and allocations per op over all rounds.
func setGet[T any](ctx context.Context, c *packcache.Cache[T], key string, v T, n, reps int) (set, get []float64, setAllocs, getAllocs float64, err error) {
	var ms runtime.MemStats
	var setM, getM uint64
	if err = c.Set(ctx, key, v); err != nil { // warm up
		return
	}
	if _, err = c.Get(ctx, key); err != nil {
		return
	}
	for range reps {
		runtime.ReadMemStats(&ms)
		m0 := ms.Mallocs
		t := time.Now()
		for range n {
			if err = c.Set(ctx, key, v); err != nil {
				return
			}
		}
		set = append(set, float64(time.Since(t).Nanoseconds())/float64(n))
		runtime.ReadMemStats(&ms)
		setM += ms.Mallocs - m0
		m0 = ms.Mallocs
		t = time.Now()
		for range n {
			if _, err = c.Get(ctx, key); err != nil {
				return
			}
		}
		get = append(get, float64(time.Since(t).Nanoseconds())/float64(n))
		runtime.ReadMemStats(&ms)
		getM += ms.Mallocs - m0
	}
	return set, get, float64(setM) / float64(n*reps), float64(getM) / float64(n*reps), nil
}

func (e *env) suiteCost(ctx context.Context) error {
	type input struct {
		name  string
		raw   []byte
		typed any // Channel, or any for corpus documents
	}
	var inputs []input
	if e.docs != nil {
		for _, d := range e.docs {
			var v any
			if err := json.Unmarshal(d.raw, &v); err != nil {
				return err
			}
			inputs = append(inputs, input{d.name, d.raw, v})
		}
	} else {
		sizes := []int{1 << 10, 10 << 10, 128 << 10, 1 << 20}
		if e.cfg.quick {
			sizes = sizes[:2]
		}
		for _, s := range sizes {
			ch := makeChannel(uint64(s), s)
			raw, _ := json.Marshal(ch)
			inputs = append(inputs, input{"channel " + human(s), raw, ch})
		}
	}
	typ := "Channel (struct, packcache's default serializer)"
	if e.docs != nil {
		typ = "any (packcache's default serializer)"
	}
	e.header("cost", fmt.Sprintf("Time per Set and per Get, µs: median (min–max) of %d runs of N ops each, sequential, one key. Caches use WithCodec(c), the default threshold (1024 B) and WithShareWindow(Off) so that every Get reads Redis and decodes (with the default 10 ms window, repeated Gets of one key share one read). Typed T = %s; []byte rows store the same JSON.", e.cfg.reps, typ))
	fmt.Fprintln(e.out, "| document | JSON bytes | codec | T | N | Set µs | Get µs | Set allocs/op | Get allocs/op | STRLEN |")
	fmt.Fprintln(e.out, "|---|--:|---|---|--:|--:|--:|--:|--:|--:|")
	for ii, in := range inputs {
		n := opsFor(len(in.raw), e.cfg.quick, e.cfg.ops)
		for _, nc := range costCodecs {
			opts := []packcache.Option{packcache.WithCodec(nc.c), packcache.WithShareWindow(packcache.Off)}
			k := e.key("cost", fmt.Sprint(ii), nc.name)
			var set, get []float64
			var sa, ga float64
			var err error
			switch v := in.typed.(type) {
			case Channel:
				c, cerr := packcache.New[Channel](e.rdb, opts...)
				if cerr != nil {
					return cerr
				}
				set, get, sa, ga, err = setGet(ctx, c, k, v, n, e.cfg.reps)
				c.Close()
			default:
				c, cerr := packcache.New[any](e.rdb, opts...)
				if cerr != nil {
					return cerr
				}
				set, get, sa, ga, err = setGet(ctx, c, k, v, n, e.cfg.reps)
				c.Close()
			}
			if err != nil {
				return err
			}
			sl, _, err := e.stored(ctx, k)
			if err != nil {
				return err
			}
			sg := spreadOf(get)
			fmt.Fprintf(e.out, "| %s | %d | %s | typed | %d | %s | %s | %.0f | %.0f | %d |\n", in.name, len(in.raw), nc.name, n, spreadOf(set).us(), sg.us(), sa, ga, sl)
			e.getLat[nc.name] = append(e.getLat[nc.name], chart.Point{X: float64(len(in.raw)), Y: sg.med})

			rc, err := packcache.New[[]byte](e.rdb, opts...)
			if err != nil {
				return err
			}
			set, get, sa, ga, err = setGet(ctx, rc, k, in.raw, n, e.cfg.reps)
			rc.Close()
			if err != nil {
				return err
			}
			fmt.Fprintf(e.out, "| %s | %d | %s | []byte | %d | %s | %s | %.0f | %.0f | %d |\n", in.name, len(in.raw), nc.name, n, spreadOf(set).us(), spreadOf(get).us(), sa, ga, sl)
			e.rdb.Del(ctx, k)
		}
	}
	return e.missCost(ctx, inputs[0].raw, inputs[min(2, len(inputs)-1)].raw)
}

// suiteMiss is the cost suite's misses alone (see missCost), for the
// channels of 1 KB and 128 KB the cost suite uses.
func (e *env) suiteMiss(ctx context.Context) error {
	var docs [][]byte
	for _, s := range []int{1 << 10, 128 << 10} {
		if e.cfg.quick && s > 10<<10 {
			break
		}
		raw, err := json.Marshal(makeChannel(uint64(s), s))
		if err != nil {
			return err
		}
		docs = append(docs, raw)
	}
	return e.missCost(ctx, docs...)
}

// handLeaseStore stores ARGV[2] for ARGV[3] ms only if the key holds the
// lease ARGV[1]: the by-hand miss's store, as a cache that keeps writes
// made during a load must make it.
var handLeaseStore = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1`)

// missCost measures a read-through miss: GetOrLoad of an absent key whose
// loader returns at once, against the same done by hand (GET, then SET of
// the same bytes packcache stores), and by hand with a lease as packcache
// takes it (SET NX GET, then a script that stores only over the lease):
// the same two round trips, the store a script. rueidis does the
// lease-less one by hand with DoCache, and rueidisaside its own with its
// Get and a loader.
func (e *env) missCost(ctx context.Context, docs ...[]byte) error {
	e.header("cost: misses", fmt.Sprintf("A read-through miss: GetOrLoad of an absent key (a new key each time), loader returning at once, packcache.Cache[[]byte], WithShareWindow(Off), default codec; against go-redis GET (a miss) then zstd-compressing and SETting the same bytes, by hand; the same by hand with a lease in two round trips (SET key lease NX GET PX, compress, then a script that stores only over that lease); the same by hand with rueidis (%s), its GET a DoCache (client-side caching); and rueidisaside's Get with a loader that returns the same compressed bytes at once. µs: median (min–max) of %d runs, the subjects' runs interleaved. Commands per miss: INFO commandstats delta of the last run (INFO and rueidis's background PINGs left out). "+
		"Round trips per miss are the commands the client sent and waited for: a script's own GET and SET calls are counted inside it, not as round trips; rueidis sends DoCache's CLIENT CACHING YES, MULTI, PTTL, GET and EXEC in one write, one round trip (counted by its EXEC).", rueidisVersion(), e.cfg.reps))
	fmt.Fprintln(e.out, "| value | subject | N | µs per miss | round trips per miss | commands (per miss) | ratio to by-hand | ratio to by-hand with a lease | ratio to packcache |")
	fmt.Fprintln(e.out, "|---|---|--:|--:|--:|---|--:|--:|--:|")
	for di, doc := range docs {
		c, err := packcache.New[[]byte](e.rdb, packcache.WithShareWindow(packcache.Off))
		if err != nil {
			return err
		}
		n := opsFor(len(doc), e.cfg.quick, e.cfg.ops)
		var seq atomic.Int64
		next := func() string { return fmt.Sprint(seq.Add(1)) }
		pc := func() error {
			k := e.key("miss", "pc", fmt.Sprint(di), next())
			_, err := c.GetOrLoad(ctx, k, func(context.Context) ([]byte, error) { return doc, nil })
			return err
		}
		hand := func() error {
			k := e.key("miss", "hand", fmt.Sprint(di), next())
			if err := e.rdb.Get(ctx, k).Err(); err != redis.Nil {
				return fmt.Errorf("by hand: GET of an absent key: %v", err)
			}
			// What packcache stores: compressed, as the loader's value is.
			stored, err := codec.AppendValue(nil, codec.Zstd, doc)
			if err != nil {
				return err
			}
			return e.rdb.Set(ctx, k, stored, time.Hour).Err()
		}
		var leaseSeq atomic.Uint64
		handLease := func() error {
			k := e.key("miss", "handlease", fmt.Sprint(di), next())
			lease := fmt.Sprintf("\x0chand%012d", leaseSeq.Add(1))
			if err := e.rdb.SetArgs(ctx, k, lease, redis.SetArgs{Mode: "NX", Get: true, TTL: 3 * time.Second}).Err(); err != redis.Nil {
				return fmt.Errorf("by hand: SET NX GET of an absent key: %v", err)
			}
			stored, err := codec.AppendValue(nil, codec.Zstd, doc)
			if err != nil {
				return err
			}
			n, err := handLeaseStore.Run(ctx, e.rdb, []string{k}, lease, stored, time.Hour.Milliseconds()).Int()
			if err == nil && n != 1 {
				err = errors.New("by hand: the store found no lease")
			}
			return err
		}
		rm, err := newRueidisMisses(ctx, e, di, doc, next)
		if err != nil {
			c.Close()
			return err
		}
		type subj struct {
			name string
			f    func() error
			// trips is the round trips of cmds, a run's commands.
			trips func(cmds map[string]int64) int64
			ts    []float64
			cmds  map[string]int64
		}
		scripts := func(c map[string]int64) int64 { return c["evalsha"] + c["eval"] }
		subs := []*subj{
			{name: "by hand: GET, compress, SET", f: hand, trips: func(c map[string]int64) int64 { return c["get"] + c["set"] }},
			// packcache's read places the lease (SET NX GET); its store
			// script makes one GET and one SET of its own inside Redis.
			{name: "packcache GetOrLoad", f: pc, trips: func(c map[string]int64) int64 { return c["get"] + c["set"] - scripts(c) }},
			// The same two round trips by hand: the lease by SET NX
			// GET, then a script that stores only over it (one GET and
			// one SET of its own).
			{name: "by hand with a lease: SET NX GET PX, compress, store script", f: handLease, trips: func(c map[string]int64) int64 { return c["get"] + c["set"] - scripts(c) }},
			{name: "rueidis by hand: DoCache GET, compress, SET", f: rm.hand, trips: func(c map[string]int64) int64 { return c["exec"] + c["set"] }},
			// DoCache's GET (its EXEC), the lock (SET NX GET PX), and
			// the script that stores the value, which makes a GET and
			// a SET of its own.
			{name: "rueidisaside Get", f: rm.aside, trips: func(c map[string]int64) int64 {
				lock := c["set"] - scripts(c)
				return c["exec"] + lock + scripts(c)
			}},
		}
		// Warm up: the scripts, loaded once per node; rueidis's
		// connections, dialled as they are first picked; rueidisaside's
		// client marker, SET once per client.
		for _, s := range subs {
			for range 20 {
				if err := s.f(); err != nil {
					c.Close()
					rm.close()
					return fmt.Errorf("%s: %w", s.name, err)
				}
			}
		}
		for range e.cfg.reps {
			for _, s := range subs { // interleaved, so that noise falls on all
				before, err := e.cmdCalls(ctx)
				if err != nil {
					return err
				}
				t := time.Now()
				for range n {
					if err := s.f(); err != nil {
						return fmt.Errorf("%s: %w", s.name, err)
					}
				}
				s.ts = append(s.ts, float64(time.Since(t).Nanoseconds())/float64(n))
				after, err := e.cmdCalls(ctx)
				if err != nil {
					return err
				}
				s.cmds = map[string]int64{} // the last run's
				for name, v := range after {
					if d := v - before[name]; d > 0 && name != "info" && name != "ping" {
						s.cmds[name] = d
					}
				}
			}
		}
		c.Close()
		rm.close()
		base, pcMed, leaseMed := spreadOf(subs[0].ts).med, spreadOf(subs[1].ts).med, spreadOf(subs[2].ts).med
		for _, s := range subs {
			var names []string
			for name, v := range s.cmds {
				names = append(names, fmt.Sprintf("%s %.2f", name, float64(v)/float64(n)))
			}
			slices.Sort(names)
			sp := spreadOf(s.ts)
			fmt.Fprintf(e.out, "| %s | %s | %d | %s | %.2f | %s | %.2f | %.2f | %.2f |\n", human(len(doc)), s.name, n, sp.us(), float64(s.trips(s.cmds))/float64(n), strings.Join(names, ", "), sp.med/base, sp.med/leaseMed, sp.med/pcMed)
		}
	}
	fmt.Fprintf(e.out, "\n%s every subject stores the same compressed bytes (packcache's stored format) and returns the loaded value without decoding it, but only packcache, the by-hand row with a lease and rueidisaside lock the key for the load, and differently: packcache's lease is a token of each load's own with an expiry, and readers waiting for a load poll; rueidisaside's lock is its client's id (a key rueidisid:… of its own, SET on its first miss and refreshed every ClientTTL/2, tells others the client is alive; ClientTTL is %v here, not the default 10 s, so that no refresh falls in another subject's counts), and readers waiting for a load wait for the key's invalidation. Both store only if their lock is still in the key (a script), so a write made meanwhile wins. The other by-hand rows take no lock. rueidis's DoCache GET also has Redis track the key for the client, which sends an invalidation when the value is stored.\n", notLikeForLike, asideClientTTL)
	return nil
}

// ---------------------------------------------------------------- bulk

// parallel runs f(i) for i in [0, n) on workers goroutines.
func parallel(n, workers int, f func(i int) error) error {
	var next atomic.Int64
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

func (e *env) suiteBulk(ctx context.Context) error {
	n := e.cfg.bulkN
	size := 128 << 10
	if e.cfg.quick {
		size = 16 << 10
	}
	pool := make([]Channel, 16)
	for i := range pool {
		pool[i] = makeChannel(uint64(1000+i), size)
	}
	e.header("bulk", fmt.Sprintf("Set %d channels of %s (packcache.Cache[Channel], WithCodec(c); 16 distinct documents cycled, every key its own value in Redis), then Get all %d; sequential and with 16 goroutines. Seconds per phase and Redis used_memory growth over the Set phase.", n, human(size), n))
	fmt.Fprintln(e.out, "| codec | mode | Set s | Get s | Set ops/s | Get ops/s | used_memory growth MiB | per value B |")
	fmt.Fprintln(e.out, "|---|---|--:|--:|--:|--:|--:|--:|")
	for _, nc := range bulkCodecs {
		for _, workers := range []int{1, 16} {
			if err := e.reset(ctx); err != nil {
				return err
			}
			c, err := packcache.New[Channel](e.rdb, packcache.WithCodec(nc.c))
			if err != nil {
				return err
			}
			m0, err := e.usedMemory(ctx)
			if err != nil {
				return err
			}
			t := time.Now()
			err = parallel(n, workers, func(i int) error {
				return c.Set(ctx, e.key("bulk", fmt.Sprint(i)), pool[i%len(pool)])
			})
			setD := time.Since(t)
			if err != nil {
				return err
			}
			m1, err := e.usedMemory(ctx)
			if err != nil {
				return err
			}
			t = time.Now()
			err = parallel(n, workers, func(i int) error {
				_, err := c.Get(ctx, e.key("bulk", fmt.Sprint(i)))
				return err
			})
			getD := time.Since(t)
			c.Close()
			if err != nil {
				return err
			}
			mode := "sequential"
			if workers > 1 {
				mode = fmt.Sprintf("%d goroutines", workers)
			}
			fmt.Fprintf(e.out, "| %s | %s | %.2f | %.2f | %.0f | %.0f | %s | %d |\n", nc.name, mode, setD.Seconds(), getD.Seconds(),
				float64(n)/setD.Seconds(), float64(n)/getD.Seconds(), mib(m1-m0), (m1-m0)/int64(n))
		}
	}
	return e.reset(ctx)
}

// ---------------------------------------------------------------- backlog

func (e *env) suiteBacklog(ctx context.Context) error {
	n := e.cfg.backlogN
	pool := make([][]byte, 16)
	for i := range pool {
		pool[i], _ = json.Marshal(makeChannel(uint64(2000+i), 10<<10))
	}
	e.header("backlog", fmt.Sprintf("Redis used_memory growth for %d values of ~10 KB (chat channel JSON, 16 distinct documents cycled) per setting, written with packcache.Cache[json.RawMessage] and WithCodec(c) (default threshold).", n))
	fmt.Fprintln(e.out, "| setting | used_memory growth MiB | per value B | mean STRLEN | vs plain |")
	fmt.Fprintln(e.out, "|---|--:|--:|--:|--:|")
	var plain int64
	for _, nc := range backlogCodecs {
		if err := e.reset(ctx); err != nil {
			return err
		}
		c, err := packcache.New[json.RawMessage](e.rdb, packcache.WithCodec(nc.c))
		if err != nil {
			return err
		}
		m0, err := e.usedMemory(ctx)
		if err != nil {
			return err
		}
		if err := parallel(n, 8, func(i int) error {
			return c.Set(ctx, e.key("backlog", fmt.Sprint(i)), pool[i%len(pool)])
		}); err != nil {
			return err
		}
		m1, err := e.usedMemory(ctx)
		if err != nil {
			return err
		}
		st := c.Stats()
		var out, vals uint64
		for _, cs := range st.Codecs {
			out += cs.BytesOut
			vals += cs.Values
		}
		c.Close()
		d := m1 - m0
		if nc == plainCodec {
			plain = d
		}
		fmt.Fprintf(e.out, "| %s | %s | %d | %d | %.3f |\n", nc.name, mib(d), d/int64(n), out/max(vals, 1), float64(d)/float64(plain))
	}
	return e.reset(ctx)
}

// ---------------------------------------------------------------- surge

type surgeResult struct {
	wall     time.Duration
	p50, p99 time.Duration
	gets     int64
	sets     int64
	scripts  int64 // EVALSHA and EVAL calls
	loads    int64
	decodes  int64
	peakHeap uint64 // growth of heap objects bytes over the pre-surge level (after a GC), peak sampled during the surge
	baseHeap uint64 // heap objects bytes before the surge
	nearHits uint64 // Gets the subject's near cache answered, if it counts them
	errs     int64
	firstErr error
}

// runSurge starts n goroutines that wait on a barrier, then each calls f.
func (e *env) runSurge(ctx context.Context, n int, f func() error) (surgeResult, error) {
	var r surgeResult
	runtime.GC()
	before, err := e.cmdCalls(ctx)
	if err != nil {
		return r, err
	}
	lat := make([]time.Duration, n)
	start := make(chan struct{})
	var wg, ready sync.WaitGroup
	var errs atomic.Int64
	var firstErr atomic.Pointer[error]
	var t0 time.Time
	for i := range n {
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			ready.Done()
			<-start
			err := f()
			lat[i] = time.Since(t0)
			if err != nil {
				errs.Add(1)
				firstErr.CompareAndSwap(nil, &err)
			}
		}()
	}
	ready.Wait()
	runtime.GC()
	base := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(base)
	r.baseHeap = base[0].Value.Uint64()
	// Sample the heap while the surge runs.
	stop := make(chan struct{})
	peak := make(chan uint64)
	go func() {
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		var max uint64
		tk := time.NewTicker(200 * time.Microsecond)
		defer tk.Stop()
		for {
			metrics.Read(s)
			if v := s[0].Value.Uint64(); v > max {
				max = v
			}
			select {
			case <-stop:
				peak <- max
				return
			case <-tk.C:
			}
		}
	}()
	t0 = time.Now()
	close(start)
	wg.Wait()
	r.wall = time.Since(t0)
	close(stop)
	if p := <-peak; p > r.baseHeap {
		r.peakHeap = p - r.baseHeap
	}
	after, err := e.cmdCalls(ctx)
	if err != nil {
		return r, err
	}
	r.gets = after["get"] - before["get"]
	r.sets = after["set"] - before["set"]
	r.scripts = after["evalsha"] - before["evalsha"] + after["eval"] - before["eval"]
	slices.Sort(lat)
	r.p50, r.p99 = lat[n/2], lat[n*99/100]
	r.errs = errs.Load()
	if p := firstErr.Load(); p != nil {
		r.firstErr = *p
	}
	return r, nil
}

// countingJSON is packcache.JSON counting its decodes.
type countingJSON struct{ n *atomic.Int64 }

func (c countingJSON) Marshal(dst []byte, v any) ([]byte, error) {
	return packcache.JSON.Marshal(dst, v)
}
func (c countingJSON) Unmarshal(data []byte, v any) error {
	c.n.Add(1)
	return packcache.JSON.Unmarshal(data, v)
}
func (c countingJSON) Text() bool { return true }

const loaderDelay = 50 * time.Millisecond

// surgeSubject is one way of reading a key under a surge.
type surgeSubject struct {
	name    string
	prepare func(ctx context.Context, key string, warm bool) error // store the value (warm) or make sure it is absent
	get     func(ctx context.Context, key string) error
	loads   *atomic.Int64
	decodes *atomic.Int64
	close   func()

	// nearHits, for packcache subjects, reads Stats().NearHits: Gets
	// answered by the near cache (WithLocalCache).
	nearHits func() uint64
}

func packcacheSubject(e *env, name string, ch Channel, opts ...packcache.Option) (*surgeSubject, error) {
	s := &surgeSubject{name: name, loads: new(atomic.Int64), decodes: new(atomic.Int64)}
	loader := packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
		s.loads.Add(1)
		time.Sleep(loaderDelay)
		return ch, nil
	})
	opts = append([]packcache.Option{packcache.WithSerializer(countingJSON{s.decodes}), packcache.WithLoader[Channel](loader)}, opts...)
	c, err := packcache.New[Channel](e.rdb, opts...)
	if err != nil {
		return nil, err
	}
	s.prepare = func(ctx context.Context, key string, warm bool) error {
		if warm {
			return c.Set(ctx, key, ch)
		}
		return c.Delete(ctx, key)
	}
	s.get = func(ctx context.Context, key string) error {
		v, err := c.Get(ctx, key)
		if err == nil && len(v.Messages) != len(ch.Messages) {
			err = errors.New("wrong value")
		}
		return err
	}
	s.close = func() { c.Close() }
	s.nearHits = func() uint64 { return c.Stats().NearHits }
	return s, nil
}

// noopSubject calibrates a surge: each goroutine returns at once, so its
// wall time is what starting and scheduling the goroutines costs here.
func noopSubject() *surgeSubject {
	return &surgeSubject{
		name:    "calibration: no-op",
		prepare: func(context.Context, string, bool) error { return nil },
		get:     func(context.Context, string) error { return nil },
		loads:   new(atomic.Int64), decodes: new(atomic.Int64),
	}
}

// surgeReps is how many times a surge table runs each subject on each key.
// A surge's wall time moves much from one run to the next on a shared
// machine (scheduling 20,000 goroutines is most of it), so each subject
// runs several times, the runs of all subjects interleaved, and a
// statistic of the runs is reported and judged.
func (e *env) surgeReps() int { return min(e.cfg.reps, 3) }

// A surgeStat is how a table reduces a subject's runs on one key to its
// row.
type surgeStat int

const (
	// medianRun reports the run of median wall time, every column from
	// that run.
	medianRun surgeStat = iota
	// worstRuns reports the median wall, p50 and p99 over the runs, and of
	// the counts the worst of any run: the most Redis commands, loader
	// calls, decodes and heap growth, the fewest near hits.
	worstRuns
)

// A surgeRow is what a surge table reports of a subject's runs on one
// key: the statistic's surgeResult, whose errors are those of all runs,
// and the spread of the runs' wall times in ms.
type surgeRow struct {
	surgeResult
	wallMs spread
}

// reduce makes the row of runs rs (at least one) by statistic st.
func (st surgeStat) reduce(rs []surgeResult) surgeRow {
	byWall := slices.SortedFunc(slices.Values(rs), func(a, b surgeResult) int { return cmp.Compare(a.wall, b.wall) })
	row := surgeRow{surgeResult: byWall[len(byWall)/2]}
	row.wallMs = spread{med: ms(row.wall), min: ms(byWall[0].wall), max: ms(byWall[len(byWall)-1].wall)}
	row.errs, row.firstErr = 0, nil
	for _, r := range rs {
		row.errs += r.errs
		if row.firstErr == nil {
			row.firstErr = r.firstErr
		}
	}
	if st == medianRun {
		return row
	}
	var p50, p99 []time.Duration
	for _, r := range rs {
		p50, p99 = append(p50, r.p50), append(p99, r.p99)
		row.gets, row.sets, row.loads = max(row.gets, r.gets), max(row.sets, r.sets), max(row.loads, r.loads)
		row.decodes, row.peakHeap = max(row.decodes, r.decodes), max(row.peakHeap, r.peakHeap)
		row.nearHits = min(row.nearHits, r.nearHits)
	}
	slices.Sort(p50)
	slices.Sort(p99)
	row.p50, row.p99 = p50[len(p50)/2], p99[len(p99)/2]
	return row
}

// surge is the surge runner of every suite. Each of e.surgeReps() times,
// every subject in turn prepares its key of suite's, "warm" (stored, and
// for a near cache served by it) or "cold" (absent), and has e.cfg.surgeN
// goroutines Get it at once. It returns each subject's runs reduced by
// st, by subject name, and records a subject's errors, in any run, in
// e.errs.
func (e *env) surge(ctx context.Context, suite string, subjects []*surgeSubject, kind string, st surgeStat) (map[string]surgeRow, error) {
	warm := kind == "warm"
	key := func(s *surgeSubject) string { return e.key(suite, "surge", s.name, kind) }
	runs := make(map[*surgeSubject][]surgeResult, len(subjects))
	for range e.surgeReps() {
		for _, s := range subjects {
			if err := s.prepare(ctx, key(s), warm); err != nil {
				return nil, fmt.Errorf("%s: %w", s.name, err)
			}
			s.loads.Store(0)
			s.decodes.Store(0)
			var h0 uint64
			if s.nearHits != nil {
				h0 = s.nearHits()
			}
			r, err := e.runSurge(ctx, e.cfg.surgeN, func() error { return s.get(ctx, key(s)) })
			if err != nil {
				return nil, err
			}
			r.loads, r.decodes = s.loads.Load(), s.decodes.Load()
			if s.nearHits != nil {
				r.nearHits = s.nearHits() - h0
			}
			runs[s] = append(runs[s], r)
			runtime.GC()
		}
	}
	rows := make(map[string]surgeRow, len(subjects))
	for _, s := range subjects {
		if err := e.rdb.Del(ctx, key(s)).Err(); err != nil {
			return nil, err
		}
		row := st.reduce(runs[s])
		if row.firstErr != nil {
			e.errs = append(e.errs, fmt.Errorf("%s: surge of %s, %s: %d errors, first: %w", suite, s.name, kind, row.errs, row.firstErr))
		}
		rows[s.name] = row
	}
	return rows, nil
}

// surgeTable prints the surges of subjects on a warm key and on a cold
// one, each row the median run, and puts the rows in out by subject
// name + "/warm" or "/cold".
func (e *env) surgeTable(ctx context.Context, suite string, subjects []*surgeSubject, out map[string]surgeRow) error {
	fmt.Fprintf(e.out, "Each row is the median run (by wall time) of %d, the subjects' runs interleaved; wall min–max in brackets; errors: all runs.\n\n", e.surgeReps())
	fmt.Fprintln(e.out, "| subject | key | wall ms | p50 ms | p99 ms | Redis GETs | Redis SETs | loader calls | decodes | heap before MiB | peak heap growth MiB | errors |")
	fmt.Fprintln(e.out, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, kind := range []string{"warm", "cold"} {
		rows, err := e.surge(ctx, suite, subjects, kind, medianRun)
		if err != nil {
			return err
		}
		for _, s := range subjects {
			r := rows[s.name]
			out[s.name+"/"+kind] = r
			errCol := fmt.Sprint(r.errs)
			if r.firstErr != nil {
				errCol += " (" + r.firstErr.Error() + ")"
			}
			fmt.Fprintf(e.out, "| %s | %s | %.1f (%.1f–%.1f) | %.1f | %.1f | %d | %d | %d | %d | %.1f | %.1f | %s |\n", s.name, kind,
				r.wallMs.med, r.wallMs.min, r.wallMs.max, ms(r.p50), ms(r.p99), r.gets, r.sets, r.loads, r.decodes, float64(r.baseHeap)/(1<<20), float64(r.peakHeap)/(1<<20), errCol)
		}
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func (e *env) suiteSurge(ctx context.Context) error {
	size := 128 << 10
	ch := makeChannel(7, size)
	raw, _ := json.Marshal(ch)
	def, near, closeBoth, err := surgePair(e, ch)
	if err != nil {
		return err
	}
	defer closeBoth()
	// 20,000 uncoalesced reads of 128 KB wait seconds for the 64 pooled
	// connections: a budget long enough for that, so that the row measures
	// what coalescing saves rather than the breaker shedding load.
	noco, err := packcacheSubject(e, "packcache WithCoalescing(false)", ch, packcache.WithCoalescing(false), packcache.WithRedisTimeout(time.Minute))
	if err != nil {
		return err
	}
	defer noco.close()
	gc := goCachePeer(e, nGCOnce, false, ch).surgeSubject(ch)
	note := "exact: own server"
	if !e.own {
		note = "approximate: shared server, other clients' commands included"
	}
	e.header("surge", fmt.Sprintf("%d goroutines released at once on one warm key (a %d-byte channel, packcache.Cache[Channel]) and on one cold key (loader sleeps %v). GETs/SETs: INFO commandstats delta (%s). Decodes: a counting JSON serializer. Peak heap growth: runtime/metrics /memory/classes/heap/objects:bytes (≈ HeapAlloc) sampled every 200 µs, minus its level after a GC just before the release (the process's own live data, such as zstd encoder tables of earlier suites, is the \"heap before\" column). "+
		"%s is WithLocalCache(LocalCache{MaxBytes: %d << 20, TTL: %v}); warm, the near cache has served the key before the release; cold, it cannot help (a loaded value is stored, a write, and enters the near cache only when a Get reads it back). %s is go-redis/cache v9 (msgpack+s2) without a local cache.",
		e.cfg.surgeN, len(raw), loaderDelay, note, nNear, nearLocal.MaxBytes>>20, nearLocal.TTL, nGCOnce))
	out := map[string]surgeRow{}
	if err := e.surgeTable(ctx, "surge", []*surgeSubject{def, near, noco, gc, noopSubject()}, out); err != nil {
		return err
	}
	d, n, g := out[nDef+"/warm"], out[nNear+"/warm"], out[nGCOnce+"/warm"]
	dc, nc, gc2 := out[nDef+"/cold"], out[nNear+"/cold"], out[nGCOnce+"/cold"]
	fmt.Fprintf(e.out, "\ngo-redis/cache Once took, warm, %s as long as packcache default and %s as long as packcache with the near cache; cold, %s and %s.\n",
		fmtRatio(float64(g.wall)/float64(d.wall)), fmtRatio(float64(g.wall)/float64(n.wall)), fmtRatio(float64(gc2.wall)/float64(dc.wall)), fmtRatio(float64(gc2.wall)/float64(nc.wall)))
	e.printTargets("surge: targets", surgeTargets(ms(d.wall), ms(n.wall), ms(g.wall), n.gets, n.decodes))
	return nil
}
