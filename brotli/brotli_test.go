package brotli_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"testing"

	brotlilib "github.com/andybalholm/brotli"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/packcache/packcache/brotli"
	"github.com/packcache/packcache/codec"
)

// registered is the codec every test reader has: the registry is
// process-wide, so it is registered once, here, as an application does
// at start-up.
var registered = brotli.New(brotli.DefaultQuality)

func TestMain(m *testing.M) {
	if err := codec.Register(registered); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	redis.SetLogger(quietLogger{})
	goleak.VerifyTestMain(m)
}

var words = []string{
	"the", "deploy", "is", "green", "again", "can", "you", "review", "my",
	"PR", "lunch?", "ok", "merged", "thanks!", "flaky", "test", "on", "CI",
	"rollback", "done", "looks", "good", "to", "me", "ship", "it", "cache",
	"miss", "latency", "p99", "spiked", "at", "noon", "ü", "café", "🚀",
}

// chatJSON returns a JSON array of chat messages of at least n bytes (a
// complete document), the same for a given n.
func chatJSON(n int) []byte {
	r := rand.New(rand.NewPCG(1, uint64(n)))
	b := []byte{'['}
	for i := 0; len(b) < n; i++ {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `{"id":%d,"author":"user%04d","sent":"2026-03-%02dT%02d:%02d:%02dZ","text":"`,
			1_000_000+i, r.IntN(500), 1+r.IntN(28), r.IntN(24), r.IntN(60), r.IntN(60))
		for w := range 3 + r.IntN(25) {
			if w > 0 {
				b = append(b, ' ')
			}
			b = append(b, words[r.IntN(len(words))]...)
		}
		b = append(b, `","likes":[`...)
		for k := range r.IntN(4) {
			if k > 0 {
				b = append(b, ',')
			}
			b = fmt.Appendf(b, `"user%04d"`, r.IntN(500))
		}
		b = append(b, "]}"...)
	}
	return append(b, ']')
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 99))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func mustEncode(t testing.TB, c *brotli.Codec, src []byte) []byte {
	t.Helper()
	p, err := c.Encode(nil, src)
	if err != nil {
		t.Fatalf("Encode(quality %d, %d bytes): %v", c.Quality(), len(src), err)
	}
	return p
}

// stockDecode decodes a payload with the library's own Reader and nothing
// else: the payload is a standard stream.
func stockDecode(p []byte) ([]byte, error) {
	return io.ReadAll(brotlilib.NewReader(bytes.NewReader(p)))
}

func TestRoundTrip(t *testing.T) {
	t.Parallel() // codecs of its own; CPU, beside the other codec tests (TestBomb, which counts allocation, runs alone before)
	inputs := []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"one byte", []byte("1")},
		{"small object", []byte(`{"user":"alice","text":"hello hello hello hello"}`)},
		{"chat 2KB", chatJSON(2 << 10)},
		{"chat 64KB", chatJSON(64 << 10)},
		{"random 64KB", randomBytes(64<<10, 1)},
		{"zeros 300KB", make([]byte, 300<<10)},
		{"chat 1MB", chatJSON(1 << 20)},
		{"chat 5MB", chatJSON(5 << 20)}, // longer than the 4 MiB window
	}
	for q := 0; q <= 11; q++ {
		c := brotli.New(q)
		for _, in := range inputs {
			if q >= 10 && len(in.b) > 64<<10 {
				continue // seconds per megabyte at these qualities
			}
			// One window's worth and more at a few qualities is enough;
			// the race detector makes each ten times slower.
			if len(in.b) > 1<<20 && (q != 0 && q != 1 && q != 5 || testing.Short() || raceEnabled && q != 1) {
				continue
			}
			t.Run(fmt.Sprintf("q%d/%s", q, in.name), func(t *testing.T) {
				p := mustEncode(t, c, in.b)
				prefix := []byte("prefix")
				// Encode appends.
				if p2, err := c.Encode(bytes.Clone(prefix), in.b); err != nil || !bytes.Equal(p2, append(bytes.Clone(prefix), p...)) {
					t.Fatalf("Encode after a prefix: %v, or not the same payload", err)
				}
				// Decode appends, and leaves what was there.
				out, err := c.Decode(bytes.Clone(prefix), p, len(in.b))
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				if !bytes.HasPrefix(out, prefix) || !bytes.Equal(out[len(prefix):], in.b) {
					t.Fatalf("Decode: %d bytes back for %d", len(out)-len(prefix), len(in.b))
				}
				// The payload is a standard stream.
				if stock, err := stockDecode(p); err != nil || !bytes.Equal(stock, in.b) {
					t.Fatalf("stock reader: %d bytes, %v", len(stock), err)
				}
				// Through the value format, by the registered codec of
				// another quality.
				v, err := codec.AppendValue(nil, c, in.b)
				if err != nil {
					t.Fatal(err)
				}
				if v[0] != brotli.DefaultHeader {
					t.Fatalf("value begins 0x%02x, want 0x%02x", v[0], brotli.DefaultHeader)
				}
				got, err := codec.DecodeValue(nil, v, len(in.b))
				if err != nil || !bytes.Equal(got, in.b) {
					t.Fatalf("DecodeValue: %d bytes, %v", len(got), err)
				}
				if len(in.b) > 0 {
					if _, err := c.Decode(nil, p, len(in.b)-1); !errors.Is(err, codec.ErrTooLarge) {
						t.Fatalf("Decode with limit %d for %d bytes: %v, want ErrTooLarge", len(in.b)-1, len(in.b), err)
					}
				}
			})
		}
	}
}

