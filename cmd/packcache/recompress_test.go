package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// decode decodes a stored value or fails the test.
func decode(t *testing.T, key string, v []byte) []byte {
	t.Helper()
	d, err := codec.DecodeValue(nil, v, 1<<30)
	if err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	return d
}

func TestRecompress(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		small := jsonDoc(1, 300)
		large := jsonDoc(2, 20_000)
		binSmall := []byte("\x06binary, begins with a header byte")
		binPlainStart := []byte("msgpack-ish binary \xff\xfe not JSON")
		values := map[string][]byte{
			"r:small-plain":     small,                                  // stays plain, untouched
			"r:small-none-json": encode(t, codec.None, small),           // JSON framed with 01: becomes plain
			"r:small-zstd":      encode(t, codec.Zstd, small),           // at or below the threshold: plain
			"r:large-plain":     large,                                  // compressed: gets the header
			"r:large-lz4":       encode(t, codec.LZ4, large),            // recompressed
			"r:large-target":    encode(t, codec.ZstdDefault, large),    // already as the target: left alone
			"r:bin-header":      encode(t, codec.None, binSmall),        // decoded begins with 05: keeps 01
			"r:bin-text-start":  encode(t, codec.Snappy, binPlainStart), // not JSON: framed with 01
			"r:bin-large":       encode(t, codec.None, bytes.Repeat(binSmall, 200)),
			"r:tombstone":       {0x0e},
			"r:lease":           []byte("\x0c0123456789abcdef"),
			"r:corrupt":         []byte("\x04not a zstd frame"),
			"r:user":            []byte("\x13user codec payload"),
		}
		set(t, tg, 1000*time.Second, values)
		set(t, tg, 0, map[string][]byte{"r:no-expiry": large})
		tg.Client.HSet(t.Context(), "r:hash", "f", "v")
		set(t, tg, 0, map[string][]byte{"other:large": large})
		before := snapshot(t, tg)
		start := time.Now()

		res := cli(t, with(tg, "recompress", "--prefix", "r:", "--codec", "zstd", "--level", "3", "--compress-above", "1024")...)
		if res.code != 0 {
			t.Fatalf("exit %d", res.code)
		}
		elapsed := time.Since(start)
		mustContain(t, res.stdout,
			"skipped r:corrupt: codec zstd: corrupt value",
			"skipped r:user: unknown header byte 0x13",
			"rewritten          7",
			"already as target  3 (left alone)",
			"2 undecodable, 1 leases, 1 tombstones, 1 not strings",
			"cursor: done")

		after := snapshot(t, tg)
		wantStored := map[string][]byte{
			"r:small-plain":     small,
			"r:small-none-json": small,
			"r:small-zstd":      small,
			"r:large-plain":     encode(t, codec.ZstdDefault, large),
			"r:large-lz4":       encode(t, codec.ZstdDefault, large),
			"r:large-target":    encode(t, codec.ZstdDefault, large),
			"r:bin-header":      encode(t, codec.None, binSmall),
			"r:bin-text-start":  encode(t, codec.None, binPlainStart),
			"r:bin-large":       encode(t, codec.ZstdDefault, bytes.Repeat(binSmall, 200)),
			"r:no-expiry":       encode(t, codec.ZstdDefault, large),
			"r:tombstone":       values["r:tombstone"],
			"r:lease":           values["r:lease"],
			"r:corrupt":         values["r:corrupt"],
			"r:user":            values["r:user"],
			"other:large":       large,
		}
		for k, want := range wantStored {
			if got := after[k].value; got != string(want) {
				t.Errorf("%s: stored % x..., want % x...", k, []byte(clip(got)), want[:min(len(want), 12)])
			}
		}
		if after["r:hash"].typ != "hash" {
			t.Error("the hash was touched")
		}
		// TTLs: kept, counted down by no more than the run took (plus a
		// second of rounding); keys without expiry still have none.
		for k, b := range before {
			if !ttlKept(b.ttl, after[k].ttl, elapsed+time.Second) {
				t.Errorf("%s: TTL %v before, %v after a run of %v", k, b.ttl, after[k].ttl, elapsed)
			}
		}
		if after["r:no-expiry"].ttl != -1 {
			t.Errorf("r:no-expiry got TTL %v", after["r:no-expiry"].ttl)
		}

		// Running again changes nothing: every value is as the target
		// stores it.
		res = cli(t, with(tg, "recompress", "--prefix", "r:", "--codec", "zstd", "--level", "3")...)
		mustContain(t, res.stdout, "rewritten          0", "already as target  10")
		sameData(t, after, snapshot(t, tg), time.Minute)

		// Back to plain with compression off: every value decodes to what
		// it did, and JSON is stored verbatim again.
		res = cli(t, with(tg, "recompress", "--prefix", "r:", "--codec", "none")...)
		if res.code != 0 {
			t.Fatalf("exit %d", res.code)
		}
		if got := get(t, tg, "r:large-lz4"); !bytes.Equal(got, large) {
			t.Errorf("--codec none left r:large-lz4 as % x...", got[:8])
		}
		if got := get(t, tg, "r:bin-large"); !bytes.Equal(got, encode(t, codec.None, bytes.Repeat(binSmall, 200))) {
			t.Errorf("--codec none: binary value not framed with 01: % x...", got[:8])
		}
	})
}

