package packcache_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

var allCodecs = []codec.Codec{codec.None, codec.LZ4, codec.LZ4HC, codec.Snappy, codec.Zstd, codec.ZstdDefault, codec.ZstdBetter, codec.ZstdBest}

func TestRoundTripCodecsSizesSerializers(t *testing.T) {
	// Parallel: the tests that measure the heap do so in processes of
	// their own (alone), where its 8 MiB values do not count.
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		sizes := []int{0, 1, 100, 1023, 1024, 1025, 40 << 10, 128 << 10, 1 << 20}
		if !testing.Short() {
			sizes = append(sizes, 8<<20)
		}
		codecs, sers := allCodecs, []packcache.Serializer{packcache.JSON, packcache.Gob}
		if tg.Cluster != nil {
			// The cluster adds slot routing, which is the same for every
			// format: one codec and one serializer cover it.
			codecs, sers = []codec.Codec{codec.Zstd}, sers[:1]
		}
		for _, cd := range codecs {
			for _, ser := range sers {
				c := mustNew[Channel](t, tg.Client, packcache.WithCodec(cd), packcache.WithSerializer(ser))
				raw := mustNew[[]byte](t, tg.Client, packcache.WithCodec(cd))
				for _, size := range sizes {
					if size == 8<<20 && (cd == codec.ZstdBest || cd == codec.LZ4HC || cd == codec.ZstdBetter || ser != packcache.JSON) {
						continue // the slow levels, and gob, at 8 MiB add time and memory, not coverage
					}
					// A minute for each round trip, not for the whole table,
					// which takes about that long under -race on a busy machine.
					ctx := ctxT(t)
					key := fmt.Sprintf("rt:%s:%T:%d", cd.Name(), ser, size)
					want := makeChannel(uint64(size), size)
					if err := c.Set(ctx, key, want); err != nil {
						t.Fatalf("%s Set: %v", key, err)
					}
					got, err := c.Get(ctx, key)
					if err != nil {
						t.Fatalf("%s Get: %v", key, err)
					}
					if !reflect.DeepEqual(got, want) {
						t.Fatalf("%s: round trip changed the value", key)
					}
					// Exact byte sizes, including 0, through []byte.
					rkey := key + ":raw"
					wantRaw := jsonText(size)
					if err := raw.Set(ctx, rkey, wantRaw); err != nil {
						t.Fatalf("%s Set: %v", rkey, err)
					}
					gotRaw, err := raw.Get(ctx, rkey)
					if err != nil {
						t.Fatalf("%s Get: %v", rkey, err)
					}
					if !bytes.Equal(gotRaw, wantRaw) || gotRaw == nil {
						t.Fatalf("%s: raw round trip changed %d bytes into %d", rkey, len(wantRaw), len(gotRaw))
					}
				}
			}
		}
	})
}

func TestThresholdBoundary(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	for _, n := range []int{256, 1024, 4000} {
		c := mustNew[[]byte](t, rdb, packcache.WithCompressAbove(n), packcache.WithCodec(codec.LZ4))
		if err := c.Set(ctx, "at", jsonText(n)); err != nil {
			t.Fatal(err)
		}
		if err := c.Set(ctx, "above", jsonText(n+1)); err != nil {
			t.Fatal(err)
		}
		if b := rawGet(t, rdb, "at"); b[0] != '"' || len(b) != n {
			t.Errorf("n=%d: value of n bytes stored as %d bytes starting %#x, want plain", n, len(b), b[0])
		}
		if b := rawGet(t, rdb, "above"); b[0] != codec.HeaderLZ4 {
			t.Errorf("n=%d: value of n+1 bytes stored starting %#x, want LZ4 header", n, b[0])
		}
	}
}

// TestCompressAllCompressesSmallValues: CompressAll, as the threshold,
// compresses a value far below the default 1 KiB.
func TestCompressAllCompressesSmallValues(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[[]byte](t, rdb, packcache.WithCompressAbove(packcache.CompressAll), packcache.WithCodec(codec.Zstd))
	v := jsonText(300)
	c.Set(ctx, "k", v)
	if b := rawGet(t, rdb, "k"); b[0] != codec.HeaderZstd {
		t.Fatalf("stored %#x..., want zstd", b[0])
	}
}

