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
	dir := corpusDir()
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

// corpusDir returns the directory of the shared JSON corpus, if it is
// beside the repository or named by $PACKCACHE_CORPUS, or "".
func corpusDir() string {
	for _, d := range []string{os.Getenv("PACKCACHE_CORPUS"), "../../shared/corpus", "/work/shared/corpus"} {
		if d != "" {
			if _, err := os.Stat(filepath.Join(d, "twitter.json")); err == nil {
				return d
			}
		}
	}
	return ""
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

// BenchmarkDict measures small values, one per iteration: the profile and
// session records of TestDictionaryStoredRatio (150-400 bytes, 500 in
// turn), stored with Zstd and with a 4 KiB dictionary trained on 500
// others, at the fastest and the default level, into buffers reused from
// call to call. It reports stored-B, the mean stored size with the header
// byte, beside plain-B.
//
// The interleaved sub-benchmark times all four calls on each record in
// turn, so that they see the same load on a shared, noisy machine, and
// reports the median call of each (zstd-enc-ns, dict-enc-ns, zstd-dec-ns,
// dict-dec-ns), which are the numbers to quote. Run it with
//
//	go test -run '^$' -bench Dict -count 6 ./codec | tee dict.txt
//	go run golang.org/x/perf/cmd/benchstat@latest dict.txt
func BenchmarkDict(b *testing.B) {
	records := smallRecords(1000, 1, 150, 400)
	d := trainedDictionary(b, records[:500], 4<<10)
	test := records[500:]
	plain := 0
	for _, rec := range test {
		plain += len(rec)
	}
	for _, level := range []int{1, 3} {
		zc, dc := ZstdLevel(level), d.Codec(level)
		var zv, dv [][]byte
		zStored, dStored := 0, 0
		for _, rec := range test {
			zv = append(zv, mustAppendValue(b, zc, rec))
			dv = append(dv, mustAppendValue(b, dc, rec))
			zStored += len(zv[len(zv)-1])
			dStored += len(dv[len(dv)-1])
		}
		sizes := func(b *testing.B, stored int) {
			b.ReportMetric(float64(stored)/float64(len(test)), "stored-B")
			b.ReportMetric(float64(plain)/float64(len(test)), "plain-B")
		}
		dst := make([]byte, 0, 1024)
		encode := func(b *testing.B, c Codec, i int) {
			var err error
			if dst, err = AppendValue(dst[:0], c, test[i%len(test)]); err != nil {
				b.Fatal(err)
			}
		}
		decode := func(b *testing.B, values [][]byte, d *Dictionary, i int) {
			var err error
			if dst, err = DecodeValueDict(dst[:0], values[i%len(values)], 1<<20, d); err != nil {
				b.Fatal(err)
			}
		}
		for _, c := range []struct {
			name   string
			c      Codec
			values [][]byte
			d      *Dictionary
			stored int
		}{
			{"zstd", zc, zv, nil, zStored},
			{"dict", dc, dv, d, dStored},
		} {
			b.Run(fmt.Sprintf("encode/%s/level%d", c.name, level), func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					encode(b, c.c, i)
				}
				sizes(b, c.stored)
			})
			b.Run(fmt.Sprintf("decode/%s/level%d", c.name, level), func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					decode(b, c.values, c.d, i)
				}
				sizes(b, c.stored)
			})
		}
		b.Run(fmt.Sprintf("interleaved/level%d", level), func(b *testing.B) {
			// ns/op is the time of the four calls. The samples are made
			// before the loop, so that recording allocates nothing.
			b.ReportAllocs()
			var t [4][]time.Duration
			for k := range t {
				t[k] = make([]time.Duration, 0, 1<<15)
			}
			calls := [4]func(i int){
				func(i int) { encode(b, zc, i) },
				func(i int) { encode(b, dc, i) },
				func(i int) { decode(b, zv, nil, i) },
				func(i int) { decode(b, dv, d, i) },
			}
			for i := 0; b.Loop(); i++ {
				for k := range calls {
					k = (k + i) % len(calls) // each first in turn
					t0 := time.Now()
					calls[k](i)
					if len(t[k]) < cap(t[k]) {
						t[k] = append(t[k], time.Since(t0))
					}
				}
			}
			for k, name := range []string{"zstd-enc-ns", "dict-enc-ns", "zstd-dec-ns", "dict-dec-ns"} {
				b.ReportMetric(float64(median(t[k]).Nanoseconds()), name)
			}
			b.ReportMetric(float64(zStored)/float64(len(test)), "zstd-stored-B")
			b.ReportMetric(float64(dStored)/float64(len(test)), "dict-stored-B")
		})
	}
}
