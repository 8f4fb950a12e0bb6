package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	mrand "math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
)

// The outage mode (-outage) checks that an invalidation survives Redis
// stopping: the cache-aside trial, made to repeat. The soak starts
// its own redis-server and stops it (SIGSTOP) and resumes it (SIGCONT) over
// and over. Writers update a source of truth (in memory, one version per
// key) and invalidate the cache on every update, with Delete (cache-aside)
// or Set (write-through); readers Get through a loader that takes its
// snapshot of the source and then takes loadDelay more to return, so loads
// race the writes. A write is confirmed, in the model, once its call has
// returned, whatever it returned: a caller that got ErrPending does
// nothing more.
//
// Half the keys are written all the time, the other half one at a time in
// turn, every few seconds each, so that a lost invalidation is not covered
// at once by the next write.
//
// Checks:
//   - stale reads: a Get begun at least settle after a SIGCONT (and before
//     the next SIGSTOP) that returns a version older than the one confirmed
//     when it began. Reads at other times are counted too, and reported.
//   - stale in Redis: the same check made by another client and cache
//     (no loader, no coalescing, no breaker: another process, in effect),
//     which sees what Redis holds; ErrMiss is no value and passes.
//   - writes undone: once the last resume has settled and no invalidation
//     is pending, every key either holds, in Redis, at least the source's
//     latest version, or nothing.
//   - every failed write returned ErrPending (and ErrRedis), no invalidation
//     is still pending at the end, the Stats identity holds, Close returns
//     nil, and no goroutine is left.
type outageConfig struct {
	duration         time.Duration
	readers, writers int
	keys             int
	minSize, maxSize int
	stopMin, stopMax time.Duration // how long Redis stays stopped
	runMin, runMax   time.Duration // how long it runs between stops
	settle           time.Duration // after a SIGCONT, reads begun this much later are checked
	loadDelay        time.Duration // the loader's time after its snapshot
	writePause       time.Duration // each busy writer's pause between updates, at most
	quietEvery       time.Duration // the quiet writer's pace
	redisTimeout     time.Duration // WithRedisTimeout
}

func defaultOutageConfig() outageConfig {
	return outageConfig{
		duration: time.Minute,
		readers:  16, writers: 4, keys: 64,
		minSize: 1 << 10, maxSize: 64 << 10,
		stopMin: time.Second, stopMax: 2 * time.Second,
		runMin: 2 * time.Second, runMax: 3 * time.Second,
		settle:     time.Second,
		loadDelay:  200 * time.Millisecond,
		writePause: 4 * time.Millisecond,
		quietEvery: 100 * time.Millisecond,
		// Shorter than the default second, so that an outage of 1-2 s
		// fails several writes of each writer and opens the breaker:
		// writes are refused by it, too.
		redisTimeout: 250 * time.Millisecond,
	}
}

// Doc is what the outage mode stores: one version of a key's row.
type Doc struct {
	Key     string
	Version uint64
	Body    string
	Sum     uint32
}

// row is the source of truth for one key.
type row struct {
	mu        sync.Mutex    // one write of the key at a time
	version   atomic.Uint64 // the source's version (written before the cache is invalidated)
	confirmed atomic.Uint64 // the version whose invalidation call has returned
}

// phase says whether Redis runs and since when.
type phase struct {
	stopped atomic.Bool
	resumed atomic.Int64 // unix nanoseconds of the last SIGCONT (or the start)
}

// settled reports whether a read begun at t is one that must not be
// stale: Redis running, and resumed at least settle before t.
func (p *phase) settled(t time.Time, settle time.Duration) bool {
	return !p.stopped.Load() && t.UnixNano()-p.resumed.Load() >= int64(settle)
}