// TestCompressAboveZeroIsTheDefault: WithCompressAbove(0) means the
// default threshold, 1024 bytes: a value of 1024 bytes is stored plain and
// one of 1025 compressed, as without the option; it neither compresses
// everything nor turns compression off. In a Policy, zero inherits the
// cache's threshold.
func TestCompressAboveZeroIsTheDefault(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	zero := mustNew[[]byte](t, rdb, packcache.WithCompressAbove(0), packcache.WithCodec(codec.LZ4))
	none := mustNew[[]byte](t, rdb, packcache.WithCodec(codec.LZ4))
	inherit := mustNew[[]byte](t, rdb, packcache.WithCompressAbove(256), packcache.WithCodec(codec.LZ4),
		packcache.WithPrefix("p:", packcache.Policy{CompressAbove: 0}))
	cases := []struct {
		c     *packcache.Cache[[]byte]
		key   string
		n     int
		plain bool
	}{
		{zero, "zero:at", 1024, true},
		{zero, "zero:above", 1025, false},
		{zero, "zero:small", 300, true},
		{none, "none:at", 1024, true},
		{none, "none:above", 1025, false},
		{inherit, "p:at", 256, true},
		{inherit, "p:above", 257, false},
	}
	for _, tc := range cases {
		if err := tc.c.Set(ctx, tc.key, jsonText(tc.n)); err != nil {
			t.Fatal(err)
		}
		b := rawGet(t, rdb, tc.key)
		if plain := b[0] == '"' && len(b) == tc.n; plain != tc.plain {
			t.Errorf("%s: %d bytes stored as %d bytes starting %#x; want plain %v", tc.key, tc.n, len(b), b[0], tc.plain)
		}
		if !tc.plain && b[0] != codec.HeaderLZ4 {
			t.Errorf("%s: stored starting %#x, want the LZ4 header", tc.key, b[0])
		}
	}
}

func TestIncompressibleStoredPlain(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[[]byte](t, rdb, packcache.WithCompressAbove(packcache.CompressAll))
	// Random base64 text barely compresses: with a minimum saving of 1 KiB
	// it must be stored plain.
	c2 := mustNew[[]byte](t, rdb, packcache.WithCompressAbove(packcache.CompressAll), packcache.WithPrefix("", packcache.Policy{MinSaving: 1 << 10}))
	v := []byte(`"` + strings.Repeat("aZ3+9qX/", 1) + randomB64(4000) + `"`)
	if err := c2.Set(ctx, "k", v); err != nil {
		t.Fatal(err)
	}
	if b := rawGet(t, rdb, "k"); !bytes.Equal(b, v) {
		t.Fatalf("incompressible value stored as %d bytes starting %#x, want verbatim", len(b), b[0])
	}
	got, err := c.Get(ctx, "k")
	if err != nil || !bytes.Equal(got, v) {
		t.Fatalf("Get = %d bytes, %v", len(got), err)
	}
}

func randomB64(n int) string {
	const alpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	b := make([]byte, n)
	x := uint64(88172645463325252)
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = alpha[x%64]
	}
	return string(b)
}

func TestMissDeleteTTL(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		ctx := ctxT(t)
		c := mustNew[Channel](t, tg.Client, packcache.WithTTL(2*time.Second))
		if _, err := c.Get(ctx, "absent"); !errors.Is(err, packcache.ErrMiss) {
			t.Fatalf("Get of absent key: %v, want ErrMiss", err)
		}
		// A TTL runs from when Redis ran the SET, after t0: what is left
		// when PTTL answers is at least the TTL less the time since t0
		// (rounded to Redis's millisecond), however busy the machine.
		t0 := time.Now()
		c.Set(ctx, "a", Channel{ID: "a"})
		c.Set(ctx, "b", Channel{ID: "b"}, packcache.SetTTL(1500*time.Millisecond))
		c.Set(ctx, "forever", Channel{ID: "f"}, packcache.SetTTL(packcache.Off))
		if d := tg.Client.PTTL(ctx, "a").Val(); d < 2*time.Second-time.Since(t0)-time.Millisecond || d > 2*time.Second {
			t.Errorf("PTTL a = %v, want about 2s", d)
		}
		if d := tg.Client.PTTL(ctx, "b").Val(); d < 1500*time.Millisecond-time.Since(t0)-time.Millisecond || d > 1500*time.Millisecond {
			t.Errorf("PTTL b = %v, want about 1.5s (sub-second precision kept)", d)
		}
		if d := tg.Client.PTTL(ctx, "forever").Val(); d != -1 {
			t.Errorf("PTTL forever = %v, want no expiry", d)
		}
		if err := c.Set(ctx, "bad", Channel{}, packcache.SetTTL(-5)); err == nil {
			t.Error("Set with a negative TTL succeeded")
		}
		// Zero is the policy's TTL, as everywhere.
		t0 = time.Now()
		if err := c.Set(ctx, "policy", Channel{}, packcache.SetTTL(0)); err != nil {
			t.Fatal(err)
		}
		if d := tg.Client.PTTL(ctx, "policy").Val(); d < 2*time.Second-time.Since(t0)-time.Millisecond || d > 2*time.Second {
			t.Errorf("PTTL policy = %v, want the policy's 2s", d)
		}
		if err := c.Delete(ctx, "a", "b", "absent", "{x}1"); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"a", "b"} {
			if _, err := c.Get(ctx, k); !errors.Is(err, packcache.ErrMiss) {
				t.Errorf("after Delete, Get %s: %v", k, err)
			}
		}
	})
}