func TestNewAndHeader(t *testing.T) {
	if c := brotli.New(-3); c.Quality() != 0 {
		t.Errorf("New(-3).Quality() = %d, want 0", c.Quality())
	}
	if c := brotli.New(12); c.Quality() != 11 {
		t.Errorf("New(12).Quality() = %d, want 11", c.Quality())
	}
	c := brotli.New(5)
	if c.ID() != 0x10 || c.Name() != "brotli" {
		t.Errorf("New(5): ID 0x%02x, name %q", c.ID(), c.Name())
	}
	if c := brotli.New(5, brotli.WithHeader(0x1d)); c.ID() != 0x1d {
		t.Errorf("WithHeader(0x1d): ID 0x%02x", c.ID())
	}
	// Every quality shares the format: another quality under the same
	// byte is refused, as the byte is taken, and so is a reserved byte.
	if err := codec.Register(brotli.New(9)); err == nil {
		t.Error("registering a second codec under 0x10 succeeded")
	}
	if err := codec.Register(brotli.New(1, brotli.WithHeader(codec.HeaderZstd))); err == nil {
		t.Error("registering under the zstd header byte succeeded")
	}
	if err := codec.Register(brotli.New(1, brotli.WithHeader(0x1f))); err == nil {
		t.Error("registering under 0x1f succeeded")
	}
}

// TestLimits checks Decode against limits at and around the decoded size.
func TestLimits(t *testing.T) {
	c := brotli.New(1)
	empty := mustEncode(t, c, nil)
	for _, limit := range []int{-1, 0, 10} {
		if out, err := c.Decode(nil, empty, limit); err != nil || len(out) != 0 {
			t.Errorf("empty stream, limit %d: %d bytes, %v", limit, len(out), err)
		}
	}
	src := chatJSON(100 << 10)
	p := mustEncode(t, c, src)
	for _, limit := range []int{-1, 0, 1, 512, len(src) - 1} {
		if _, err := c.Decode(nil, p, limit); !errors.Is(err, codec.ErrTooLarge) {
			t.Errorf("%d bytes, limit %d: %v, want ErrTooLarge", len(src), limit, err)
		}
	}
	for _, limit := range []int{len(src), len(src) + 1, 1 << 30, math.MaxInt} {
		if out, err := c.Decode(nil, p, limit); err != nil || !bytes.Equal(out, src) {
			t.Errorf("%d bytes, limit %d: %d bytes, %v", len(src), limit, len(out), err)
		}
	}
	// A buffer with room for the value is used, not replaced.
	buf := make([]byte, 0, len(src))
	if out, err := c.Decode(buf, p, len(src)); err != nil || &out[0] != &buf[:1][0] {
		t.Errorf("decoding into a buffer with room: %v, or a new buffer", err)
	}
}

