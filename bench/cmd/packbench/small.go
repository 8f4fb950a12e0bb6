package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
)

// ---------------------------------------------------------------- small

// The small suite: values of 150 to 400 bytes, which compression without
// a dictionary barely shrinks, stored by packcache with and without a zstd
// dictionary (Policy.Dictionary), and with the other codecs compressing
// every value.

// profileFields are the optional fields of a user profile and how each is
// drawn; makeProfile includes each three times in four.
var profileFields = []struct {
	name string
	draw func(r *rand.Rand) any
}{
	{"username", func(r *rand.Rand) any { return fmt.Sprintf("student%04d", r.IntN(5000)) }},
	{"email", func(r *rand.Rand) any { return fmt.Sprintf("student%04d@uni.example.edu", r.IntN(5000)) }},
	{"display_name", func(r *rand.Rand) any { return wordList[r.IntN(len(wordList))] + " " + wordList[r.IntN(len(wordList))] }},
	{"plan", func(r *rand.Rand) any { return []string{"free", "pro", "campus"}[r.IntN(3)] }},
	{"locale", func(r *rand.Rand) any { return []string{"en-US", "en-GB", "de-DE", "pt-BR", "ja-JP"}[r.IntN(5)] }},
	{"created_at", func(r *rand.Rand) any {
		return time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(r.IntN(5*365*24)) * time.Hour)
	}},
	{"email_verified", func(r *rand.Rand) any { return r.IntN(4) > 0 }},
	{"courses", func(r *rand.Rand) any {
		return []int{101 + r.IntN(50), 201 + r.IntN(50), 301 + r.IntN(50)}[:1+r.IntN(3)]
	}},
	{"notifications", func(r *rand.Rand) any {
		return map[string]bool{"email": r.IntN(2) == 0, "push": r.IntN(2) == 0, "digest": r.IntN(2) == 0}
	}},
	{"last_seen_ip", func(r *rand.Rand) any { return fmt.Sprintf("10.%d.%d.%d", r.IntN(256), r.IntN(256), r.IntN(256)) }},
}

// makeProfile returns the JSON of a user profile, 100 to 450 bytes.
func makeProfile(r *rand.Rand, id int) []byte {
	p := map[string]any{"id": 100000 + id}
	for _, f := range profileFields {
		if r.IntN(4) > 0 {
			p[f.name] = f.draw(r)
		}
	}
	b, _ := json.Marshal(p)
	return b
}

// smallValues returns n values of 150 to 400 bytes of a kind, profiles or
// chat messages, the same for a seed.
func smallValues(kind string, n int, seed uint64) [][]byte {
	r := rand.New(rand.NewPCG(seed, 5))
	var out [][]byte
	for i := 0; len(out) < n; i++ {
		var v []byte
		if kind == "profiles" {
			v = makeProfile(r, i)
		} else {
			v = makeMessage(seed<<20+uint64(i), 150+r.IntN(251))
		}
		if len(v) >= 150 && len(v) <= 400 {
			out = append(out, v)
		}
	}
	return out
}

type smallSubject struct {
	name string
	opts []packcache.Option
	c    codec.Codec // what it compresses with, for the codec-only columns; nil: none
}