func TestGetManySetMany(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		ctx := ctxT(t)
		c := mustNew[Channel](t, tg.Client, packcache.WithCompressAbove(100))
		items := map[string]Channel{}
		var keys []string
		for i := range 300 { // spread over every slot range of the cluster
			k := fmt.Sprintf("many:%d", i)
			if i%50 == 0 {
				k = fmt.Sprintf("{tag}:%d", i) // hash tags work too
			}
			items[k] = makeChannel(uint64(i), 200+i*10)
			keys = append(keys, k)
		}
		if err := c.SetMany(ctx, items); err != nil {
			t.Fatal(err)
		}
		got, err := c.GetMany(ctx, append(keys, "many:absent"))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(items) {
			t.Fatalf("GetMany found %d of %d", len(got), len(items))
		}
		for k, v := range items {
			if !reflect.DeepEqual(got[k], v) {
				t.Fatalf("GetMany %s differs", k)
			}
		}
		// One bad value does not hide the others, and its error names it.
		tg.Client.Set(ctx, "many:7", []byte{0x06, 1, 2, 3}, 0)
		got, err = c.GetMany(ctx, keys)
		if len(got) != len(items)-1 || !errors.Is(err, packcache.ErrUnknownHeader) || !strings.Contains(err.Error(), `"many:7"`) {
			t.Fatalf("GetMany with one bad value: %d values, err %v", len(got), err)
		}
		if err := c.Delete(ctx, keys...); err != nil {
			t.Fatal(err)
		}
		got, err = c.GetMany(ctx, keys)
		if err != nil || len(got) != 0 {
			t.Fatalf("after Delete: %d values, %v", len(got), err)
		}
	})
}

// TestSetDuringGetIsSeen attacks Set's promise that no Get of this process
// that starts after Set returns gets an older value: a Get whose GET has
// read the old value in Redis is held before it hears the reply; Set then
// stores a new value, and a Get begun after Set returned must read it
// rather than join the held read (Set detaches it). The held Get, begun
// before Set, may return either. Without a loader and with one.
func TestSetDuringGetIsSeen(t *testing.T) {
	t.Parallel()
	for _, readThrough := range []bool{false, true} {
		t.Run(fmt.Sprintf("readThrough=%v", readThrough), func(t *testing.T) {
			t.Parallel()
			s := redistest.Start(t)
			hook := &holdGetHook{held: make(chan struct{}), release: make(chan struct{})}
			rdb := s.Client(t)
			rdb.AddHook(hook)
			ctx := ctxT(t)
			var opts []packcache.Option
			if readThrough {
				opts = append(opts, packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
					return Channel{ID: "loaded"}, nil
				})))
			}
			c := mustNew[Channel](t, rdb, opts...)
			if err := c.Set(ctx, "k", Channel{ID: "old"}); err != nil {
				t.Fatal(err)
			}
			hook.armed.Store(true)
			first := make(chan error, 1)
			go func() { _, err := c.Get(ctx, "k"); first <- err }()
			<-hook.held // the GET has read "old"; its reply is held
			if err := c.Set(ctx, "k", Channel{ID: "new"}); err != nil {
				t.Fatal(err)
			}
			type got struct {
				v   Channel
				err error
			}
			second := make(chan got, 1)
			go func() { v, err := c.Get(ctx, "k"); second <- got{v, err} }()
			// The held read is released once the second Get has either
			// read on its own (and returned) or joined it (and waits for
			// it): either way its answer is then decided.
			var g got
			returned := false
			waitFor(t, 30*time.Second, "the second Get to return or join the held read", func() bool {
				select {
				case g = <-second:
					returned = true
					return true
				default:
					return c.Stats().CoalescedWaits > 0
				}
			})
			close(hook.release)
			if !returned {
				g = <-second
			}
			if err := <-first; err != nil {
				t.Errorf("the Get begun before Set: %v", err)
			}
			if g.err != nil || g.v.ID != "new" {
				t.Fatalf("Get begun after Set returned = %q, %v; want %q", g.v.ID, g.err, "new")
			}
		})
	}
}

// holdGetHook holds the reply of the first read it sees while armed (a
// GET, or the SET NX GET of a read that places a lease) until release is
// closed, telling held once the read has run in Redis: a read done in
// Redis whose caller has not yet heard, at a known point.
type holdGetHook struct {
	armed         atomic.Bool
	held, release chan struct{}
}

