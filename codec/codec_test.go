package codec

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives the tests. The
// codecs start none: zstd EncodeAll and DecodeAll run on the caller's
// goroutine, and stream decoders are synchronous (concurrency 1), so no
// goroutine needs to be ignored.
//
// The tests allocate and drop many large buffers, in parallel: a soft
// memory limit (unless GOMEMLIMIT sets one) keeps the binary's memory near
// what they hold live, about half of what it would grow to.
func TestMain(m *testing.M) {
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(256 << 20)
	}
	goleak.VerifyTestMain(m)
}

// allCodecs lists every distinct encoder, so round trips cover every level
// that can write differently.
func allCodecs() []Codec {
	cs := []Codec{None}
	for l := range 10 {
		cs = append(cs, LZ4Level(l))
	}
	return append(cs, Snappy, Zstd, ZstdDefault, ZstdBetter, ZstdBest)
}

// codecLabel names a codec with its level, for subtests and fuzz selection.
func codecLabel(c Codec) string {
	switch c {
	case LZ4:
		return "lz4"
	case LZ4HC:
		return "lz4hc"
	case Zstd:
		return "zstd"
	case ZstdDefault:
		return "zstd-default"
	case ZstdBetter:
		return "zstd-better"
	case ZstdBest:
		return "zstd-best"
	}
	for l := 1; l < 9; l++ {
		if c == LZ4Level(l) {
			return fmt.Sprintf("lz4hc%d", l)
		}
	}
	return c.Name()
}

var words = []string{
	"the", "deploy", "is", "green", "again", "can", "you", "review", "my",
	"PR", "lunch?", "ok", "merged", "thanks!", "flaky", "test", "on", "CI",
	"rollback", "done", "looks", "good", "to", "me", "ship", "it", "cache",
	"miss", "latency", "p99", "spiked", "at", "noon", "ü", "café", "🚀",
}

var users = []string{"alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"}

// appendChatMessage appends one chat message as JSON, shaped like what a
// chat service caches: ids, names, timestamps, free text and nested arrays.
func appendChatMessage(b []byte, r *rand.Rand, i int) []byte {
	u := r.IntN(len(users))
	b = fmt.Appendf(b, `{"id":"msg_%08d","room":"room-%d","user":{"id":%d,"name":%q,"avatar":"https://cdn.example.com/u/%d.png"},"ts":"2024-05-%02dT%02d:%02d:%02dZ","text":"`,
		i, r.IntN(20), 1000+u, users[u], 1000+u, 1+r.IntN(28), r.IntN(24), r.IntN(60), r.IntN(60))
	for w := range 3 + r.IntN(25) {
		if w > 0 {
			b = append(b, ' ')
		}
		b = append(b, words[r.IntN(len(words))]...)
	}
	b = append(b, `","reactions":[`...)
	for k := range r.IntN(3) {
		if k > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `{"emoji":"%s","count":%d}`, []string{"+1", "tada", "eyes"}[k], 1+r.IntN(9))
	}
	return fmt.Appendf(b, `],"edited":%t,"thread":%d}`, r.IntN(5) == 0, r.IntN(1000))
}

// chatJSON returns a JSON array of chat messages, deterministic for a
// given n, of at least n bytes, cut to exactly n. Cutting leaves invalid
// JSON, which no codec cares about.
func chatJSON(n int) []byte {
	r := rand.New(rand.NewPCG(1, uint64(n)))
	b := make([]byte, 0, n+1024)
	b = append(b, '[')
	for i := 0; len(b) < n; i++ {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendChatMessage(b, r, i)
	}
	return b[:n]
}

// chatDoc returns a complete JSON array of count messages.
func chatDoc(count int) []byte {
	r := rand.New(rand.NewPCG(7, 7))
	b := []byte{'['}
	for i := range count {
		if i > 0 {
			b = append(b, ",\n"...)
		}
		b = appendChatMessage(b, r, i)
	}
	return append(b, "]\n"...)
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 99))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// isSentinel reports whether err matches one of the errors DecodeValue
// documents.
func isSentinel(err error) bool {
	return errors.Is(err, ErrCorrupt) || errors.Is(err, ErrTooLarge) || errors.Is(err, ErrUnknownHeader) || errors.Is(err, ErrUnknownDictionary)
}

// allocated returns how many bytes f allocated on the heap.
func allocated(f func()) uint64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func mustAppendValue(t testing.TB, c Codec, src []byte) []byte {
	t.Helper()
	v, err := AppendValue(nil, c, src)
	if err != nil {
		t.Fatalf("AppendValue(%s): %v", c.Name(), err)
	}
	return v
}

func equalOrDiff(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Fatalf("%s: got %d bytes, want %d, first difference at %d", what, len(got), len(want), i)
	}
}