func (e *env) suiteSmall(ctx context.Context) error {
	n, trainN := 1000, 500
	if e.cfg.quick {
		n, trainN = 200, 200
	}
	e.header("small", fmt.Sprintf("%d values of 150-400 bytes (JSON user profiles, and single chat messages) per kind, stored with packcache.Cache[json.RawMessage] and WithShareWindow(Off): "+
		"by default (plain: the default threshold is 1024 B), with a codec and WithCompressAbove(CompressAll), and with Policy{Dictionary: d}, d a 4 KiB zstd dictionary (codec.TrainDictionary) trained on %d other values of the kind (its threshold is codec.DictionaryCompressAbove, %d B). "+
		"MEMORY USAGE is summed over the values (keys of 12 bytes included); ratio is that sum over plain's. Compressed: values stored with a codec's header (packcache stores plain a value compression does not shrink). "+
		"Set and Get µs: per value, sequential, one value after another, median (min–max) of %d runs, the Redis round trip included. Encode and decode µs: the codec alone (codec.AppendValue, codec.DecodeValueDict), mean per value.",
		n, trainN, codec.DictionaryCompressAbove, e.cfg.reps))
	fmt.Fprintln(e.out, "| values | subject | mean JSON B | mean STRLEN | MEMORY USAGE per value | ratio | compressed | Set µs | Get µs | encode µs | decode µs |")
	fmt.Fprintln(e.out, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for ki, kind := range []string{"profiles", "chat messages"} {
		vals := smallValues(kind, n, uint64(ki+1))
		dictBytes, err := codec.TrainDictionary(smallValues(kind, trainN, uint64(ki+100)), 4<<10)
		if err != nil {
			return fmt.Errorf("%s: %w", kind, err)
		}
		d, err := codec.ParseDictionary(dictBytes)
		if err != nil {
			return err
		}
		all := packcache.WithCompressAbove(packcache.CompressAll)
		subjects := []smallSubject{
			{name: "default (plain)"},
			{name: "zstd, all", opts: []packcache.Option{all}, c: codec.Zstd},
			{name: "lz4, all", opts: []packcache.Option{packcache.WithCodec(codec.LZ4), all}, c: codec.LZ4},
			{name: "brotli 1, all", opts: []packcache.Option{packcache.WithCodec(brotli1), all}, c: brotli1},
			{name: "zstd + dictionary", opts: []packcache.Option{packcache.WithPrefix("", packcache.Policy{Dictionary: dictBytes})}, c: d.Codec(1)},
		}
		var plainMem int64
		for si, s := range subjects {
			c, err := packcache.New[json.RawMessage](e.rdb, append([]packcache.Option{packcache.WithShareWindow(packcache.Off)}, s.opts...)...)
			if err != nil {
				return err
			}
			key := func(i int) string { return e.key("small", fmt.Sprint(ki, si), fmt.Sprintf("%05d", i)) }
			var sets, gets []float64
			for range e.cfg.reps {
				t := time.Now()
				for i, v := range vals {
					if err := c.Set(ctx, key(i), v); err != nil {
						c.Close()
						return err
					}
				}
				sets = append(sets, float64(time.Since(t).Nanoseconds())/float64(len(vals)))
				t = time.Now()
				for i, v := range vals {
					got, err := c.Get(ctx, key(i))
					if err == nil && string(got) != string(v) {
						err = fmt.Errorf("%s: %s read back wrong", s.name, key(i))
					}
					if err != nil {
						c.Close()
						return err
					}
				}
				gets = append(gets, float64(time.Since(t).Nanoseconds())/float64(len(vals)))
			}
			c.Close()
			var jsonB, strlen, mem int64
			compressed := 0
			for i, v := range vals {
				sl, mu, err := e.stored(ctx, key(i))
				if err != nil {
					return err
				}
				jsonB, strlen, mem = jsonB+int64(len(v)), strlen+sl, mem+mu
				if first, _ := e.rdb.GetRange(ctx, key(i), 0, 0).Result(); len(first) == 1 && codec.IsHeader(first[0]) {
					compressed++
				}
			}
			if si == 0 {
				plainMem = mem
			}
			enc, dec := "-", "-"
			if s.c != nil {
				encNs, decNs, err := codecTime(s.c, d, vals)
				if err != nil {
					return fmt.Errorf("%s: %w", s.name, err)
				}
				enc, dec = fmt.Sprintf("%.1f", encNs/1e3), fmt.Sprintf("%.1f", decNs/1e3)
			}
			nv := int64(len(vals))
			fmt.Fprintf(e.out, "| %s | %s | %d | %d | %d | %.3f | %d | %s | %s | %s | %s |\n", kind, s.name, jsonB/nv, strlen/nv, mem/nv,
				float64(mem)/float64(plainMem), compressed, spreadOf(sets).us(), spreadOf(gets).us(), enc, dec)
		}
	}
	return e.reset(ctx)
}

// codecTime is the mean time to encode and to decode one of vals with c
// (d: the dictionary that c may be the codec of).
func codecTime(c codec.Codec, d *codec.Dictionary, vals [][]byte) (enc, dec float64, err error) {
	stored := make([][]byte, len(vals))
	for i, v := range vals {
		if stored[i], err = codec.AppendValue(nil, c, v); err != nil {
			return 0, 0, err
		}
	}
	var buf []byte
	enc = timePer(len(vals), func(i int) { buf, _ = codec.AppendValue(buf[:0], c, vals[i]) })
	dec = timePer(len(vals), func(i int) { buf, _ = codec.DecodeValueDict(buf[:0], stored[i], 1<<20, d) })
	return enc, dec, nil
}

// timePer calls f(0) to f(n-1) over and over for at least 50 ms and
// returns the mean ns per call.
func timePer(n int, f func(i int)) float64 {
	calls := 0
	start := time.Now()
	for time.Since(start) < 50*time.Millisecond {
		for i := range n {
			f(i)
		}
		calls += n
	}
	return float64(time.Since(start).Nanoseconds()) / float64(calls)
}