func TestRecompressDryRun(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		kv := map[string][]byte{}
		for i := range 50 {
			kv[fmt.Sprintf("d:%d", i)] = jsonDoc(i, 2000+i*50)
		}
		set(t, tg, time.Hour, kv)
		before := snapshot(t, tg)
		tg.ResetStats(t)
		res := cli(t, with(tg, "recompress", "--prefix", "d:", "--codec", "lz4", "--level", "9", "--dry-run")...)
		if res.code != 0 {
			t.Fatalf("exit %d", res.code)
		}
		mustContain(t, res.stdout, "dry run", "would rewrite      50", "after (projected)")
		sameData(t, before, snapshot(t, tg), time.Minute)
		checkReadOnly(t, tg)
	})
}

// TestRecompressRacingWriter runs recompress while writers keep replacing
// the values: one writer replaces values between recompress's read and
// its write of them (through the test hook, so the race happens for sure),
// another runs freely throughout. Afterwards every key must hold the last
// value a writer wrote, and the replaced values must be reported as such.
func TestRecompressRacingWriter(t *testing.T) {
	targets(t, func(t *testing.T, tg redistest.Target) {
		const n = 400
		var mu sync.Mutex
		last := map[string][]byte{} // what each key must decode to
		kv := map[string][]byte{}
		for i := range n {
			k := fmt.Sprintf("w:%03d", i)
			kv[k] = jsonDoc(i, 1500+i*10)
			last[k] = kv[k]
		}
		set(t, tg, time.Hour, kv)
		ctx := context.Background()
		write := func(k string, gen int) {
			doc := jsonDoc(gen, 1500+gen%7*300)
			stored := doc
			if gen%2 == 0 {
				stored = encode(t, codec.Snappy, doc)
			}
			if err := tg.Client.Set(ctx, k, stored, time.Hour).Err(); err != nil {
				t.Errorf("writer: %v", err)
				return
			}
			mu.Lock()
			last[k] = doc
			mu.Unlock()
		}

		// The hook replaces the first even-numbered key of every batch
		// after recompress read it. Odd keys belong to the free writer.
		var hooked int // guarded by mu; the hook runs on each master's goroutine
		testHookAfterRead = func(keys []string) {
			for _, k := range keys {
				var i int
				fmt.Sscanf(k, "w:%d", &i)
				if i%2 == 0 {
					mu.Lock()
					hooked++
					gen := 100_000 + hooked
					mu.Unlock()
					write(k, gen)
					return
				}
			}
		}
		defer func() { testHookAfterRead = nil }()

		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(3, 4))
			for gen := 0; ; gen++ {
				select {
				case <-stop:
					return
				default:
				}
				write(fmt.Sprintf("w:%03d", 2*rng.IntN(n/2)+1), gen)
				time.Sleep(200 * time.Microsecond)
			}
		})
		res := cli(t, with(tg, "recompress", "--prefix", "w:", "--codec", "zstd", "--compress-above", "512", "--count", "25")...)
		close(stop)
		wg.Wait()
		if res.code != 0 {
			t.Fatalf("exit %d", res.code)
		}
		if hooked == 0 {
			t.Fatal("the hook never replaced a value: the test proves nothing")
		}
		m := regexp.MustCompile(`changed meanwhile  (\d+)`).FindStringSubmatch(res.stdout)
		var changed int
		if m != nil {
			fmt.Sscan(m[1], &changed)
		}
		if changed < hooked {
			t.Errorf("%d values reported changed meanwhile, but the hook alone replaced %d", changed, hooked)
		}
		for k, want := range last {
			if got := decode(t, k, get(t, tg, k)); !bytes.Equal(got, want) {
				t.Errorf("%s does not hold the writer's last value", k)
			}
		}
	})
}

