package brotli_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/packcache/packcache/brotli"
	"github.com/packcache/packcache/codec"
)

// benchCodecs are the Brotli qualities worth comparing, with packcache's
// default codec, Zstandard at its fastest level, and two slower Zstandard
// levels, for reference.
func benchCodecs() []struct {
	name string
	c    codec.Codec
} {
	out := []struct {
		name string
		c    codec.Codec
	}{{"zstd", codec.Zstd}, {"zstd-default", codec.ZstdDefault}, {"zstd-better", codec.ZstdBetter}}
	for _, q := range []int{0, 1, 4, 5, 9, 11} {
		out = append(out, struct {
			name string
			c    codec.Codec
		}{fmt.Sprintf("brotli%d", q), brotli.New(q)})
	}
	return out
}

// slow reports whether a quality is too slow to benchmark on a document of
// n bytes in reasonable time: qualities 10 and 11 write about a megabyte a
// second.
func slow(name string, n int) bool {
	return name == "brotli11" && n > 2<<20
}

// BenchmarkCodec encodes and decodes chat-channel JSON built here, of
// 128 KiB, 1 MiB and 20 MiB, reporting throughput of the JSON (MB/s) and
// the compressed size as a fraction of it (ratio).
func BenchmarkCodec(b *testing.B) {
	for _, size := range []struct {
		name string
		n    int
	}{{"128KB", 128 << 10}, {"1MB", 1 << 20}, {"20MB", 20 << 20}} {
		benchDoc(b, "chat"+size.name, chatJSON(size.n))
	}
}

// BenchmarkCorpus runs on the public JSON documents of the shared corpus
// when it is beside the repository (PACKCACHE_CORPUS names another
// directory); they are read at run time, never copied into the module.
func BenchmarkCorpus(b *testing.B) {
	var files []string
	for _, d := range []string{os.Getenv("PACKCACHE_CORPUS"), "../../shared/corpus", "/work/shared/corpus"} {
		if d == "" {
			continue
		}
		if files, _ = filepath.Glob(filepath.Join(d, "*.json")); len(files) > 0 {
			break
		}
	}
	if len(files) == 0 {
		b.Skip("no JSON corpus; set PACKCACHE_CORPUS")
	}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			b.Fatal(err)
		}
		benchDoc(b, filepath.Base(f), src)
	}
}

func benchDoc(b *testing.B, doc string, src []byte) {
	for _, bc := range benchCodecs() {
		if slow(bc.name, len(src)) {
			continue
		}
		p, err := bc.c.Encode(nil, src)
		if err != nil {
			b.Fatal(err)
		}
		ratio := float64(len(p)) / float64(len(src))
		b.Run(doc+"/"+bc.name+"/encode", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(src)))
			dst := p
			for b.Loop() {
				dst, _ = bc.c.Encode(dst[:0], src)
			}
			b.ReportMetric(ratio, "ratio")
		})
		b.Run(doc+"/"+bc.name+"/decode", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(src)))
			out := make([]byte, 0, len(src))
			for b.Loop() {
				if out, err = bc.c.Decode(out[:0], p, len(src)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(ratio, "ratio")
		})
	}
}