func TestHostile(t *testing.T) {
	c := brotli.New(5)
	src := chatJSON(20 << 10)
	p := mustEncode(t, c, src)
	const limit = 1 << 20

	wantCorrupt := func(name string, payload []byte) {
		t.Helper()
		out, err := c.Decode([]byte("x"), payload, limit)
		if !errors.Is(err, codec.ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
		if string(out) != "x" {
			t.Errorf("%s: dst changed to %d bytes on error", name, len(out))
		}
	}
	wantCorrupt("empty payload", nil)
	for n := 1; n < len(p); n++ {
		if n > 64 && n%97 != 0 && n < len(p)-64 {
			continue // every short and every nearly whole prefix, a sample between
		}
		wantCorrupt(fmt.Sprintf("truncated to %d of %d bytes", n, len(p)), p[:n])
	}
	wantCorrupt("trailing zero byte", append(bytes.Clone(p), 0))
	wantCorrupt("trailing garbage", append(bytes.Clone(p), "garbage"...))
	wantCorrupt("two streams", append(bytes.Clone(p), p...))
	// 0x11: the 7-bit window code 1000 100, the large-window extension,
	// which the RFC 7932 format does not have.
	wantCorrupt("large-window stream", append([]byte{0x11}, p[1:]...))
	// A stream declaring the reserved window code 1000 100 followed by an
	// ordinary last empty meta-block.
	wantCorrupt("reserved window bits then end", []byte{0x11, 0x03})

	// Random payloads and damaged streams never panic, never exceed the
	// limit and fail only with the codec package's sentinels. Brotli has no
	// checksum, so a damaged stream may also decode to other bytes.
	r := rand.New(rand.NewPCG(3, 3))
	check := func(name string, payload []byte, limit int) {
		t.Helper()
		out, err := c.Decode(nil, payload, limit)
		if err != nil && !errors.Is(err, codec.ErrCorrupt) && !errors.Is(err, codec.ErrTooLarge) {
			t.Errorf("%s: untyped error %v", name, err)
		}
		if err != nil && len(out) != 0 {
			t.Errorf("%s: %d bytes with error %v", name, len(out), err)
		}
		if len(out) > limit {
			t.Errorf("%s: %d bytes over limit %d", name, len(out), limit)
		}
	}
	for i := range 2000 {
		check(fmt.Sprintf("random %d", i), randomBytes(r.IntN(300), uint64(i)), 1000)
	}
	for i := range 500 {
		q := bytes.Clone(p)
		for range 1 + r.IntN(4) {
			q[r.IntN(len(q))] ^= byte(1 + r.IntN(255))
		}
		check(fmt.Sprintf("flipped %d", i), q, len(src))
	}
}

// allocated returns how many bytes f allocated on the heap.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// coldPools empties every sync.Pool, the decoders' included: a pooled
// object survives one collection in the victim cache, not two.
func coldPools() {
	runtime.GC()
	runtime.GC()
}

// bomb returns a Brotli stream of size zero bytes written with window
// 2^lgwin: about a hundred bytes for 64 MiB at quality 5.
func bomb(t testing.TB, size, lgwin int) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := brotlilib.NewWriterOptions(&buf, brotlilib.WriterOptions{Quality: 5, LGWin: lgwin})
	zeros := make([]byte, 1<<20)
	for range size >> 20 {
		if _, err := w.Write(zeros); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestBomb decodes streams of a hundred bytes that hold 64 MiB against a
// limit of 1 MiB: each is refused as too large, having allocated about
// what the limit allows, not what the stream holds or the window it
// declares.
func TestBomb(t *testing.T) {
	const (
		size  = 64 << 20
		limit = 1 << 20
		// With no pooled decoder: the output, grown geometrically to the
		// limit (under 2 x limit in all), and the decoder's ring buffer,
		// grown by doubling to the window shrinkWindow leaves, 2 MiB here
		// (under 2 x 2 MiB in all), plus its tables and input buffer.
		coldBound = 2*limit + 2*(2<<20) + 512<<10
		// A pooled decoder keeps its ring buffer, so most calls allocate
		// the output alone. sync.Pool may miss (when the goroutine moved
		// to another P), which costs a ring buffer.
		steadyBound = 2*limit + 1<<20
		runs        = 20
	)
	steady := uint64(steadyBound)
	if raceEnabled {
		steady = coldBound // sync.Pool drops one Put in four under -race
	}
	for _, lgwin := range []int{22, 24} {
		b := bomb(t, size, lgwin)
		t.Logf("window 2^%d: %d bytes decode to %d", lgwin, len(b), size)

		var err error
		coldPools()
		cold := allocated(func() { _, err = registered.Decode(nil, b, limit) })
		if !errors.Is(err, codec.ErrTooLarge) {
			t.Fatalf("window 2^%d: %v, want ErrTooLarge", lgwin, err)
		}
		perCall := allocated(func() {
			for range runs {
				if _, err := registered.Decode(nil, b, limit); !errors.Is(err, codec.ErrTooLarge) {
					t.Errorf("window 2^%d: %v, want ErrTooLarge", lgwin, err)
				}
			}
		}) / runs
		// What the library's own Reader allocates to read the same limit
		// out of the stream, for comparison: its ring buffer grows to
		// the declared window.
		coldPools()
		stock := allocated(func() {
			io.ReadFull(brotlilib.NewReader(bytes.NewReader(b)), make([]byte, limit+1))
		})
		t.Logf("window 2^%d, limit %d: allocated %d with empty pools, %d a call after; a stock Reader reading limit+1 bytes: %d",
			lgwin, limit, cold, perCall, stock)
		if cold > coldBound {
			t.Errorf("window 2^%d: allocated %d with empty pools, bound %d", lgwin, cold, coldBound)
		}
		if perCall > steady {
			t.Errorf("window 2^%d: allocated %d a call, bound %d", lgwin, perCall, steady)
		}
		// Within its size, the bomb is just a value.
		if !testing.Short() {
			out, err := registered.Decode(nil, b, size)
			// Every byte zero: counted with the vectorised single-byte
			// Count, not decoded rune by rune (a third of the test's CPU).
			if err != nil || len(out) != size || bytes.Count(out, []byte{0}) != size {
				t.Errorf("window 2^%d, limit %d: %d bytes, %v", lgwin, size, len(out), err)
			}
		}
	}
}

// TestShrunkWindowKeepsOutput decodes streams written with every 4-bit
// window code under limits that make Decode lower the window, and checks
// the output against the library's own Reader: text that the higher
// qualities encode partly with references into Brotli's static dictionary,
// whose meaning depends on the greatest backward distance.
func TestShrunkWindowKeepsOutput(t *testing.T) {
	t.Parallel()
	// Over 256 KiB, the least window, so that every window's ring buffer
	// wraps, and under 512 KiB, so that every window from 2^20 up is
	// lowered (to 2^19) under the limits that let it decode: quality 11
	// encodes half a megabyte a second, so every byte more costs.
	var text []byte
	for i := 0; len(text) < 150<<10; i++ {
		text = fmt.Appendf(text, "The quick brown fox %d jumps over the lazy dog; international government information. ", i)
	}
	text = append(text, chatJSON(150<<10)...)
	for _, q := range []int{1, 6, 11} {
		if q == 11 && (testing.Short() || raceEnabled) {
			continue // half a megabyte a second, ten times slower under -race
		}
		for lgwin := 18; lgwin <= 24; lgwin++ {
			if q == 11 && lgwin != 18 && lgwin != 24 {
				continue
			}
			var buf bytes.Buffer
			w := brotlilib.NewWriterOptions(&buf, brotlilib.WriterOptions{Quality: q, LGWin: lgwin})
			w.Write(text)
			w.Close()
			p := buf.Bytes()
			stock, err := stockDecode(p)
			if err != nil || !bytes.Equal(stock, text) {
				t.Fatalf("q%d window 2^%d: stock reader: %v", q, lgwin, err)
			}
			// len(text) is about 300 KB: windows of 2^20 and up are
			// lowered to 2^19.
			for _, limit := range []int{len(text), len(text) + 100<<10} {
				out, err := registered.Decode(nil, p, limit)
				if err != nil || !bytes.Equal(out, text) {
					t.Errorf("q%d window 2^%d limit %d: %d bytes, %v", q, lgwin, limit, len(out), err)
				}
			}
			for _, limit := range []int{len(text) - 1, 200 << 10, 1000} {
				if _, err := registered.Decode(nil, p, limit); !errors.Is(err, codec.ErrTooLarge) && !errors.Is(err, codec.ErrCorrupt) {
					t.Errorf("q%d window 2^%d limit %d: %v, want a refusal", q, lgwin, limit, err)
				}
			}
		}
	}
}

// TestConcurrent runs encoders and decoders of one codec from many
// goroutines: the pools hand each its own state.
func TestConcurrent(t *testing.T) {
	t.Parallel()
	c := brotli.New(3)
	docs := [][]byte{nil, chatJSON(1 << 10), chatJSON(50 << 10), randomBytes(10<<10, 5)}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				src := docs[(g+i)%len(docs)]
				p, err := c.Encode(nil, src)
				if err != nil {
					t.Error(err)
					return
				}
				out, err := c.Decode(nil, p, len(src))
				if err != nil || !bytes.Equal(out, src) {
					t.Errorf("goroutine %d: %d bytes, %v", g, len(out), err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// FuzzDecode checks, on any payload, that Decode returns at most limit
// bytes or one of the codec package's errors, and that whatever it decodes
// is what the library's own Reader decodes from the stream as written: the
// window Decode lowers changes nothing it returns.
func FuzzDecode(f *testing.F) {
	c := brotli.New(5)
	for _, s := range [][]byte{nil, []byte(`{"a":1}`), chatJSON(3000), make([]byte, 5000)} {
		p, _ := c.Encode(nil, s)
		f.Add(p, uint16(len(s)))
		f.Add(p, uint16(len(s)/2))
	}
	f.Fuzz(func(t *testing.T, payload []byte, limit16 uint16) {
		limit := int(limit16)
		out, err := registered.Decode(nil, payload, limit)
		if err != nil {
			if !errors.Is(err, codec.ErrCorrupt) && !errors.Is(err, codec.ErrTooLarge) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if len(out) > limit {
			t.Fatalf("%d bytes over limit %d", len(out), limit)
		}
		stock, serr := io.ReadAll(io.LimitReader(brotlilib.NewReader(bytes.NewReader(payload)), int64(limit)+1))
		if serr != nil || !bytes.Equal(stock, out) {
			t.Fatalf("Decode gave %d bytes, the stock reader %d bytes and %v", len(out), len(stock), serr)
		}
	})
}

// TestEncodeIndependentOfHistory: what Encode writes for an input does
// not depend on what the codec's pooled writers compressed before. The
// library tunes a writer to its first input's size and keeps that across
// Reset; one pool for every size wrote a 1 MiB value 3-8% larger at
// qualities 4 to 9 after a small one, and a small value larger after a
// large one.
func TestEncodeIndependentOfHistory(t *testing.T) {
	t.Parallel()
	sizes := []int{2 << 10, 768 << 10, 1 << 20}
	for _, q := range []int{4, 5} {
		fresh := map[int][]byte{}
		for _, n := range sizes {
			fresh[n] = mustEncode(t, brotli.New(q), chatJSON(n))
		}
		c := brotli.New(q)
		for _, order := range [][]int{{0, 1, 2, 0}, {2, 0, 1, 2}} {
			for _, i := range order {
				n := sizes[i]
				if got := mustEncode(t, c, chatJSON(n)); !bytes.Equal(got, fresh[n]) {
					t.Errorf("q%d: %d bytes encoded to %d bytes by a writer used before, %d by a new one", q, n, len(got), len(fresh[n]))
				}
			}
		}
	}
}