type outageReport struct {
	cfg     outageConfig
	addr    string
	elapsed time.Duration
	outages int
	stopped time.Duration // in all

	writes, deletes, sets, pending atomic.Uint64
	pendingOpen                    atomic.Uint64 // of pending: refused by the open breaker, never sent
	own, other                     reads         // this process's Gets through the loader; another client's
	loaderCalls                    atomic.Uint64

	mu        sync.Mutex
	writeErrs map[string]uint64 // failed writes without ErrPending, by kind
	bad       []string          // examples of failed checks
	badValues uint64            // values of the wrong key or failing their checksum

	drains     []time.Duration // per resume: SIGCONT to no invalidation pending
	undrained  int             // resumes after which some were still pending at the next SIGSTOP
	leftMax    int             // the most still pending at a SIGSTOP
	quietDrain time.Duration   // from the end of the writes to none pending
	present    int             // keys holding a value at the end
	absent     int             // keys holding none
	undone     int             // keys holding a version older than the source's last
	checkErrs  int             // keys the final check could not read
	finalWait  time.Duration   // from the last SIGCONT to the final check
	stats      packcache.Stats // at the final check
	closeErr   error
	closeTook  time.Duration
	goroutines [2]int
	leakDetail string
}

// reads counts the Gets of one group of readers.
type reads struct {
	n, settled       atomic.Uint64     // Gets; those begun once a resume had settled
	stale, unsettled atomic.Uint64     // stale ones, settled or not
	misses           atomic.Uint64     // ErrMiss
	errs             map[string]uint64 // other errors by kind, under outageReport.mu
}

func (r *outageReport) example(format string, args ...any) {
	r.mu.Lock()
	if len(r.bad) < 8 {
		r.bad = append(r.bad, fmt.Sprintf(format, args...))
	}
	r.mu.Unlock()
}

func (r *outageReport) count(m map[string]uint64, op string, err error) {
	r.mu.Lock()
	m[op+"/"+errKind(err)]++
	r.mu.Unlock()
}

func sum(m map[string]uint64) (n uint64) {
	for _, c := range m {
		n += c
	}
	return n
}

func (r *outageReport) failures() []string {
	var f []string
	if n := r.own.stale.Load(); n > 0 {
		f = append(f, fmt.Sprintf("%d stale reads after a resume settled", n))
	}
	if n := r.other.stale.Load(); n > 0 {
		f = append(f, fmt.Sprintf("%d stale values read from Redis by another client after a resume settled", n))
	}
	if r.undone > 0 {
		f = append(f, fmt.Sprintf("%d writes undone: keys holding, in Redis, a version older than the source's last", r.undone))
	}
	if r.checkErrs > 0 {
		f = append(f, fmt.Sprintf("%d keys the final check could not read", r.checkErrs))
	}
	if r.badValues > 0 {
		f = append(f, fmt.Sprintf("%d values of the wrong key or failing their checksum", r.badValues))
	}
	if n := sum(r.writeErrs); n > 0 {
		f = append(f, fmt.Sprintf("%d writes failed without ErrPending: %v", n, r.writeErrs))
	}
	if n := sum(r.own.errs); n > 0 {
		f = append(f, fmt.Sprintf("%d Gets through the loader failed: %v", n, r.own.errs))
	}
	st := r.stats
	if st.Pending > 0 {
		f = append(f, fmt.Sprintf("%d invalidations still pending %v after the last SIGCONT", st.Pending, r.finalWait.Round(time.Millisecond)))
	}
	if st.PendingKept != uint64(st.Pending)+st.PendingApplied+st.PendingExpired {
		f = append(f, fmt.Sprintf("Stats: PendingKept %d != Pending %d + PendingApplied %d + PendingExpired %d",
			st.PendingKept, st.Pending, st.PendingApplied, st.PendingExpired))
	}
	if st.PendingDropped > 0 {
		f = append(f, fmt.Sprintf("%d failed invalidations dropped past the bound", st.PendingDropped))
	}
	if r.closeErr != nil {
		f = append(f, fmt.Sprintf("Close: %v", r.closeErr))
	}
	if r.goroutines[1] > r.goroutines[0] {
		f = append(f, fmt.Sprintf("goroutines: %d at start, %d after Close\n%s", r.goroutines[0], r.goroutines[1], r.leakDetail))
	}
	if r.writes.Load() == 0 || r.own.settled.Load() == 0 || r.outages == 0 {
		f = append(f, fmt.Sprintf("too little happened to check: %d writes, %d settled reads, %d outages", r.writes.Load(), r.own.settled.Load(), r.outages))
	}
	if len(r.bad) > 0 && len(f) > 0 {
		f = append(f, "e.g. "+strings.Join(r.bad, "; "))
	}
	return f
}

