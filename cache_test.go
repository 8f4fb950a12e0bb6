package packcache_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gojson "github.com/goccy/go-json"
	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

var allCodecs = []codec.Codec{codec.None, codec.LZ4, codec.LZ4HC, codec.Snappy, codec.Zstd, codec.ZstdDefault, codec.ZstdBetter, codec.ZstdBest}

func TestRoundTripCodecsSizesSerializers(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		ctx := ctxT(t)
		sizes := []int{0, 1, 100, 1023, 1024, 1025, 40 << 10, 128 << 10, 1 << 20}
		if !testing.Short() {
			sizes = append(sizes, 8<<20)
		}
		for _, cd := range allCodecs {
			for _, ser := range []packcache.Serializer{packcache.JSON, packcache.Gob} {
				c := mustNew[Channel](t, tg.Client, packcache.WithCodec(cd), packcache.WithSerializer(ser))
				raw := mustNew[[]byte](t, tg.Client, packcache.WithCodec(cd))
				for _, size := range sizes {
					if size == 8<<20 && (cd == codec.ZstdBest || cd == codec.LZ4HC || cd == codec.ZstdBetter) {
						continue // the slow levels at 8 MiB add time, not coverage
					}
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

func TestCompressAboveZeroCompressesEverything(t *testing.T) {
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[[]byte](t, rdb, packcache.WithCompressAbove(packcache.CompressAll), packcache.WithCodec(codec.Zstd))
	v := jsonText(300)
	c.Set(ctx, "k", v)
	if b := rawGet(t, rdb, "k"); b[0] != codec.HeaderZstd {
		t.Fatalf("stored %#x..., want zstd", b[0])
	}
}

func TestIncompressibleStoredPlain(t *testing.T) {
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

func TestPrefixPolicy(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		ctx := ctxT(t)
		rdb := tg.Client
		c := mustNew[[]byte](t, rdb,
			packcache.WithCodec(codec.Zstd),
			packcache.WithPrefix("chan:", packcache.Policy{Codec: codec.LZ4, TTL: time.Minute}),
			packcache.WithPrefix("chan:big:", packcache.Policy{Codec: codec.Snappy, CompressAbove: 10_000}),
			packcache.WithPrefix("{user}:", packcache.Policy{Codec: codec.None}),
		)
		v := jsonText(5000)
		for key, want := range map[string]byte{
			"other":        codec.HeaderZstd,
			"chan:1":       codec.HeaderLZ4,
			"chan:big:1":   '"', // 5000 <= 10000: plain
			"{user}:42":    '"',
			"chan:bigger":  codec.HeaderLZ4, // under "chan:", not "chan:big:"
			"chan:big:2:x": '"',
		} {
			if err := c.Set(ctx, key, v); err != nil {
				t.Fatal(err)
			}
			if b := rawGet(t, rdb, key); b[0] != want {
				t.Errorf("%s stored with first byte %#x, want %#x", key, b[0], want)
			}
			got, err := c.Get(ctx, key)
			if err != nil || !bytes.Equal(got, v) {
				t.Errorf("%s: Get = %v", key, err)
			}
		}
		// TTLs: "chan:" has a minute; "chan:big:" sets none, so inherits the
		// cache's default hour, not its parent prefix's minute.
		for key, want := range map[string]time.Duration{"chan:1": time.Minute, "chan:big:1": time.Hour, "other": time.Hour} {
			d := rdb.PTTL(ctx, key).Val()
			if d <= want-5*time.Second || d > want {
				t.Errorf("%s: PTTL %v, want about %v", key, d, want)
			}
		}
		st := c.Stats()
		if got := st.Codecs["zstd"].Values; got != 1 {
			t.Errorf("stats: total zstd values = %d, want 1", got)
		}
		if st.Sets != 6 || st.Hits != 6 {
			t.Errorf("stats: sets %d hits %d, want 6 and 6", st.Sets, st.Hits)
		}
		if got := st.Prefixes["chan:"].Codecs["lz4"].Values; got != 2 {
			t.Errorf("stats: chan: lz4 values = %d, want 2", got)
		}
		if cs := st.Codecs["zstd"]; cs.BytesOut >= cs.BytesIn || cs.BytesIn != 5000 {
			t.Errorf("stats: zstd bytes in %d out %d", cs.BytesIn, cs.BytesOut)
		}
	})
}

func TestPlainJSONWrittenByOthers(t *testing.T) {
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[Channel](t, rdb)
	want := makeChannel(7, 3000)
	b, _ := json.Marshal(want)
	for _, prefix := range []string{"", " \n\t", "\xef\xbb\xbf"} {
		rdb.Set(ctx, "legacy", prefix+string(b), 0)
		got, err := c.Get(ctx, "legacy")
		if err != nil {
			t.Fatalf("prefix %q: %v", prefix, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("prefix %q: value differs", prefix)
		}
	}
	// Small values packcache writes stay readable in redis-cli.
	c.Set(ctx, "small", Channel{ID: "x"})
	if s := rdb.Get(ctx, "small").Val(); !strings.HasPrefix(s, `{"id":"x"`) {
		t.Fatalf("small value stored as %q", s)
	}
}

func TestGzipWrittenByOthers(t *testing.T) {
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[Channel](t, rdb)
	want := makeChannel(8, 20000)
	b, _ := json.Marshal(want)
	rdb.Set(ctx, "gz", gzipBytes(t, b), 0)
	got, err := c.Get(ctx, "gz")
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("gzip value: %v", err)
	}
}

func TestReaderWithOtherOptionsReadsEveryFormat(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		ctx := ctxT(t)
		want := makeChannel(9, 50_000)
		for _, cd := range allCodecs {
			w := mustNew[Channel](t, tg.Client, packcache.WithCodec(cd), packcache.WithCompressAbove(10))
			if err := w.Set(ctx, "fmt:"+cd.Name(), want); err != nil {
				t.Fatal(err)
			}
		}
		for _, rc := range allCodecs {
			r := mustNew[Channel](t, tg.Client, packcache.WithCodec(rc), packcache.WithCompressAbove(1<<30))
			for _, cd := range allCodecs {
				got, err := r.Get(ctx, "fmt:"+cd.Name())
				if err != nil || !reflect.DeepEqual(got, want) {
					t.Fatalf("reader %s reading %s: %v", rc.Name(), cd.Name(), err)
				}
			}
		}
	})
}

func TestMissDeleteTTL(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		ctx := ctxT(t)
		c := mustNew[Channel](t, tg.Client, packcache.WithTTL(2*time.Second))
		if _, err := c.Get(ctx, "absent"); !errors.Is(err, packcache.ErrMiss) {
			t.Fatalf("Get of absent key: %v, want ErrMiss", err)
		}
		c.Set(ctx, "a", Channel{ID: "a"})
		c.Set(ctx, "b", Channel{ID: "b"}, packcache.SetTTL(1500*time.Millisecond))
		c.Set(ctx, "forever", Channel{ID: "f"}, packcache.SetTTL(packcache.Off))
		if d := tg.Client.PTTL(ctx, "a").Val(); d <= time.Second || d > 2*time.Second {
			t.Errorf("PTTL a = %v, want about 2s", d)
		}
		if d := tg.Client.PTTL(ctx, "b").Val(); d <= time.Second || d > 1500*time.Millisecond {
			t.Errorf("PTTL b = %v, want about 1.5s (sub-second precision kept)", d)
		}
		if d := tg.Client.PTTL(ctx, "forever").Val(); d != -1 {
			t.Errorf("PTTL forever = %v, want no expiry", d)
		}
		if err := c.Set(ctx, "bad", Channel{}, packcache.SetTTL(-5)); err == nil {
			t.Error("Set with a negative TTL succeeded")
		}
		// Zero is the policy's TTL, as everywhere.
		if err := c.Set(ctx, "policy", Channel{}, packcache.SetTTL(0)); err != nil {
			t.Fatal(err)
		}
		if d := tg.Client.PTTL(ctx, "policy").Val(); d <= 2*time.Second-100*time.Millisecond || d > 2*time.Second {
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
		tg.Client.Set(ctx, "many:7", []byte{0x05, 1, 2, 3}, 0)
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

func TestRawPassThrough(t *testing.T) {
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[json.RawMessage](t, rdb, packcache.WithDecodePerCaller())
	small := json.RawMessage(`{"hello":"world"}`)
	c.Set(ctx, "s", small)
	if s := rdb.Get(ctx, "s").Val(); s != string(small) {
		t.Fatalf("stored %q, want the bytes as given", s)
	}
	got, _ := c.Get(ctx, "s")
	got[2] = 'X' // the caller owns what it gets
	again, _ := c.Get(ctx, "s")
	if string(again) != string(small) {
		t.Fatal("modifying a returned value changed the cache")
	}
	// Binary bytes that begin with a header byte are framed, not misread.
	b := mustNew[[]byte](t, rdb)
	for _, v := range [][]byte{{codec.HeaderLZ4, 1, 2}, {}, {0}, {0x1f, 0x8b, 0}} {
		if err := b.Set(ctx, "bin", v); err != nil {
			t.Fatal(err)
		}
		got, err := b.Get(ctx, "bin")
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("binary %x: got %x, %v", v, got, err)
		}
	}
}

func TestBadValues(t *testing.T) {
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[Channel](t, rdb, packcache.WithMaxValueSize(1<<20))
	big := makeChannel(1, 300_000)
	w := mustNew[Channel](t, rdb, packcache.WithCodec(codec.LZ4))
	w.Set(ctx, "lz4", big)
	lz := rawGet(t, rdb, "lz4")
	wz := mustNew[Channel](t, rdb, packcache.WithCodec(codec.Zstd))
	wz.Set(ctx, "zstd", big)
	zs := rawGet(t, rdb, "zstd")
	huge := makeChannel(2, 2<<20)
	wz.Set(ctx, "huge", huge)

	cases := []struct {
		name  string
		value []byte // nil: already stored under name
		want  error
	}{
		{"unknown-header", []byte{0x06, 'x', 'y'}, packcache.ErrUnknownHeader},
		{"reserved-zero", []byte{0x00}, packcache.ErrUnknownHeader},
		{"corrupt-lz4", append(append([]byte{}, lz[:20]...), bytes.Repeat([]byte{0xff}, 50)...), packcache.ErrCorrupt},
		{"truncated-zstd", zs[:len(zs)/2], packcache.ErrCorrupt},
		{"lz4-claims-4GiB", []byte{codec.HeaderLZ4, 0xff, 0xff, 0xff, 0xff, 0x10, 'a'}, packcache.ErrTooLarge},
		{"huge", nil, packcache.ErrTooLarge},
		{"wrong-type", []byte(`[1,2,3]`), packcache.ErrSerialization},
		{"not-utf8", []byte("\xff\xfe\xfd"), packcache.ErrSerialization},
		{"not-json", []byte(`{"id": `), packcache.ErrSerialization},
	}
	for _, tc := range cases {
		if tc.value != nil {
			rdb.Set(ctx, tc.name, tc.value, 0)
		}
		before := rawGet(t, rdb, tc.name)
		_, err := c.Get(ctx, tc.name)
		var e *packcache.Error
		if !errors.Is(err, tc.want) || !errors.As(err, &e) || e.Key != tc.name || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%s: err = %v, want %v naming the key", tc.name, err, tc.want)
		}
		if after := rawGet(t, rdb, tc.name); !bytes.Equal(before, after) {
			t.Errorf("%s: Get changed the stored value", tc.name)
		}
	}
	var he *codec.HeaderError
	_, err := c.Get(ctx, "unknown-header")
	if !errors.As(err, &he) || he.Byte != 0x06 || !strings.Contains(err.Error(), "0x06") {
		t.Errorf("unknown header error %v does not say which byte", err)
	}
	var te *gojson.UnmarshalTypeError // the default serializer's own error
	if _, err := c.Get(ctx, "wrong-type"); !errors.As(err, &te) {
		t.Errorf("wrong type: %v does not keep the serializer's error", err)
	}
	if got := c.Stats().DecodeErrors; got < uint64(len(cases)) {
		t.Errorf("DecodeErrors = %d, want at least %d", got, len(cases))
	}
	// A Set over the limit fails before anything is written.
	if err := c.Set(ctx, "toolarge", huge); !errors.Is(err, packcache.ErrTooLarge) || !strings.Contains(err.Error(), "toolarge") {
		t.Errorf("Set over the limit: %v", err)
	}
	if rdb.Exists(ctx, "toolarge").Val() != 0 {
		t.Error("value over the limit was written")
	}
	// A serializer failure on Set.
	cf := mustNew[func()](t, rdb)
	if err := cf.Set(ctx, "fn", func() {}); !errors.Is(err, packcache.ErrSerialization) {
		t.Errorf("Set of a func: %v", err)
	}
	// A key of the wrong Redis type.
	rdb.LPush(ctx, "list", "x")
	if _, err := c.Get(ctx, "list"); !errors.Is(err, packcache.ErrRedis) || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("Get of a list: %v", err)
	}
}

