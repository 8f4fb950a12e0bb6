package msgpack_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
	"github.com/packcache/packcache/msgpack"
)

func newCache[T any](t *testing.T, rdb redis.UniversalClient, opts ...packcache.Option) *packcache.Cache[T] {
	t.Helper()
	c, err := packcache.New[T](rdb, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func rawGet(t *testing.T, rdb redis.UniversalClient, key string) []byte {
	t.Helper()
	b, err := rdb.Get(context.Background(), key).Bytes()
	if err != nil {
		t.Fatalf("raw GET %q: %v", key, err)
	}
	return b
}

// docs are a Doc under the default compression threshold (1024 bytes
// serialized), stored uncompressed behind header 0x01, and one above it,
// stored with Zstandard.
func docs(t *testing.T) map[string]Doc {
	small, large := makeDoc(1, 2), makeDoc(2, 2000)
	if n := len(mustMarshal(t, &small)); n > (1024) {
		t.Fatalf("small doc is %d bytes", n)
	}
	if n := len(mustMarshal(t, &large)); n < 64<<10 {
		t.Fatalf("large doc is %d bytes", n)
	}
	return map[string]Doc{"small": small, "large": large}
}

// TestCacheRoundTrip stores Docs through a cache with the msgpack
// serializer in a real redis-server and reads them back, below and above
// the compression threshold.
func TestCacheRoundTrip(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Universal(t)
	ctx := ctxT(t)
	c := newCache[Doc](t, rdb, packcache.WithSerializer(msgpack.Serializer))
	wantHeader := map[string]byte{"small": codec.HeaderNone, "large": codec.HeaderZstd}
	for key, want := range docs(t) {
		if err := c.Set(ctx, key, want); err != nil {
			t.Fatalf("Set(%s): %v", key, err)
		}
		got, err := c.Get(ctx, key)
		if err != nil {
			t.Fatalf("Get(%s): %v", key, err)
		}
		equalDoc(t, got, want)

		raw := rawGet(t, rdb, key)
		if raw[0] != wantHeader[key] {
			t.Errorf("%s: stored value begins 0x%02x, want 0x%02x", key, raw[0], wantHeader[key])
		}
		payload, err := codec.DecodeValue(nil, raw, (64 << 20))
		if err != nil {
			t.Fatal(err)
		}
		if payload[0] != msgpack.Marker {
			t.Errorf("%s: payload begins 0x%02x, want the marker", key, payload[0])
		}
		t.Logf("%s: %d bytes of msgpack stored as %d (header 0x%02x)", key, len(payload), len(raw), raw[0])
	}
	// A pointer type, and a value loaded through GetOrLoad.
	pc := newCache[*Doc](t, rdb, packcache.WithSerializer(msgpack.Serializer))
	want := makeDoc(7, 5)
	if _, err := pc.GetOrLoad(ctx, "loaded", func(context.Context) (*Doc, error) { return &want, nil }); err != nil {
		t.Fatal(err)
	}
	got, err := pc.Get(ctx, "loaded") // what the load stored
	if err != nil {
		t.Fatal(err)
	}
	equalDoc(t, *got, want)
}

// TestJSONReaderMeetsMsgpack reads keys a msgpack cache wrote with caches
// configured for JSON: each gets an error matching ErrSerialization, never
// a value, and the value stays in Redis.
func TestJSONReaderMeetsMsgpack(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Universal(t)
	ctx := ctxT(t)
	w := newCache[Doc](t, rdb, packcache.WithSerializer(msgpack.Serializer))
	readers := map[string]*packcache.Cache[Doc]{
		"JSON":    newCache[Doc](t, rdb),
		"StdJSON": newCache[Doc](t, rdb, packcache.WithSerializer(stdJSON{})),
	}
	anyReader := newCache[any](t, rdb)
	for key, d := range docs(t) {
		if err := w.Set(ctx, key, d); err != nil {
			t.Fatal(err)
		}
		before := rawGet(t, rdb, key)
		for name, r := range readers {
			got, err := r.Get(ctx, key)
			if !errors.Is(err, packcache.ErrSerialization) {
				t.Errorf("%s reader, %s value: %v, want ErrSerialization", name, key, err)
			}
			if !reflect0(got) {
				t.Errorf("%s reader, %s value: got a value with the error", name, key)
			}
		}
		if v, err := anyReader.Get(ctx, key); !errors.Is(err, packcache.ErrSerialization) {
			t.Errorf("JSON reader into any, %s value: %v, %v, want ErrSerialization", key, v, err)
		}
		if after := rawGet(t, rdb, key); !bytes.Equal(after, before) {
			t.Errorf("%s: the value changed after reads that could not decode it", key)
		}
		if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 0 {
			t.Errorf("%s: TTL %v after the reads", key, ttl)
		}
	}
}

// TestMsgpackReaderMeetsJSON is the reverse: keys a JSON cache wrote (plain
// and compressed) read by a msgpack cache fail with ErrSerialization and
// ErrNotMsgpack, and stay in Redis.
func TestMsgpackReaderMeetsJSON(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Universal(t)
	ctx := ctxT(t)
	w := newCache[Doc](t, rdb)
	r := newCache[Doc](t, rdb, packcache.WithSerializer(msgpack.Serializer))
	for key, d := range docs(t) {
		if err := w.Set(ctx, key, d); err != nil {
			t.Fatal(err)
		}
		before := rawGet(t, rdb, key)
		_, err := r.Get(ctx, key)
		if !errors.Is(err, packcache.ErrSerialization) || !errors.Is(err, msgpack.ErrNotMsgpack) {
			t.Errorf("%s JSON value (begins 0x%02x): %v, want ErrSerialization and ErrNotMsgpack", key, before[0], err)
		}
		if after := rawGet(t, rdb, key); !bytes.Equal(after, before) {
			t.Errorf("%s: the value changed after a read that could not decode it", key)
		}
	}
	// A value some other program stored as the JSON text 1.
	if err := rdb.Set(ctx, "one", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	rn := newCache[int](t, rdb, packcache.WithSerializer(msgpack.Serializer))
	if n, err := rn.Get(ctx, "one"); !errors.Is(err, msgpack.ErrNotMsgpack) {
		t.Errorf("JSON 1 read by a msgpack cache: %d, %v, want ErrNotMsgpack", n, err)
	}
}

// TestMarkerPreventsMisreading stores what a MessagePack serializer without
// the marker would store for the number 49 (header 0x01, then the fixint
// 0x31) and what this one stores: a JSON reader misreads the first as the
// JSON text 1, and refuses the second.
func TestMarkerPreventsMisreading(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Universal(t)
	ctx := ctxT(t)
	marked := append([]byte{codec.HeaderNone}, mustMarshal(t, 49)...)
	if err := rdb.Set(ctx, "unmarked", []byte{codec.HeaderNone, 0x31}, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, "marked", marked, 0).Err(); err != nil {
		t.Fatal(err)
	}
	jr := newCache[int](t, rdb)
	if n, err := jr.Get(ctx, "unmarked"); err != nil || n != 1 {
		t.Fatalf("unmarked: %d, %v; expected the wrong value 1 this marker exists to prevent", n, err)
	}
	if n, err := jr.Get(ctx, "marked"); !errors.Is(err, packcache.ErrSerialization) {
		t.Errorf("marked: %d, %v, want ErrSerialization", n, err)
	}
	mr := newCache[int](t, rdb, packcache.WithSerializer(msgpack.Serializer))
	if n, err := mr.Get(ctx, "marked"); err != nil || n != 49 {
		t.Errorf("marked, read by msgpack: %d, %v, want 49", n, err)
	}
}

func reflect0(d Doc) bool {
	return d.ID == 0 && d.Name == "" && d.Items == nil && d.Attrs == nil
}
