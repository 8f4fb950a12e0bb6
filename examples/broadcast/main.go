// Command broadcast shows what coalescing and the near cache do when a
// whole class opens the same few chat channels at once.
//
// README: N students (goroutines, released together) each open one of M
// chat channels (35-130 KB of JSON each) read through a packcache backed
// by a slow "database" loader. It prints a markdown table of loader calls,
// Redis GETs, latencies and peak heap for these rounds, and the bytes
// stored per channel:
//
//   - coalescing on (the default), cold (empty cache), then warm;
//   - near cache (WithLocalCache), warm: every student is answered from
//     this process's memory, without a Redis GET or a decode. The near
//     cache needs Redis 6.0 or later (CLIENT TRACKING keeps it fresh); the
//     embedded miniredis lacks it, so there the round is skipped and the
//     output says why;
//   - coalescing off, cold and warm, for comparison, with only
//     -uncoalesced students (1,000 by default): each uncoalesced request
//     reads and decodes its own copy of its channel, and 20,000 of them at
//     once take 1-3 GB of memory, where the default run stays under 512 MiB;
//   - over HTTP: -http-requests requests (5,000 by default) from
//     -http-clients keep-alive clients (64) fetch the channels from a server
//     on loopback, through Cache.Serve (with the near cache where Redis can
//     keep one) and through a handler doing Get and
//     json.NewEncoder(w).Encode(v); it prints requests/s and the bytes on
//     the wire per request for zstd clients, which Serve sends the stored
//     frames as they are (passthrough), gzip clients and identity clients.
//
// Run: go run ./examples/broadcast [-students 20000 -channels 50 -dbdelay
// 50ms -codec zstd -uncoalesced 1000 -http-requests 5000 -http-clients 64]
// (embedded miniredis), or
// REDIS_ADDR=localhost:6379 go run ./examples/broadcast (real Redis; only
// keys under "packcache-example:<pid>:" are used, and they are deleted at
// the end).
//
// How long it takes: about two and a half minutes with the defaults on
// the project's 2 shared cores (151 s and 400 MiB of peak RSS, measured
// 2026-12-02 at load average 17-23 on the embedded miniredis, by
// /usr/bin/time -f '%e s %M KB' go run ./examples/broadcast); the
// rounds over 20,000 goroutines take most of it. Why the embedded
// miniredis's figures differ from a real Redis's: miniredis is Go code in
// this process, answering on the same cores as the 20,000 students and
// one command at a time under a lock, so each GET takes milliseconds
// rather than tens of microseconds; the warm round's GETs and decodes
// (one per share window, 10 ms) are then many more (3,492 in that run)
// and its latencies much longer than against redis-server, and the near
// cache's round cannot run at all (miniredis has no CLIENT TRACKING).
// Point REDIS_ADDR at a redis-server for figures that mean something.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
)

// Channel is the document students open: a chat channel's recent history.
type Channel struct {
	ID       string    `json:"id"`
	Name     string    `json:"name"`
	Topic    string    `json:"topic"`
	Members  []string  `json:"members"`
	Messages []Message `json:"messages"`
}

type Message struct {
	ID       string    `json:"id"`
	Author   string    `json:"author"`
	SentAt   time.Time `json:"sent_at"`
	Text     string    `json:"text"`
	ReplyTo  string    `json:"reply_to,omitempty"`
	Reaction string    `json:"reaction,omitempty"`
}

var words = strings.Fields(`the a homework lecture exam question answer deadline
	slides chapter proof lemma theorem graph vector matrix function derivative
	integral limit series essay draft review group project meeting tomorrow
	today tonight room library please thanks anyone know why how when where
	does this work I think we should could would maybe sure great ok cool
	submit grade rubric notes page problem solution hint example test quiz lab`)

var reactions = []string{"", "", "", "", "👍", "😂", "🎉", "👀"}