// runOutage runs the outage mode against a redis-server of its own.
func runOutage(cfg outageConfig, out io.Writer) (*outageReport, error) {
	rep := &outageReport{cfg: cfg, writeErrs: map[string]uint64{}}
	rep.own.errs, rep.other.errs = map[string]uint64{}, map[string]uint64{}
	srv, err := startRedis()
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	rep.addr = srv.addr
	rep.goroutines[0] = runtime.NumGoroutine() // the server's waiter included

	var rnd [6]byte
	rand.Read(rnd[:])
	base := "outage:" + hex.EncodeToString(rnd[:]) + ":"
	keys := make([]string, cfg.keys)
	index := make(map[string]int, cfg.keys)
	rows := make([]row, cfg.keys)
	for i := range keys {
		keys[i] = base + strconv.Itoa(i)
		index[keys[i]] = i
	}
	corpus := makeCorpus(cfg.maxSize+4096, mrand.New(mrand.NewPCG(1, 2)))
	// doc is version v of key i, the same every time it is made.
	doc := func(i int, v uint64) Doc {
		r := mrand.New(mrand.NewPCG(uint64(i), v))
		lo, hi := math.Log(float64(cfg.minSize)), math.Log(float64(cfg.maxSize))
		n := int(math.Exp(lo + r.Float64()*(hi-lo)))
		off := r.IntN(len(corpus) - n + 1)
		d := Doc{Key: keys[i], Version: v, Body: corpus[off : off+n]}
		d.Sum = crc32.ChecksumIEEE([]byte(d.Body))
		return d
	}
	valid := func(i int, d Doc) bool { return d.Key == keys[i] && crc32.ChecksumIEEE([]byte(d.Body)) == d.Sum }

	// The client as docs/operations.md says.
	newClient := func(pool int) *redis.Client {
		return redis.NewClient(&redis.Options{Addr: srv.addr, ContextTimeoutEnabled: true,
			DialTimeout: 200 * time.Millisecond, DialerRetries: 1, MaxRetries: -1, PoolSize: pool})
	}
	rdb := newClient(cfg.readers + cfg.writers + 8)
	loader := packcache.LoaderFunc[Doc](func(ctx context.Context, key string) (Doc, error) {
		i, ok := index[key]
		if !ok {
			return Doc{}, packcache.ErrNotFound
		}
		rep.loaderCalls.Add(1)
		v := rows[i].version.Load() // the query's snapshot; the rest is the slow part
		t := time.NewTimer(cfg.loadDelay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return Doc{}, ctx.Err()
		}
		return doc(i, v), nil
	})
	cache, err := packcache.New[Doc](rdb, packcache.WithTTL(time.Hour), packcache.WithLoader(loader),
		packcache.WithRedisTimeout(cfg.redisTimeout))
	if err != nil {
		rdb.Close()
		return nil, err
	}
	// Another process, in effect: its own client, no loader, no sharing of
	// reads (a shared read may have begun before a write), no breaker (it
	// reads as soon as Redis answers again).
	odb := newClient(cfg.readers + 8)
	other, err := packcache.New[Doc](odb, packcache.WithTTL(time.Hour), packcache.WithRedisTimeout(cfg.redisTimeout),
		packcache.WithCoalescing(false), packcache.WithCircuitBreaker(packcache.Off, 0))
	if err != nil {
		cache.Close()
		rdb.Close()
		odb.Close()
		return nil, err
	}
	closeAll := func() {
		t0 := time.Now()
		rep.closeErr = cache.Close()
		rep.closeTook = time.Since(t0)
		other.Close()
		rdb.Close()
		odb.Close()
	}

	ctx, cancel := context.WithTimeout(context.Background(), cfg.duration+time.Minute)
	defer cancel()
	for i := range keys {
		rows[i].version.Store(1)
		rows[i].confirmed.Store(1)
		if err := cache.Set(ctx, keys[i], doc(i, 1)); err != nil {
			closeAll()
			return nil, fmt.Errorf("seeding %s: %w", keys[i], err)
		}
	}

	var ph phase
	start := time.Now()
	ph.resumed.Store(start.UnixNano())
	deadline := start.Add(cfg.duration)
	var wg sync.WaitGroup

	// Redis: stopped and resumed until the deadline, and left running.
	outageDone := make(chan struct{})
	var lastResume time.Time
	go func() {
		defer close(outageDone)
		r := mrand.New(mrand.NewPCG(uint64(start.UnixNano()), 3))
		between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(r.Int64N(int64(hi-lo)+1)) }
		lastResume = start
		for {
			// Running: see how soon the invalidations owed drain.
			runEnd := time.Now().Add(between(cfg.runMin, cfg.runMax))
			drained := false
			for now := time.Now(); now.Before(runEnd) && now.Before(deadline); now = time.Now() {
				if !drained && rep.outages > 0 && cache.Stats().Pending == 0 {
					drained = true
					rep.drains = append(rep.drains, now.Sub(lastResume))
				}
				time.Sleep(5 * time.Millisecond)
			}
			if !time.Now().Before(deadline) {
				return // the last resume is judged by the final check
			}
			if !drained && rep.outages > 0 {
				rep.undrained++
				rep.leftMax = max(rep.leftMax, cache.Stats().Pending)
			}
			ph.stopped.Store(true)
			if err := srv.pause(); err != nil {
				rep.example("SIGSTOP: %v", err)
				ph.stopped.Store(false)
				return
			}
			stoppedAt := time.Now()
			rep.outages++
			time.Sleep(min(between(cfg.stopMin, cfg.stopMax), max(time.Until(deadline), 0)))
			if err := srv.resume(); err != nil {
				rep.example("SIGCONT: %v", err)
			}
			lastResume = time.Now()
			rep.stopped += lastResume.Sub(stoppedAt)
			ph.resumed.Store(lastResume.UnixNano())
			ph.stopped.Store(false)
		}
	}()

	// write updates key i in the source, then invalidates it: a Delete
	// (cache-aside) or a Set of the new version (write-through).
	write := func(r *mrand.Rand, i int) {
		row := &rows[i]
		row.mu.Lock()
		defer row.mu.Unlock()
		v := row.version.Add(1) // the database commits first
		var err error
		op := "delete"
		if r.IntN(2) == 0 {
			err = cache.Delete(ctx, keys[i])
			rep.deletes.Add(1)
		} else {
			op = "set"
			err = cache.Set(ctx, keys[i], doc(i, v))
			rep.sets.Add(1)
		}
		rep.writes.Add(1)
		switch {
		case err == nil:
		case errors.Is(err, packcache.ErrPending) && errors.Is(err, packcache.ErrRedis):
			rep.pending.Add(1)
			if errors.Is(err, packcache.ErrCircuitOpen) {
				rep.pendingOpen.Add(1)
			}
		default:
			rep.count(rep.writeErrs, op, err)
			rep.example("%s %s: %v", op, keys[i], err)
		}
		row.confirmed.Store(v) // returned: the caller does nothing more
	}
	// The busy half of the keys is written all the time, so loads race
	// writes; but a lost invalidation of a busy key is soon covered by the
	// next write. The quiet half is written in turn, one key every
	// quietEvery, so a quiet key is written once every few seconds and an
	// invalidation lost in an outage would still show when the resume has
	// settled.
	busy := max(cfg.keys/2, 1)
	for w := range cfg.writers {
		wg.Go(func() {
			r := mrand.New(mrand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for time.Now().Before(deadline) {
				write(r, r.IntN(busy))
				time.Sleep(time.Duration(r.Int64N(int64(cfg.writePause) + 1)))
			}
		})
	}
	if quiet := cfg.keys - busy; quiet > 0 {
		wg.Go(func() {
			r := mrand.New(mrand.NewPCG(99, uint64(time.Now().UnixNano())))
			tick := time.NewTicker(cfg.quietEvery)
			defer tick.Stop()
			for n := 0; time.Now().Before(deadline); n++ {
				write(r, busy+n%quiet)
				<-tick.C
			}
		})
	}

	// read Gets random keys through c until the deadline, counting in rc.
	// A miss is right only for the other client, which has no loader; its
	// errors are expected while Redis is stopped (this process's
	// read-through Gets answer from the loader then).
	read := func(c *packcache.Cache[Doc], rc *reads, name string, seed uint64) {
		r := mrand.New(mrand.NewPCG(seed, uint64(time.Now().UnixNano())))
		for time.Now().Before(deadline) {
			i := r.IntN(cfg.keys)
			t0 := time.Now()
			settled := ph.settled(t0, cfg.settle)
			want := rows[i].confirmed.Load()
			d, err := c.Get(ctx, keys[i])
			rc.n.Add(1)
			if settled {
				rc.settled.Add(1)
			}
			switch {
			case errors.Is(err, packcache.ErrMiss) && c == other:
				rc.misses.Add(1)
			case err != nil:
				rep.count(rc.errs, "get", err)
				if c != other {
					rep.example("%s get %s: %v", name, keys[i], err)
				}
			case !valid(i, d):
				rep.mu.Lock()
				rep.badValues++
				rep.mu.Unlock()
				rep.example("%s get %s: a value of key %q, or failing its checksum", name, keys[i], d.Key)
			case d.Version < want && settled:
				rc.stale.Add(1)
				rep.example("%s get %s begun %v after SIGCONT: version %d, %d confirmed before it began",
					name, keys[i], t0.Sub(time.Unix(0, ph.resumed.Load())).Round(time.Millisecond), d.Version, want)
			case d.Version < want:
				rc.unsettled.Add(1)
			}
		}
	}
	for w := range cfg.readers {
		wg.Go(func() { read(cache, &rep.own, "this process's", uint64(100+w)) })
	}
	for w := range max(cfg.readers/4, 1) {
		wg.Go(func() { read(other, &rep.other, "the other client's", uint64(200+w)) })
	}

	wg.Wait()
	writesDone := time.Now()
	<-outageDone
	rep.elapsed = time.Since(start)

	// The final resume settles: at least settle, and until nothing is
	// pending (bounded: a failure then says what is left).
	for limit := lastResume.Add(15 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		now := time.Now()
		idle := cache.Stats().Pending == 0
		if idle && rep.quietDrain == 0 {
			rep.quietDrain = max(now.Sub(writesDone), time.Nanosecond)
		}
		if now.After(limit) || (now.Sub(lastResume) >= cfg.settle && idle) {
			break
		}
	}
	rep.finalWait = time.Since(lastResume)
	rep.stats = cache.Stats()
	for i := range keys {
		last := rows[i].version.Load()
		d, err := other.Get(ctx, keys[i])
		switch {
		case errors.Is(err, packcache.ErrMiss):
			rep.absent++
		case err != nil:
			rep.checkErrs++
			rep.example("final check %s: %v", keys[i], err)
		case !valid(i, d):
			rep.badValues++
			rep.example("final check %s: a value of key %q, or failing its checksum", keys[i], d.Key)
		case d.Version < last:
			rep.present++
			rep.undone++
			rep.example("final check %s: version %d in Redis, the source's last is %d", keys[i], d.Version, last)
		default:
			rep.present++
		}
	}
	closeAll()
	rep.goroutines[1], rep.leakDetail = goroutinesBackTo(rep.goroutines[0])
	rep.print(out)
	return rep, nil
}

