// Command fill loads test data into a Redis for trying and timing the
// packcache command: generated chat channels or user profiles, or the files of a directory
// (such as the shared JSON corpus) as one value each. It writes values as
// a packcache writer would: plain JSON at or below -compress-above bytes,
// framed with the codec's header byte above it.
//
//	go run ./internal/fill -addr 127.0.0.1:7001 -prefix channel: -n 2000 -min 2048 -max 131072
//	go run ./internal/fill -addr 127.0.0.1:7001 -prefix user: -n 20000 -kind profile
//	go run ./internal/fill -addr 127.0.0.1:7001 -prefix corpus: -dir /work/shared/corpus
//
// It refuses 127.0.0.1:6379 (and any :6379): start a redis-server of your own.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/cmd/packcache/internal/gen"
	"github.com/packcache/packcache/codec"
)

func main() {
	addr := flag.String("addr", "", "Redis host:port (required; not :6379)")
	cluster := flag.Bool("cluster", false, "addr is a cluster seed")
	prefix := flag.String("prefix", "channel:", "key prefix")
	n := flag.Int("n", 2000, "values to generate")
	kind := flag.String("kind", "channel", "what to generate: channel (of -min to -max bytes) or profile (30-400 bytes)")
	lo := flag.Int("min", 2048, "smallest channel, bytes")
	hi := flag.Int("max", 128<<10, "largest channel, bytes")
	dir := flag.String("dir", "", "load every *.json file of this directory instead, as PREFIX+NAME")
	codecName := flag.String("codec", "none", "codec above the threshold: none, lz4, snappy, zstd")
	above := flag.Int("compress-above", 1024, "store values at or below this size plain")
	ttl := flag.Duration("ttl", time.Hour, "TTL of each key, jittered down by up to 10% (0: none)")
	flag.Parse()
	if *addr == "" || strings.HasSuffix(*addr, ":6379") {
		fmt.Fprintln(os.Stderr, "fill: -addr of a redis-server of your own is required (not :6379)")
		os.Exit(2)
	}
	c := map[string]codec.Codec{"none": codec.None, "lz4": codec.LZ4, "snappy": codec.Snappy, "zstd": codec.Zstd}[*codecName]
	if c == nil {
		fmt.Fprintf(os.Stderr, "fill: unknown codec %q\n", *codecName)
		os.Exit(2)
	}
	var rdb redis.UniversalClient = redis.NewClient(&redis.Options{Addr: *addr})
	if *cluster {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{*addr}})
	}
	defer rdb.Close()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 7))
	store := func(v []byte) []byte {
		if len(v) > *above && c != codec.None {
			if out, err := codec.AppendValue(nil, c, v); err == nil && len(out) < len(v) {
				return out
			}
		}
		return v
	}
	expiry := func() time.Duration {
		if *ttl <= 0 {
			return 0
		}
		return *ttl - time.Duration(rng.Float64()*0.1*float64(*ttl))
	}
	start := time.Now()
	var keys, bytes int
	pipe := rdb.Pipeline()
	set := func(key string, v []byte) {
		pipe.Set(ctx, key, store(v), expiry())
		keys++
		bytes += len(v)
		if pipe.Len() >= 200 {
			if _, err := pipe.Exec(ctx); err != nil {
				fmt.Fprintln(os.Stderr, "fill:", err)
				os.Exit(1)
			}
		}
	}
	if *dir != "" {
		files, _ := filepath.Glob(filepath.Join(*dir, "*.json"))
		for _, f := range files {
			v, err := os.ReadFile(f)
			if err != nil {
				fmt.Fprintln(os.Stderr, "fill:", err)
				os.Exit(1)
			}
			set(*prefix+strings.TrimSuffix(filepath.Base(f), ".json"), v)
		}
	} else {
		for i := range *n {
			if *kind == "profile" {
				set(fmt.Sprintf("%s%d", *prefix, i), gen.Profile(rng, i))
			} else {
				set(fmt.Sprintf("%s%d", *prefix, i), gen.Channel(rng, i, gen.LogUniform(rng, *lo, *hi)))
			}
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "fill:", err)
		os.Exit(1)
	}
	fmt.Printf("fill: %d keys, %d bytes of JSON under %s in %v\n", keys, bytes, *prefix, time.Since(start).Round(time.Millisecond))
}