// newChannel builds channel i deterministically: same seed, same bytes,
// between about 35 and 130 KB of JSON.
func newChannel(i int) Channel {
	r := rand.New(rand.NewPCG(2024, uint64(i)))
	target := 36_000 + r.IntN(90_000) // bytes of JSON, roughly
	ch := Channel{ID: fmt.Sprintf("ch-%04d", i), Name: fmt.Sprintf("course-%03d", 100+i),
		Topic: "Questions and announcements for course " + strconv.Itoa(100+i)}
	for m := range 20 + r.IntN(40) {
		ch.Members = append(ch.Members, fmt.Sprintf("student-%05d", i*97+m))
	}
	t := time.Date(2025, 9, 1, 8, 0, 0, 0, time.UTC)
	for size := 0; size < target; {
		t = t.Add(time.Duration(5+r.IntN(900)) * time.Second)
		text := make([]string, 4+r.IntN(30))
		for k := range text {
			text[k] = words[r.IntN(len(words))]
		}
		msg := Message{ID: fmt.Sprintf("%s-m%06d", ch.ID, len(ch.Messages)), Author: ch.Members[r.IntN(len(ch.Members))],
			SentAt: t, Text: strings.Join(text, " "), Reaction: reactions[r.IntN(len(reactions))]}
		if n := len(ch.Messages); n > 0 && r.IntN(4) == 0 {
			msg.ReplyTo = ch.Messages[r.IntN(n)].ID
		}
		ch.Messages = append(ch.Messages, msg)
		size += 110 + len(msg.Text) // approximate JSON size of one message
	}
	return ch
}

// database is the source of truth: every query sleeps like a real one.
type database struct {
	prefix string
	docs   []Channel
	delay  time.Duration
	calls  atomic.Int64
}

func (db *database) Load(ctx context.Context, key string) (Channel, error) {
	db.calls.Add(1)
	i, err := strconv.Atoi(strings.TrimPrefix(key, db.prefix+"channel:"))
	if err != nil || i < 0 || i >= len(db.docs) {
		return Channel{}, packcache.ErrNotFound
	}
	select {
	case <-time.After(db.delay):
	case <-ctx.Done():
		return Channel{}, ctx.Err()
	}
	return db.docs[i], nil
}

// getCounter is a go-redis hook counting the reads sent to Redis, alone or
// in pipelines: GETs, and the SET ... NX GET with which a read-through
// cache reads a key and places its lease in one command. It works on any
// Redis, miniredis included.
type getCounter struct{ n atomic.Int64 }

