package packcache_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"

	gojson "github.com/goccy/go-json"
	"github.com/golang/snappy"
	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

func TestPlainJSONWrittenByOthers(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

func TestRawPassThrough(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	cf := mustNew[string](t, rdb, packcache.WithSerializer(brokenSerializer{err: errors.New("json: unsupported type: func()")}))
	if err := cf.Set(ctx, "fn", "v"); !errors.Is(err, packcache.ErrSerialization) {
		t.Errorf("Set of a value the serializer refuses: %v", err)
	}
	// A key of the wrong Redis type.
	rdb.LPush(ctx, "list", "x")
	if _, err := c.Get(ctx, "list"); !errors.Is(err, packcache.ErrRedis) || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("Get of a list: %v", err)
	}
}

func TestRedisFailureIsTyped(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	// One dial, no retries: go-redis's own retries of a refused dial are
	// not the subject.
	rdb := s.Universal(t, func(o *redis.UniversalOptions) { o.MaxRetries, o.DialerRetries = -1, 1 })
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

// Raw values that look like a lease, a tombstone or a header round-trip.
func TestRawLookalikes(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[[]byte](t, rdb, packcache.WithMaxValueSize(1000))
	for _, v := range [][]byte{{}, {0x0c}, {0x0c, 'a'}, {0x0e}, {0x0e, 0}, {0x1f}, {0x1f, 0x8b}, {0x7f}, []byte(strings.Repeat("a", 1000))} {
		if err := c.Set(ctx, "raw", v); err != nil {
			t.Fatalf("Set %q: %v", v, err)
		}
		got, err := c.Get(ctx, "raw")
		if err != nil || string(got) != string(v) {
			t.Errorf("Set %q, Get = %q, %v (stored %q)", v, got, err, rawGet(t, rdb, "raw"))
		}
		m, err := c.GetMany(ctx, []string{"raw"})
		if err != nil || string(m["raw"]) != string(v) {
			t.Errorf("Set %q, GetMany = %q, %v", v, m["raw"], err)
		}
	}
	if err := c.Set(ctx, "raw", []byte(strings.Repeat("a", 1001))); !errors.Is(err, packcache.ErrTooLarge) {
		t.Errorf("Set of 1001 bytes = %v", err)
	}
}

// snappyTest is a user codec: Snappy blocks under a user header byte.
type snappyTest struct{}

func (snappyTest) ID() byte { return 0x1d }

func (snappyTest) Name() string { return "snappy-test" }

func (snappyTest) Encode(dst, src []byte) ([]byte, error) {
	return append(dst, snappy.Encode(nil, src)...), nil
}

func (snappyTest) Decode(dst, src []byte, limit int) ([]byte, error) {
	n, err := snappy.DecodedLen(src)
	if err != nil {
		return dst, codec.ErrCorrupt
	}
	if n > limit {
		return dst, codec.ErrTooLarge
	}
	out, err := snappy.Decode(nil, src)
	if err != nil {
		return dst, codec.ErrCorrupt
	}
	return append(dst, out...), nil
}

var registerOnce sync.Once

// TestUserCodec: a registered codec is written under its own header byte,
// read back by any cache in the process, and counted under its name.
func TestUserCodec(t *testing.T) {
	registerOnce.Do(func() {
		if err := codec.Register(snappyTest{}); err != nil {
			t.Fatal(err)
		}
	})
	_, rdb := single(t)
	ctx := ctxT(t)
	w := mustNew[Channel](t, rdb, packcache.WithCodec(snappyTest{}))
	want := makeChannel(4, 20_000)
	if err := w.Set(ctx, "custom", want); err != nil {
		t.Fatal(err)
	}
	if b := rawGet(t, rdb, "custom"); b[0] != 0x1d {
		t.Fatalf("stored with header %#x, want the user codec's 0x1d", b[0])
	}
	r := mustNew[Channel](t, rdb) // a reader configured for zstd
	if got, err := r.Get(ctx, "custom"); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("reader with other options: %v", err)
	}
	if n := w.Stats().Codecs["snappy-test"].Values; n != 1 {
		t.Fatalf("stats count %d values under snappy-test", n)
	}
}