// cursorRe finds the cursor an interrupted run prints.
var cursorRe = regexp.MustCompile(`resume with: --cursor (\S+)`)

func TestRecompressResume(t *testing.T) {
	targets(t, func(t *testing.T, tg redistest.Target) {
		const n = 300
		kv := map[string][]byte{}
		for i := range n {
			kv[fmt.Sprintf("c:%03d", i)] = jsonDoc(i, 2000)
		}
		set(t, tg, time.Hour, kv)

		// Interrupt, as a signal would, from the third batch on, once an
		// earlier batch has been written back (on a cluster the masters'
		// batches run concurrently).
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var mu sync.Mutex
		batches := 0
		testHookAfterRead = func([]string) {
			mu.Lock()
			defer mu.Unlock()
			if batches++; batches < 3 || ctx.Err() != nil {
				return
			}
			for k := range kv {
				if v, _ := tg.Client.GetRange(context.Background(), k, 0, 0).Result(); v == "\x03" {
					cancel()
					return
				}
			}
		}
		defer func() { testHookAfterRead = nil }()
		res := cliContext(t, ctx, with(tg, "recompress", "--prefix", "c:", "--codec", "snappy", "--count", "10")...)
		testHookAfterRead = nil
		if res.code != exitInterrupted {
			t.Fatalf("interrupted run: exit %d, want %d", res.code, exitInterrupted)
		}
		m := cursorRe.FindStringSubmatch(res.stdout)
		if m == nil {
			t.Fatal("interrupted run printed no cursor")
		}
		cursor := m[1]
		if tg.Cluster != nil && strings.Count(cursor, "=") != 3 {
			t.Errorf("cluster cursor %q does not name the 3 masters", cursor)
		}
		done := 0
		for k := range kv {
			if get(t, tg, k)[0] == codec.HeaderSnappy {
				done++
			}
		}
		if done == 0 || done == n {
			t.Fatalf("%d of %d keys rewritten before the interruption; want some", done, n)
		}

		res = cli(t, with(tg, "recompress", "--prefix", "c:", "--codec", "snappy", "--count", "10", "--cursor", cursor)...)
		if res.code != 0 {
			t.Fatalf("resumed run: exit %d", res.code)
		}
		var examined int
		if m := regexp.MustCompile(`examined\s+([\d,]+) values`).FindStringSubmatch(res.stdout); m != nil {
			fmt.Sscan(strings.ReplaceAll(m[1], ",", ""), &examined)
		}
		if examined == 0 || examined >= n {
			t.Errorf("resumed run examined %d keys; want fewer than %d, as it starts where the first stopped", examined, n)
		}
		for k, doc := range kv {
			v := get(t, tg, k)
			if v[0] != codec.HeaderSnappy || !bytes.Equal(decode(t, k, v), doc) {
				t.Errorf("%s not rewritten after the resumed run", k)
			}
		}
	})
}

func TestRecompressRate(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		kv := map[string][]byte{}
		for i := range 30 {
			kv[fmt.Sprintf("rate:%d", i)] = jsonDoc(i, 1500)
		}
		set(t, tg, 0, kv)
		// 30 keys at 20/s with a burst of 20: at least half a second,
		// however fast the machine. (No upper bound: a loaded machine
		// may be slow.)
		start := time.Now()
		res := cli(t, with(tg, "recompress", "--prefix", "rate:", "--codec", "lz4", "--rate", "20/s")...)
		if res.code != 0 {
			t.Fatalf("exit %d", res.code)
		}
		if took := time.Since(start); took < 450*time.Millisecond {
			t.Errorf("30 keys at --rate 20/s took %v", took)
		}
	})
}