func (h *getCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *getCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isRead(cmd) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *getCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if isRead(cmd) {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// isRead reports whether cmd reads a key's value: a GET, or a SET with
// the GET option.
func isRead(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "get":
		return true
	case "set":
		for _, a := range cmd.Args()[3:] {
			if s, ok := a.(string); ok && strings.EqualFold(s, "get") {
				return true
			}
		}
	}
	return false
}

type config struct {
	Students, Channels int
	DBDelay            time.Duration
	Codec              string // zstd, lz4, snappy or none
	RedisAddr          string // empty: embedded miniredis

	// Uncoalesced is how many students the coalescing-off rounds release
	// (at most Students; 0 skips those rounds). Each uncoalesced request
	// holds its own decoded copy of its channel while it runs.
	Uncoalesced int

	// HTTPRequests is how many requests the HTTP rounds make (0 skips
	// them), from HTTPClients keep-alive clients.
	HTTPRequests, HTTPClients int
}

// The rounds' modes.
const (
	modeOn   = "coalescing on"
	modeNear = "near cache"
	modeOff  = "coalescing off"
)

// nearCache is the near cache of the near round: far more than the
// channels' decoded size, so that none is evicted.
var nearCache = packcache.LocalCache{MaxBytes: 64 << 20, TTL: time.Minute}

// nearWait bounds the wait for the near cache to serve every channel: it
// serves once its invalidation stream has proved itself, some 10-50 ms
// after the cache starts.
const nearWait = 5 * time.Second

type roundResult struct {
	Mode, Round                 string
	Requests, LoaderCalls, Gets int64
	Errors                      int64 // failed requests; FirstErr is one of them
	FirstErr                    error
	Wall, P50, P99              time.Duration
	PeakHeap                    uint64 // bytes, sampled
}

type report struct {
	Rounds              []roundResult
	PlainBytes, Stored  int64 // over all channels, as written in the last cold round
	CodecName, RedisUse string

	// NearSkipped says why the near round did not run; empty if it did.
	NearSkipped string

	// HTTP holds the HTTP rounds, run with the near cache if HTTPNear.
	HTTP     []httpResult
	HTTPNear bool
}

// round returns the round of mode and round, if it ran.
func (rep report) round(mode, round string) (roundResult, bool) {
	for _, r := range rep.Rounds {
		if r.Mode == mode && r.Round == round {
			return r, true
		}
	}
	return roundResult{}, false
}

var codecs = map[string]codec.Codec{"zstd": codec.Zstd, "lz4": codec.LZ4, "snappy": codec.Snappy, "none": codec.None}

func main() {
	cfg := config{RedisAddr: os.Getenv("REDIS_ADDR")}
	flag.IntVar(&cfg.Students, "students", 20000, "concurrent students (goroutines)")
	flag.IntVar(&cfg.Channels, "channels", 50, "channels they open")
	flag.DurationVar(&cfg.DBDelay, "dbdelay", 50*time.Millisecond, "time one database query takes")
	flag.StringVar(&cfg.Codec, "codec", "zstd", "codec for stored values: zstd, lz4, snappy or none")
	flag.IntVar(&cfg.Uncoalesced, "uncoalesced", 1000, "students in the coalescing-off comparison (0 skips it; as many as -students runs it in full, 1-3 GB of memory at 20,000)")
	flag.IntVar(&cfg.HTTPRequests, "http-requests", 5000, "requests of each HTTP round (0 skips them)")
	flag.IntVar(&cfg.HTTPClients, "http-clients", 64, "keep-alive clients of the HTTP rounds")
	timeout := flag.Duration("timeout", 5*time.Minute, "bound on the whole run")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if _, err := run(ctx, cfg, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, cfg config, w io.Writer) (rep report, err error) {
	cd, ok := codecs[cfg.Codec]
	if !ok || cfg.Students < 1 || cfg.Channels < 1 || cfg.Uncoalesced < 0 || cfg.HTTPRequests < 0 || cfg.HTTPRequests > 0 && cfg.HTTPClients < 1 {
		return rep, fmt.Errorf("bad config %+v", cfg)
	}
	cfg.Uncoalesced = min(cfg.Uncoalesced, cfg.Students)
	rep.CodecName = cfg.Codec
	addr := cfg.RedisAddr
	rep.RedisUse = "REDIS_ADDR " + addr
	if addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return rep, err
		}
		defer mr.Close()
		addr, rep.RedisUse = mr.Addr(), "embedded miniredis at "+mr.Addr()
	}
	fmt.Fprintf(w, "redis: %s; %d students, %d channels, db delay %v, codec %s\n\n",
		rep.RedisUse, cfg.Students, cfg.Channels, cfg.DBDelay, cfg.Codec)

	// A surge of thousands of goroutines on a couple of cores: give the
	// client room so that waiting for a connection or for the CPU is not
	// mistaken for a dead Redis.
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64, PoolTimeout: time.Minute,
		ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, ContextTimeoutEnabled: true})
	defer rdb.Close()
	gets := &getCounter{}
	rdb.AddHook(gets)

	db := &database{prefix: fmt.Sprintf("packcache-example:%d:", os.Getpid()), delay: cfg.DBDelay}
	keys := make([]string, cfg.Channels)
	for i := range keys {
		keys[i] = fmt.Sprintf("%schannel:%d", db.prefix, i)
		db.docs = append(db.docs, newChannel(i))
	}
	// Our keys only, never a flush: the Redis may not be ours.
	clean := func() error { return rdb.Del(context.WithoutCancel(ctx), keys...).Err() }
	defer clean()

	// coldAndWarm runs a cold round (nothing cached) and a warm one.
	coldAndWarm := func(mode string, coalescing bool, students int) error {
		if err := clean(); err != nil {
			return err
		}
		c, err := packcache.New[Channel](rdb, packcache.WithLoader[Channel](db),
			packcache.WithCodec(cd), packcache.WithCoalescing(coalescing),
			// Without coalescing, thousands of reads queue for the
			// pooled connections for seconds: give them the time.
			packcache.WithRedisTimeout(time.Minute))
		if err != nil {
			return err
		}
		defer c.Close()
		var took time.Duration
		for _, round := range []string{"cold", "warm"} {
			// A coalesced result stays shared for the share window, or
			// for as long as it took to make, up to a second. Let that
			// pass, so the warm round reads Redis rather than being
			// handed the cold round's result.
			time.Sleep(min(took, time.Second) + 2*(10*time.Millisecond))
			rr, err := surge(ctx, c, db, gets, keys, students)
			if err != nil {
				return err
			}
			rr.Mode, rr.Round = mode, round
			took = rr.Wall
			rep.Rounds = append(rep.Rounds, rr)
		}
		return nil
	}

	if err := coldAndWarm(modeOn, true, cfg.Students); err != nil {
		return rep, err
	}
	if rep.NearSkipped, err = nearRound(ctx, rdb, cd, db, gets, keys, cfg.Students, &rep); err != nil {
		return rep, err
	}
	if cfg.Uncoalesced > 0 {
		if err := coldAndWarm(modeOff, false, cfg.Uncoalesced); err != nil {
			return rep, err
		}
	}

	// What Redis holds: the raw stored length against the JSON length.
	for i, k := range keys {
		n, err := rdb.StrLen(ctx, k).Result()
		if err != nil {
			return rep, err
		}
		js, err := json.Marshal(db.docs[i])
		if err != nil {
			return rep, err
		}
		rep.PlainBytes += int64(len(js))
		rep.Stored += n
	}
	if cfg.HTTPRequests > 0 {
		rep.HTTPNear = rep.NearSkipped == ""
		if rep.HTTP, err = httpRounds(ctx, rdb, cd, db, gets, keys, cfg, rep.HTTPNear); err != nil {
			return rep, err
		}
	}
	printReport(w, cfg, rep)
	printHTTP(w, cfg, rep)
	return rep, nil
}

