package codec

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

var benchSizes = []struct {
	name string
	n    int
}{{"1KB", 1 << 10}, {"128KB", 128 << 10}, {"1MB", 1 << 20}}

var benchCodecs = []Codec{None, LZ4, LZ4HC, Snappy, Zstd, ZstdDefault, ZstdBetter, ZstdBest}

func BenchmarkEncode(b *testing.B) {
	for _, c := range benchCodecs {
		for _, s := range benchSizes {
			src := chatJSON(s.n)
			b.Run(codecLabel(c)+"/"+s.name, func(b *testing.B) {
				benchEncode(b, c, src)
			})
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, c := range benchCodecs {
		for _, s := range benchSizes {
			src := chatJSON(s.n)
			b.Run(codecLabel(c)+"/"+s.name, func(b *testing.B) {
				benchDecode(b, c, src)
			})
		}
	}
}

// BenchmarkCorpus runs on public JSON documents when the shared corpus is
// beside the repository; it is never copied into it.
func BenchmarkCorpus(b *testing.B) {
	var dir string
	for _, d := range []string{os.Getenv("PACKCACHE_CORPUS"), "../../shared/corpus", "/work/shared/corpus"} {
		if d != "" {
			if _, err := os.Stat(filepath.Join(d, "twitter.json")); err == nil {
				dir = d
				break
			}
		}
	}
	if dir == "" {
		b.Skip("no JSON corpus; set PACKCACHE_CORPUS")
	}
	for _, name := range []string{"twitter.json", "citm_catalog.json", "github_events.json"} {
		src, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		for _, c := range []Codec{LZ4, Snappy, Zstd, ZstdBest} {
			b.Run(fmt.Sprintf("%s/%s/encode", name, codecLabel(c)), func(b *testing.B) { benchEncode(b, c, src) })
			b.Run(fmt.Sprintf("%s/%s/decode", name, codecLabel(c)), func(b *testing.B) { benchDecode(b, c, src) })
		}
	}
}

func benchEncode(b *testing.B, c Codec, src []byte) {
	dst, err := c.Encode(nil, src)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		dst, _ = c.Encode(dst[:0], src)
	}
	// After the loop, which resets the benchmark's metrics when it starts.
	b.ReportMetric(float64(len(src))/float64(len(dst)), "ratio")
}

func benchDecode(b *testing.B, c Codec, src []byte) {
	payload, err := c.Encode(nil, src)
	if err != nil {
		b.Fatal(err)
	}
	dst := make([]byte, 0, len(src))
	b.ReportAllocs()
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		if dst, err = c.Decode(dst[:0], payload, len(src)); err != nil {
			b.Fatal(err)
		}
	}
}