func (h *holdGetHook) hold(cmds ...redis.Cmder) {
	for _, cmd := range cmds {
		args := cmd.Args()
		read := cmd.Name() == "get" || cmd.Name() == "set" && fmt.Sprint(args[len(args)-1]) == "get"
		if read && h.armed.CompareAndSwap(true, false) {
			close(h.held)
			<-h.release
			return
		}
	}
}

func (h *holdGetHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdGetHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.hold(cmds...)
		return err
	}
}
func (h *holdGetHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.hold(cmd)
		return err
	}
}

// TestMemoryUsage checks what Redis itself accounts for a compressed
// value, which is what fills its memory: MEMORY USAGE, not STRLEN.
func TestMemoryUsage(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	redistest.RequireReal(t, s, "MEMORY USAGE (miniredis does not implement it)")
	ctx := ctxT(t)
	doc := makeChannel(3, 128<<10)
	plain := mustNew[Channel](t, rdb, packcache.WithCodec(codec.None))
	packed := mustNew[Channel](t, rdb)
	plain.Set(ctx, "plain", doc)
	packed.Set(ctx, "packed", doc)
	p := rdb.MemoryUsage(ctx, "plain").Val()
	z := rdb.MemoryUsage(ctx, "packed").Val()
	if p < 96<<10 || z*2 > p {
		t.Fatalf("MEMORY USAGE plain %d, zstd %d: want zstd under half", p, z)
	}
	t.Logf("128 KiB channel: MEMORY USAGE plain %d B, zstd %d B (%.2f)", p, z, float64(z)/float64(p))
}

// The default Serializer, JSON (write.go).

// corpusDir is the public JSON benchmark corpus beside the repository, as
// laid out on developers' machines and in CI, or PACKCACHE_CORPUS.
func corpusDir(t testing.TB) string {
	dir := os.Getenv("PACKCACHE_CORPUS")
	if dir == "" {
		dir = filepath.Join("..", "shared", "corpus")
	}
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("no JSON corpus at %s (set PACKCACHE_CORPUS): %v", dir, err)
	}
	return dir
}

// TestJSONMatchesStdlib is the compatibility evidence for the default
// serializer: on every corpus document, and on our own documents, it
// decodes to exactly what encoding/json decodes, and each reads the
// other's output.
func TestJSONMatchesStdlib(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob(filepath.Join(corpusDir(t), "*.json"))
	if len(files) == 0 {
		t.Skip("corpus is empty")
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var std, fast any
		if err := packcache.StdJSON.Unmarshal(data, &std); err != nil {
			t.Fatalf("%s: encoding/json: %v", f, err)
		}
		if err := packcache.JSON.Unmarshal(data, &fast); err != nil {
			t.Fatalf("%s: default JSON: %v", f, err)
		}
		if !reflect.DeepEqual(std, fast) {
			t.Fatalf("%s: the default JSON serializer decodes differently from encoding/json", f)
		}
		out, err := packcache.JSON.Marshal(nil, &fast)
		if err != nil {
			t.Fatal(err)
		}
		var back any
		if err := json.Unmarshal(out, &back); err != nil || !reflect.DeepEqual(back, std) {
			t.Fatalf("%s: encoding/json does not read the default serializer's output back: %v", f, err)
		}
	}
}

func TestJSONMatchesStdlibTyped(t *testing.T) {
	t.Parallel()
	for _, size := range []int{0, 500, 40 << 10, 128 << 10} {
		ch := makeChannel(uint64(size), size)
		a, err := packcache.JSON.Marshal(nil, &ch)
		if err != nil {
			t.Fatal(err)
		}
		b, err := packcache.StdJSON.Marshal(nil, &ch)
		if err != nil {
			t.Fatal(err)
		}
		var fromA, fromB Channel
		if err := packcache.StdJSON.Unmarshal(a, &fromA); err != nil {
			t.Fatal(err)
		}
		if err := packcache.JSON.Unmarshal(b, &fromB); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(fromA, ch) || !reflect.DeepEqual(fromB, ch) {
			t.Fatalf("size %d: serializers disagree", size)
		}
	}
	// Both reject what is not JSON, or not the right type.
	for _, bad := range []string{`{"id":`, `[1,2]`, `{"id": 5}`, "\xff", `{"messages":[{"id":"x"}]}`, `{} trailing`} {
		var a, b Channel
		errA := packcache.JSON.Unmarshal([]byte(bad), &a)
		errB := packcache.StdJSON.Unmarshal([]byte(bad), &b)
		if (errA == nil) != (errB == nil) {
			t.Errorf("%q: default JSON error %v, encoding/json error %v", bad, errA, errB)
		}
	}
}