// nearRound runs the warm surge against a cache with a near cache, once
// every channel is in it, and appends its result to rep. If this Redis
// cannot keep a near cache fresh, it runs nothing and returns why.
func nearRound(ctx context.Context, rdb *redis.Client, cd codec.Codec, db *database, gets *getCounter, keys []string, students int, rep *report) (skipped string, err error) {
	// The near cache learns of writes through CLIENT TRACKING (Redis 6.0
	// or later). Without it the cache works, but its near cache never
	// proves its invalidation stream and never serves: every Get would go
	// to Redis, and the round would measure the coalescing round again
	// under another name. (Turning tracking off on a connection that
	// never turned it on changes nothing.)
	if err := rdb.Do(ctx, "CLIENT", "TRACKING", "off").Err(); err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return fmt.Sprintf("this Redis refuses CLIENT TRACKING (%v)", err), nil
	}
	c, err := packcache.New[Channel](rdb, packcache.WithLoader[Channel](db),
		packcache.WithCodec(cd), packcache.WithLocalCache(nearCache),
		packcache.WithRedisTimeout(time.Minute))
	if err != nil {
		return "", err
	}
	defer c.Close()
	// Only values read from Redis enter the near cache, once its
	// invalidation stream has proved itself: Get each channel until the
	// near cache answers it.
	deadline := time.Now().Add(nearWait)
	for _, k := range keys {
		for {
			before := c.Stats().NearHits
			if _, err := c.Get(ctx, k); err != nil {
				return "", err
			}
			if c.Stats().NearHits > before {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Sprintf("the near cache did not serve within %v", nearWait), nil
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	rr, err := surge(ctx, c, db, gets, keys, students)
	if err != nil {
		return "", err
	}
	rr.Mode, rr.Round = modeNear, "warm"
	rep.Rounds = append(rep.Rounds, rr)
	return "", nil
}

// surge releases students at once, student i opening channel i % M, and
// measures what it cost.
func surge(ctx context.Context, c *packcache.Cache[Channel], db *database, gets *getCounter, keys []string, students int) (roundResult, error) {
	// Start from a clean heap, so each round's peak is its own.
	runtime.GC()
	debug.FreeOSMemory()
	calls0, gets0 := db.calls.Load(), gets.n.Load()
	lat := make([]time.Duration, students)
	var (
		ready, done sync.WaitGroup
		start       = make(chan struct{})
		errs        atomic.Int64
		firstErr    error
		once        sync.Once
	)
	ready.Add(students)
	done.Add(students)
	for i := range students {
		go func() {
			defer done.Done()
			key := keys[i%len(keys)]
			ready.Done()
			<-start
			t0 := time.Now()
			ch, err := c.Get(ctx, key)
			lat[i] = time.Since(t0)
			if err == nil && ch.ID != fmt.Sprintf("ch-%04d", i%len(keys)) {
				err = fmt.Errorf("%s: got channel %q", key, ch.ID)
			}
			if err != nil {
				errs.Add(1)
				once.Do(func() { firstErr = err })
			}
		}()
	}
	ready.Wait()
	stopSampling := make(chan struct{})
	peak := make(chan uint64)
	go sampleHeap(stopSampling, peak)
	t0 := time.Now()
	close(start)
	done.Wait()
	wall := time.Since(t0)
	close(stopSampling)
	rr := roundResult{Requests: int64(students), Wall: wall, Errors: errs.Load(), PeakHeap: <-peak,
		LoaderCalls: db.calls.Load() - calls0, Gets: gets.n.Load() - gets0}
	slices.Sort(lat)
	rr.P50, rr.P99 = lat[len(lat)/2], lat[len(lat)*99/100]
	if ctx.Err() != nil {
		return rr, ctx.Err()
	}
	rr.FirstErr = firstErr
	return rr, nil
}

// sampleHeap reports the largest heap it saw, sampling until stop closes.
func sampleHeap(stop <-chan struct{}, peak chan<- uint64) {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	var top uint64
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		metrics.Read(sample)
		top = max(top, sample[0].Value.Uint64())
		select {
		case <-stop:
			peak <- top
			return
		case <-tick.C:
		}
	}
}

func printReport(w io.Writer, cfg config, rep report) {
	fmt.Fprintln(w, "| mode | round | requests | errors | loader calls | Redis GETs | wall time | p50 | p99 | peak heap |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, r := range rep.Rounds {
		fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %d | %s | %s | %s | %s |\n", r.Mode, r.Round, r.Requests, r.Errors,
			r.LoaderCalls, r.Gets, dur(r.Wall), dur(r.P50), dur(r.P99), mib(r.PeakHeap))
	}
	for _, r := range rep.Rounds {
		if r.FirstErr != nil {
			fmt.Fprintf(w, "\n%s, %s round: %d requests failed, first: %v\n", r.Mode, r.Round, r.Errors, r.FirstErr)
		}
	}
	fmt.Fprintln(w)
	if rep.NearSkipped != "" {
		fmt.Fprintf(w, "near cache: skipped: %s. The near cache is kept fresh by Redis's CLIENT TRACKING invalidations (Redis 6.0 or later)", rep.NearSkipped)
		if cfg.RedisAddr == "" {
			fmt.Fprint(w, ", which the embedded miniredis does not implement")
		}
		fmt.Fprintln(w, "; without them it never serves, and its round would only repeat the coalescing one. Run it against a real Redis: REDIS_ADDR=localhost:6379 go run ./examples/broadcast")
	}
	switch {
	case cfg.Uncoalesced == 0:
		fmt.Fprintln(w, "coalescing off: skipped (-uncoalesced 0).")
	case cfg.Uncoalesced < cfg.Students:
		fmt.Fprintf(w, "coalescing off: %d of the %d students (-uncoalesced %d), to keep this run light: without coalescing each request reads and decodes its own copy of its channel, so %d at once take 1-3 GB of memory. -uncoalesced %d runs the full comparison.\n",
			cfg.Uncoalesced, cfg.Students, cfg.Uncoalesced, cfg.Students, cfg.Students)
	}

	m := int64(cfg.Channels)
	fmt.Fprintf(w, "\n| bytes stored | plain JSON | stored (%s) | saved |\n|---|--:|--:|--:|\n", rep.CodecName)
	fmt.Fprintf(w, "| per channel (average) | %d | %d | %.1f%% |\n", rep.PlainBytes/m, rep.Stored/m, saved(rep))
	fmt.Fprintf(w, "| all %d channels | %d | %d | %.1f%% |\n", m, rep.PlainBytes, rep.Stored, saved(rep))

	fmt.Fprintln(w)
	if on, ok := rep.round(modeOn, "cold"); ok {
		fmt.Fprintf(w, "On a cold cache, coalescing turned %d requests into %d loader calls and %d Redis GETs (%s wall, p99 %s, peak heap %s). ",
			on.Requests, on.LoaderCalls, on.Gets, dur(on.Wall), dur(on.P99), mib(on.PeakHeap))
	}
	if on, ok := rep.round(modeOn, "warm"); ok {
		fmt.Fprintf(w, "Warm, it served them with %d GETs and as many decodes, each shared by the students who asked meanwhile (%s wall, p99 %s). ", on.Gets, dur(on.Wall), dur(on.P99))
	}
	if nr, ok := rep.round(modeNear, "warm"); ok {
		fmt.Fprintf(w, "With the near cache, the warm surge made %d Redis GETs and %d loader calls: the %d requests were answered from this process's memory, without a decode (%s wall, p99 %s). ",
			nr.Gets, nr.LoaderCalls, nr.Requests, dur(nr.Wall), dur(nr.P99))
	}
	if off, ok := rep.round(modeOff, "cold"); ok {
		offWarm, _ := rep.round(modeOff, "warm")
		fmt.Fprintf(w, "Without coalescing, %d requests made %d loader calls cold (%s wall, peak heap %s) and, warm, %d GETs and as many decodes, one per request (%s wall, p99 %s). ",
			off.Requests, off.LoaderCalls, dur(off.Wall), mib(off.PeakHeap), offWarm.Gets, dur(offWarm.Wall), dur(offWarm.P99))
	}
	fmt.Fprintf(w, "Redis holds each channel as %d bytes of %s instead of %d bytes of JSON (%.1f%% saved).\n",
		rep.Stored/m, rep.CodecName, rep.PlainBytes/m, saved(rep))
}

func dur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
	// A near-cache hit takes microseconds.
	return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond))
}

func mib(b uint64) string { return fmt.Sprintf("%d MiB", b>>20) }

func saved(rep report) float64 { return 100 * (1 - float64(rep.Stored)/float64(rep.PlainBytes)) }
