package main

import (
	"context"
	"fmt"
	"time"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/brotli"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/msgpack"
)

// brotli1 is the Brotli user codec (module github.com/packcache/packcache/brotli)
// at quality 1, registered as an application registers it, so that the
// codec tables measure it beside the built-in ones.
var brotli1 = brotli.New(brotli.DefaultQuality)

func init() {
	if err := codec.Register(brotli1); err != nil {
		panic(err)
	}
}

// ---------------------------------------------------------------- formats

// suiteFormats measures the serializers on the chat channel: packcache.JSON
// (goccy/go-json) and MessagePack (module
// github.com/packcache/packcache/msgpack).
func (e *env) suiteFormats(ctx context.Context) error {
	sizes := []int{1 << 10, 10 << 10, 128 << 10}
	if e.cfg.quick {
		sizes = sizes[:2]
	}
	sers := []struct {
		name string
		s    packcache.Serializer
	}{
		{"packcache.JSON (go-json)", packcache.JSON},
		{"msgpack", msgpack.Serializer},
	}
	e.header("formats", fmt.Sprintf("Serializers on a chat channel (Channel struct): serialized bytes, and what packcache.Cache[Channel] with WithSerializer(s) stores with the default codec (zstd above 1024 B) and with brotli 1 (WithCodec). "+
		"Marshal and Unmarshal µs: the serializer alone, median (min–max) of %d runs of N each.", e.cfg.reps))
	fmt.Fprintln(e.out, "| document | serializer | serialized B | vs go-json | STRLEN zstd | STRLEN brotli 1 | N | Marshal µs | Unmarshal µs |")
	fmt.Fprintln(e.out, "|---|---|--:|--:|--:|--:|--:|--:|--:|")
	for di, size := range sizes {
		ch := makeChannel(uint64(300+di), size)
		n := opsFor(size, e.cfg.quick, e.cfg.ops)
		var goJSON int
		for si, s := range sers {
			b, err := s.s.Marshal(nil, &ch)
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			if si == 0 {
				goJSON = len(b)
			}
			var back Channel
			if err := s.s.Unmarshal(b, &back); err != nil || len(back.Messages) != len(ch.Messages) {
				return fmt.Errorf("%s: does not read back what it wrote: %v", s.name, err)
			}
			var strlens [2]int64
			for ci, c := range []codec.Codec{codec.Zstd, brotli1} {
				pc, err := packcache.New[Channel](e.rdb, packcache.WithSerializer(s.s), packcache.WithCodec(c))
				if err != nil {
					return err
				}
				k := e.key("formats", fmt.Sprint(di, si, ci))
				err = pc.Set(ctx, k, ch)
				pc.Close()
				if err != nil {
					return err
				}
				if strlens[ci], _, err = e.stored(ctx, k); err != nil {
					return err
				}
			}
			var marshal, unmarshal []float64
			buf := b
			for range e.cfg.reps {
				t := time.Now()
				for range n {
					buf, _ = s.s.Marshal(buf[:0], &ch)
				}
				marshal = append(marshal, float64(time.Since(t).Nanoseconds())/float64(n))
				t = time.Now()
				for range n {
					var v Channel
					s.s.Unmarshal(b, &v)
				}
				unmarshal = append(unmarshal, float64(time.Since(t).Nanoseconds())/float64(n))
			}
			fmt.Fprintf(e.out, "| channel %s | %s | %d | %.3f | %d | %d | %d | %s | %s |\n", human(size), s.name, len(b), float64(len(b))/float64(goJSON),
				strlens[0], strlens[1], n, spreadOf(marshal).us(), spreadOf(unmarshal).us())
		}
	}
	return e.reset(ctx)
}
