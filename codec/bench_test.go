package codec

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
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

// BenchmarkZstdFloor measures DecodeValue on a zstd value against the
// floor, a plain klauspost/compress decoder (zstd.NewReader(nil), then
// DecodeAll into a reused buffer), on the same frames in the same run:
// chat-like JSON of 235 KiB, which compresses to a frame of about 39 KiB,
// and of 128 KiB, one full block. Both decode into a buffer reused from
// call to call, made by their own first call, as the cache's buffer pool
// reuses what DecodeValue grew; neither should allocate.
//
// The packcache and klauspost sub-benchmarks time each decoder alone. The
// interleaved one runs them in turn, each iteration one call of each, the
// order swapped from one iteration to the next, so that both see the same
// load on a shared, noisy machine; it reports the median call of each
// (packcache-ns, floor-ns) and ratio, packcache's median over the floor's,
// which is the number to quote. Run it with
//
//	go test -run '^$' -bench ZstdFloor -count 6 ./codec | tee floor.txt
//	go run golang.org/x/perf/cmd/benchstat@latest floor.txt
//
// and read ratio, which benchstat shows as the median of the rounds.
func BenchmarkZstdFloor(b *testing.B) {
	floor, err := zstd.NewReader(nil)
	if err != nil {
		b.Fatal(err)
	}
	defer floor.Close()
	for _, f := range []struct {
		name string
		n    int
	}{{"39KB", 235 << 10}, {"128KB", 128 << 10}} {
		doc := chatJSON(f.n)
		value := mustAppendValue(b, Zstd, doc)
		frame := value[1:]
		limit := 2 * len(doc)
		dst, err := DecodeValue(nil, value, limit)
		if err != nil || string(dst) != string(doc) {
			b.Fatalf("%s: DecodeValue: %v", f.name, err)
		}
		buf, err := floor.DecodeAll(frame, nil)
		if err != nil || string(buf) != string(doc) {
			b.Fatalf("%s: DecodeAll: %v", f.name, err)
		}
		pc := func() {
			if dst, err = DecodeValue(dst[:0], value, limit); err != nil || len(dst) != len(doc) {
				b.Fatalf("DecodeValue: %d bytes, %v", len(dst), err)
			}
		}
		fl := func() {
			if buf, err = floor.DecodeAll(frame, buf[:0]); err != nil || len(buf) != len(doc) {
				b.Fatalf("DecodeAll: %d bytes, %v", len(buf), err)
			}
		}
		b.Run(f.name+"/packcache", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(doc)))
			for b.Loop() {
				pc()
			}
		})
		b.Run(f.name+"/klauspost", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(doc)))
			for b.Loop() {
				fl()
			}
		})
		b.Run(f.name+"/interleaved", func(b *testing.B) {
			// ns/op is the time of the pair. The samples are made
			// before the loop, so that recording allocates nothing:
			// past their capacity, the first calls stand for all.
			b.ReportAllocs()
			pcT := make([]time.Duration, 0, 1<<15)
			flT := make([]time.Duration, 0, 1<<15)
			odd := false
			for b.Loop() {
				first, second := pc, fl
				if odd {
					first, second = fl, pc
				}
				t0 := time.Now()
				first()
				t1 := time.Now()
				second()
				t2 := time.Now()
				p, q := t1.Sub(t0), t2.Sub(t1)
				if odd {
					p, q = q, p // the floor ran first
				}
				if len(pcT) < cap(pcT) {
					pcT, flT = append(pcT, p), append(flT, q)
				}
				odd = !odd
			}
			p, q := median(pcT), median(flT)
			b.ReportMetric(float64(p.Nanoseconds()), "packcache-ns")
			b.ReportMetric(float64(q.Nanoseconds()), "floor-ns")
			b.ReportMetric(float64(p)/float64(q), "ratio")
			// After the loop, which deletes metrics when it starts.
			b.ReportMetric(float64(len(frame)), "frame-bytes")
		})
	}
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}