func TestRedisFailureIsTyped(t *testing.T) {
	s, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[Channel](t, rdb, packcache.WithCircuitBreaker(packcache.Off, 0))
	s.Stop(t)
	_, err := c.Get(ctx, "k")
	var e *packcache.Error
	if !errors.Is(err, packcache.ErrRedis) || !errors.As(err, &e) || e.Key != "k" {
		t.Fatalf("Get with Redis down: %v", err)
	}
	if err := c.Set(ctx, "k", Channel{}); !errors.Is(err, packcache.ErrRedis) {
		t.Fatalf("Set with Redis down: %v", err)
	}
	if c.Stats().RedisErrors < 2 {
		t.Fatalf("RedisErrors = %d", c.Stats().RedisErrors)
	}
}

func TestNewRejectsInvalidOptions(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer rdb.Close()
	if c, err := packcache.New[Channel](rdb); err != nil {
		t.Fatalf("New with no options: %v", err)
	} else {
		c.Close()
	}
	bad := map[string]packcache.Option{
		"nil codec":      packcache.WithCodec(nil),
		"negative above": packcache.WithCompressAbove(-5),
		"prefix above":   packcache.WithPrefix("a:", packcache.Policy{CompressAbove: -7}),
		"prefix neg ttl": packcache.WithPrefix("a:", packcache.Policy{NegativeTTL: -2}),
		"prefix stale":   packcache.WithPrefix("a:", packcache.Policy{StaleFor: -time.Second}),
		"prefix jitter":  packcache.WithPrefix("a:", packcache.Policy{TTLJitter: 1.5}),
		"redis timeout":  packcache.WithRedisTimeout(-time.Second),
		"load timeout":   packcache.WithLoadTimeout(-time.Second),
		"negative ttl":   packcache.WithTTL(-5),
		"sub-ms ttl":     packcache.WithTTL(time.Microsecond),
		"max size":       packcache.WithMaxValueSize(-1),
		"jitter":         packcache.WithPrefix("", packcache.Policy{TTLJitter: 1}),
		"window":         packcache.WithShareWindow(-5),
		"breaker":        packcache.WithCircuitBreaker(-5, 0),
		"near bytes":     packcache.WithLocalCache(packcache.LocalCache{MaxBytes: -5}),
		"prefix ttl":     packcache.WithPrefix("a:", packcache.Policy{TTL: -5}),
		"loader type":    packcache.WithPrefix("a:", packcache.Policy{Loader: packcache.LoaderFunc[int](nil)}),
		"refresh>ttl":    packcache.WithPrefix("a:", packcache.Policy{TTL: time.Second, RefreshAfter: time.Minute, Loader: packcache.LoaderFunc[Channel](nil)}),
		"lock lease":     packcache.WithLock(time.Microsecond),
		"min saving":     packcache.WithPrefix("", packcache.Policy{MinSaving: -5}),
	}
	for name, o := range bad {
		if _, err := packcache.New[Channel](rdb, o); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
	// Zero is the default, for every option and field: never an error.
	zero := []packcache.Option{packcache.WithTTL(0), packcache.WithRedisTimeout(0), packcache.WithLoadTimeout(0),
		packcache.WithMaxValueSize(0), packcache.WithCompressAbove(0), packcache.WithShareWindow(0),
		packcache.WithCircuitBreaker(0, 0), packcache.WithLock(0), packcache.WithPrefix("", packcache.Policy{}),
		packcache.WithPrefix("z:", packcache.Policy{})}
	if c, err := packcache.New[Channel](rdb, zero...); err != nil {
		t.Errorf("New with zero options: %v", err)
	} else {
		c.Close()
	}
	if _, err := packcache.New[Channel](rdb, packcache.WithPrefix("a:", packcache.Policy{}), packcache.WithPrefix("a:", packcache.Policy{})); err == nil {
		t.Error("duplicate prefix accepted")
	}
	if _, err := packcache.New[Channel](nil); err == nil {
		t.Error("nil client accepted")
	}
}

func TestSetDuringGetIsSeen(t *testing.T) {
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[Channel](t, rdb)
	for i := range 50 {
		want := Channel{ID: fmt.Sprint(i)}
		if err := c.Set(ctx, "k", want); err != nil {
			t.Fatal(err)
		}
		got, err := c.Get(ctx, "k")
		if err != nil || got.ID != want.ID {
			t.Fatalf("after Set %d, Get = %v, %v", i, got.ID, err)
		}
	}
}

// TestMemoryUsage checks what Redis itself accounts for a compressed
// value, which is what fills its memory: MEMORY USAGE, not STRLEN.
func TestMemoryUsage(t *testing.T) {
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

// TestPolicyInheritOffAll: every Policy field follows one rule: zero
// inherits the cache's setting, Off turns it off for the prefix, and
// CompressAbove's CompressAll compresses every value.
func TestPolicyInheritOffAll(t *testing.T) {
	s, rdb := single(t)
	redistest.RequireReal(t, s, "reads TTLs in real time")
	ctx := ctxT(t)
	var loads atomic.Int64
	c := mustNew[Channel](t, rdb,
		packcache.WithTTL(time.Hour),
		packcache.WithPrefix("", packcache.Policy{TTLJitter: 0.5}),
		packcache.WithPrefix("", packcache.Policy{NegativeTTL: time.Minute}),
		packcache.WithPrefix("", packcache.Policy{StaleFor: time.Hour}),
		packcache.WithCompressAbove(4096),
		packcache.WithLoader(packcache.LoaderFunc[Channel](func(ctx context.Context, key string) (Channel, error) {
			loads.Add(1)
			if strings.HasSuffix(key, ":absent") {
				return Channel{}, packcache.ErrNotFound
			}
			return Channel{ID: key, Title: string(jsonText(200))}, nil
		})),
		packcache.WithPrefix("inherit:", packcache.Policy{}),
		packcache.WithPrefix("off:", packcache.Policy{
			TTLJitter: packcache.Off, NegativeTTL: packcache.Off, StaleFor: packcache.Off,
			Loader: packcache.Off, CompressAbove: packcache.Off,
		}),
		packcache.WithPrefix("all:", packcache.Policy{CompressAbove: packcache.CompressAll, TTL: packcache.Off}),
	)
	// inherit: jitter and the stale window apply, a miss loads, not-found
	// is remembered, a 300-byte value is below the threshold.
	if _, err := c.Get(ctx, "inherit:absent"); !errors.Is(err, packcache.ErrNotFound) {
		t.Fatal(err)
	}
	if raw := rawGet(t, rdb, "inherit:absent"); string(raw) != "\x0e" {
		t.Fatalf("inherit: not-found not remembered: %q", raw)
	}
	if _, err := c.Get(ctx, "inherit:k"); err != nil {
		t.Fatal(err)
	}
	if raw := rawGet(t, rdb, "inherit:k"); raw[0] != '{' {
		t.Fatalf("inherit: a small value was not stored plain: %q", raw[:8])
	}
	// Jitter is random: one key may draw almost none (1 time in 30 it
	// takes less than a minute off), so look at 20 keys. Each must lie
	// within the bounds, and not all of them can be unjittered.
	least := 2 * time.Hour
	for i := range 20 {
		key := fmt.Sprintf("inherit:j%d", i)
		if _, err := c.Get(ctx, key); err != nil {
			t.Fatal(err)
		}
		pttl := rdb.PTTL(ctx, key).Val()
		if pttl > 2*time.Hour || pttl < time.Hour+30*time.Minute-time.Minute {
			t.Fatalf("inherit: PTTL %v, want the TTL less up to half (jitter), plus the stale hour", pttl)
		}
		least = min(least, pttl)
	}
	if least > 2*time.Hour-time.Minute {
		t.Fatalf("inherit: the least PTTL of 20 keys is %v: no jitter applied", least)
	}
	// off: no loader (a miss is a miss), no stale window, no jitter, and
	// a large value stays plain.
	if _, err := c.Get(ctx, "off:k"); !errors.Is(err, packcache.ErrMiss) {
		t.Fatalf("off: Get with NoLoader: %v, want ErrMiss", err)
	}
	big := Channel{ID: "off:big", Title: string(jsonText(10_000))}
	if err := c.Set(ctx, "off:big", big); err != nil {
		t.Fatal(err)
	}
	if raw := rawGet(t, rdb, "off:big"); raw[0] != '{' {
		t.Fatalf("off: a 10 KB value was compressed with CompressAbove Off: header %02x", raw[0])
	}
	if pttl := rdb.PTTL(ctx, "off:big").Val(); pttl < time.Hour-time.Minute || pttl > time.Hour {
		t.Fatalf("off: PTTL %v, want the TTL exactly (no jitter, no stale window)", pttl)
	}
	// all: every value compressed, and TTL Off is no expiry.
	if err := c.Set(ctx, "all:k", Channel{ID: "all:k", Title: string(jsonText(200))}); err != nil {
		t.Fatal(err)
	}
	if raw := rawGet(t, rdb, "all:k"); raw[0] != codec.HeaderZstd {
		t.Fatalf("all: a 250-byte value was not compressed with CompressAll: %q", raw[:4])
	}
	if pttl := rdb.PTTL(ctx, "all:k").Val(); pttl != -1 {
		t.Fatalf("all: PTTL %v, want no expiry", pttl)
	}
}

// TestZeroMeansDefault: every option and Policy field follows one rule:
// zero is the default (in a Policy, the cache's setting), Off turns it
// off. Here: a zero TTL is an hour, a zero threshold is 1024 bytes, in
// WithTTL, WithCompressAbove and a prefix's Policy alike; Off is no expiry
// and no compression.
func TestZeroMeansDefault(t *testing.T) {
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[json.RawMessage](t, rdb, packcache.WithTTL(0), packcache.WithCompressAbove(0),
		packcache.WithPrefix("p:", packcache.Policy{TTL: 0, CompressAbove: 0}),
		packcache.WithPrefix("off:", packcache.Policy{TTL: packcache.Off, CompressAbove: packcache.Off}))
	small, large := json.RawMessage(jsonText(1000)), json.RawMessage(jsonText(2000))
	for _, prefix := range []string{"", "p:", "off:"} {
		for _, v := range []json.RawMessage{small, large} {
			key := fmt.Sprintf("%szero:%d", prefix, len(v))
			if err := c.Set(ctx, key, v); err != nil {
				t.Fatal(err)
			}
			stored := rawGet(t, rdb, key)
			compressed := stored[0] == codec.HeaderZstd
			if want := len(v) > 1024 && prefix != "off:"; compressed != want {
				t.Errorf("%s: compressed %v, want %v", key, compressed, want)
			}
			d := rdb.PTTL(ctx, key).Val()
			if prefix == "off:" {
				if d != -1 {
					t.Errorf("%s: PTTL %v, want no expiry", key, d)
				}
			} else if d < time.Hour-time.Minute || d > time.Hour {
				t.Errorf("%s: PTTL %v, want the default hour", key, d)
			}
		}
	}
}