func (r *outageReport) print(out io.Writer) {
	c := r.cfg
	fmt.Fprintf(out, "soak -outage: %v, redis own %s stopped %d times (%v-%v, %v in all), running %v-%v between\n",
		r.elapsed.Round(time.Millisecond), r.addr, r.outages, c.stopMin, c.stopMax, r.stopped.Round(time.Millisecond), c.runMin, c.runMax)
	busy := max(c.keys/2, 1)
	fmt.Fprintf(out, "setup: %d keys (%d written by %d writers at will, %d in turn one every %v), %d readers (+%d of another client), loader %v after its snapshot, values %d B..%d B, Redis budget %v\n",
		c.keys, busy, c.writers, c.keys-busy, c.quietEvery, c.readers, max(c.readers/4, 1), c.loadDelay, c.minSize, c.maxSize, c.redisTimeout)
	fmt.Fprintf(out, "writes: %d (%d Delete, %d Set), %d got ErrPending (%d of them refused by the open breaker), %d failed otherwise\n",
		r.writes.Load(), r.deletes.Load(), r.sets.Load(), r.pending.Load(), r.pendingOpen.Load(), sum(r.writeErrs))
	fmt.Fprintf(out, "reads: %d, %d of them begun >= %v after a SIGCONT; loader calls %d; read errors %d\n",
		r.own.n.Load(), r.own.settled.Load(), c.settle, r.loaderCalls.Load(), sum(r.own.errs))
	fmt.Fprintf(out, "another client's reads: %d, %d settled, %d misses, errors by kind %v\n",
		r.other.n.Load(), r.other.settled.Load(), r.other.misses.Load(), r.other.errs)
	st := r.stats
	fmt.Fprintf(out, "pending: kept %d, applied %d, expired %d, dropped %d, left %d; %s\n",
		st.PendingKept, st.PendingApplied, st.PendingExpired, st.PendingDropped, st.Pending, r.drainSummary())
	fmt.Fprintf(out, "cache: gets %d, hits %d, misses %d, loads %d, superseded %d, sets %d, redis errors %d\n",
		st.Gets, st.Hits, st.Misses, st.Loads, st.Superseded, st.Sets, st.RedisErrors)
	fmt.Fprintf(out, "check stale reads (begun >= %v after SIGCONT): %d of %d (at other times: %d of %d)\n",
		c.settle, r.own.stale.Load(), r.own.settled.Load(), r.own.unsettled.Load(), r.own.n.Load()-r.own.settled.Load())
	fmt.Fprintf(out, "check stale in Redis (another client, begun >= %v after SIGCONT): %d of %d\n",
		c.settle, r.other.stale.Load(), r.other.settled.Load())
	fmt.Fprintf(out, "check writes undone (%v after the last SIGCONT): %d of %d keys (%d hold the source's last version, %d none)\n",
		r.finalWait.Round(time.Millisecond), r.undone, c.keys, r.present-r.undone, r.absent)
	closeErr := "nil"
	if r.closeErr != nil {
		closeErr = r.closeErr.Error()
	}
	fmt.Fprintf(out, "Close: %s (%v); goroutines: %d at start, %d after Close\n",
		closeErr, r.closeTook.Round(time.Millisecond), r.goroutines[0], r.goroutines[1])
}

func (r *outageReport) drainSummary() string {
	var worst, total time.Duration
	for _, d := range r.drains {
		worst = max(worst, d)
		total += d
	}
	s := fmt.Sprintf("of %d resumes before the last, %d drained (none pending)", len(r.drains)+r.undrained, len(r.drains))
	if len(r.drains) > 0 {
		s += fmt.Sprintf(" within %v of SIGCONT on average, %v at most", (total / time.Duration(len(r.drains))).Round(time.Millisecond), worst.Round(time.Millisecond))
	}
	if r.undrained > 0 {
		s += fmt.Sprintf(", %d still had some pending at the next SIGSTOP (%d at most)", r.undrained, r.leftMax)
	}
	switch {
	case r.quietDrain > time.Millisecond:
		s += fmt.Sprintf("; none pending %v after the writes ended", r.quietDrain.Round(time.Millisecond))
	case r.quietDrain > 0:
		s += "; none pending within 1ms of the writes ending"
	}
	return s
}
