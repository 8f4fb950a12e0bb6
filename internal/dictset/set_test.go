package dictset

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// client is the Redis of the tests: a go-redis client to a redis-server
// of the test's own, counting the calls the Set makes.
type client struct {
	rdb       redis.UniversalClient
	getRanges atomic.Int64
	scripts   atomic.Int64
}

func newClient(t *testing.T) (*redistest.Server, *client) {
	t.Helper()
	s := redistest.Start(t)
	return s, &client{rdb: s.Universal(t)}
}

func (c *client) GetRange(key string, start, end int64) ([]byte, error) {
	c.getRanges.Add(1)
	return c.rdb.GetRange(context.Background(), key, start, end).Bytes()
}

func (c *client) RunScript(ctx context.Context, script *redis.Script, key string, args ...any) error {
	c.scripts.Add(1)
	return script.Run(ctx, c.rdb, []string{key}, args...).Err()
}

func (c *client) Failed(err error) bool {
	return err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// stub is a Redis without a server: GetRange answers what held has for
// the key, or err; a RunScript fails with err.
type stub struct {
	mu        sync.Mutex
	held      map[string][]byte
	err       error
	getRanges int
	ranges    [][2]int64
}

func (s *stub) GetRange(key string, start, end int64) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.getRanges++
	s.ranges = append(s.ranges, [2]int64{start, end})
	if s.err != nil {
		return nil, s.err
	}
	b := s.held[key]
	return b[min(int(start), len(b)):min(int(end)+1, len(b))], nil
}

func (s *stub) RunScript(context.Context, *redis.Script, string, ...any) error { return s.err }

func (s *stub) Failed(err error) bool { return err != nil }

func (s *stub) fetches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.getRanges
}

// samples returns n JSON records of 150 to 300 bytes, the same for a seed,
// of the kind a dictionary is trained on.
func samples(n int, seed uint64) [][]byte {
	r := rand.New(rand.NewPCG(seed, 7))
	words := strings.Fields("alice bob carol dave erin frank grace heidi ivan judy Berlin Lisbon Austin Osaka Lagos free pro team enterprise dark light system")
	out := make([][]byte, n)
	for i := range out {
		out[i] = fmt.Appendf(nil, `{"id":%d,"username":"%s.%s%d","email":"%s@example.com","plan":"%s","city":"%s","lang":"en-US","verified":%t,"followers":%d,"settings":{"theme":"%s","notifications":%t,"tz":"UTC%+d"}}`,
			100000+i, words[r.IntN(10)], words[r.IntN(10)], r.IntN(100), words[r.IntN(10)], words[15+r.IntN(4)], words[10+r.IntN(5)],
			r.IntN(2) == 0, r.IntN(5000), words[19+r.IntN(3)], r.IntN(2) == 0, r.IntN(24)-11)
	}
	return out
}

// trained returns a 4 KiB dictionary trained on 500 records of seed.
func trained(t testing.TB, seed uint64) *codec.Dictionary {
	t.Helper()
	b, err := codec.TrainDictionary(samples(500, seed), 4<<10)
	if err != nil {
		t.Fatal(err)
	}
	d, err := codec.ParseDictionary(b)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// withID returns d's bytes claiming id instead of d's own.
func withID(d *codec.Dictionary, id uint32) []byte {
	b := d.Bytes()
	binary.LittleEndian.PutUint32(b[4:], id)
	return b
}

// variant returns d with its content's last bytes changed to i: another
// valid dictionary, with an id of its own.
func variant(t testing.TB, d *codec.Dictionary, i int) *codec.Dictionary {
	t.Helper()
	b := d.Bytes()
	binary.LittleEndian.PutUint32(b[len(b)-4:], uint32(i))
	v, err := codec.ParseDictionary(b)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// encode returns v written with d at level 1, as a writer stores it.
func encode(t testing.TB, d *codec.Dictionary, v []byte) []byte {
	t.Helper()
	out, err := codec.AppendValue(nil, d.Codec(1), v)
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := codec.DictionaryID(out); !ok || id != d.ID() {
		t.Fatalf("encoded with header %#x, not with dictionary %08x", out[0], d.ID())
	}
	return out
}

// emptyDictValue is the empty value written with dictionary id (FORMAT.md
// section 3.6).
func emptyDictValue(id uint32) []byte {
	v := []byte{codec.HeaderZstdDict, 0x28, 0xb5, 0x2f, 0xfd, 0x23, 0, 0, 0, 0, 0x00, 0x01, 0x00, 0x00}
	binary.LittleEndian.PutUint32(v[6:], id)
	return v
}

// expire makes the set's failure to get id due for a fetch again, as a
// second's wait would.
func (s *Set) expire(t testing.TB, id uint32) {
	t.Helper()
	e := s.lookup(id)
	if e == nil || e.d != nil {
		t.Fatalf("the set holds no failure for %08x", id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.add(&entry{id: id, err: e.err, retry: time.Now().Add(-time.Second).UnixNano()})
}

const limit = 64 << 20

// TestWriter: a policy's dictionary is parsed, checked and held once per
// id; its codec is the dictionary's at the level of the policy's zstd
// codec, or none; values written with it decode without a fetch.
func TestWriter(t *testing.T) {
	t.Parallel()
	d := trained(t, 1)
	var s Set
	for name, tc := range map[string]struct {
		b   []byte
		zc  codec.Codec
		err error
	}{
		"not a dictionary": {[]byte("hello"), codec.Zstd, codec.ErrInvalidDictionary},
		"too large":        {make([]byte, codec.MaxDictionarySize+1), codec.Zstd, codec.ErrInvalidDictionary},
		"with lz4":         {d.Bytes(), codec.LZ4, nil},
	} {
		if w, c, err := s.Writer(tc.b, tc.zc); err == nil || w != nil || c != nil {
			t.Errorf("%s: Writer accepted it", name)
		} else if tc.err != nil && !errors.Is(err, tc.err) {
			t.Errorf("%s: %v, want %v", name, err, tc.err)
		}
	}
	if s.lookup(d.ID()) != nil {
		t.Fatal("a dictionary refused with its codec joined the set")
	}

	v := samples(1, 2)[0]
	// A codec is the dictionary's at a level if it writes v as that does.
	same := func(c codec.Codec, level int) bool {
		got, err1 := codec.AppendValue(nil, c, v)
		want, err2 := codec.AppendValue(nil, d.Codec(level), v)
		return err1 == nil && err2 == nil && bytes.Equal(got, want)
	}
	w1, c1, err := s.Writer(d.Bytes(), codec.Zstd)
	if err != nil || !same(c1, 1) {
		t.Fatalf("Writer with Zstd: %v, %v; want the dictionary's level 1", c1, err)
	}
	w3, c3, err := s.Writer(d.Bytes(), codec.ZstdLevel(3))
	if err != nil || !same(c3, 3) || same(c3, 1) {
		t.Fatalf("Writer with level 3: %v, %v; want the dictionary's level 3", c3, err)
	}
	w0, c0, err := s.Writer(d.Bytes(), codec.None)
	if err != nil || c0 != nil {
		t.Fatalf("Writer with None: %v, %v; want no codec", c0, err)
	}
	if w1 != w3 || w1 != w0 {
		t.Error("three policies with one dictionary have three Writers: it would be published three times")
	}

	var r stub
	got, err := s.Decode(nil, encode(t, d, v), limit, &r)
	if err != nil || !bytes.Equal(got, v) {
		t.Fatalf("Decode: %q, %v", got, err)
	}
	if r.fetches() != 0 {
		t.Errorf("a value of a policy's own dictionary fetched it %d times", r.fetches())
	}
}

// TestCheckCodec: a dictionary goes with a zstd codec, whose level it
// takes, or with none.
func TestCheckCodec(t *testing.T) {
	t.Parallel()
	for _, c := range []codec.Codec{codec.Zstd, codec.ZstdDefault, codec.ZstdBetter, codec.ZstdBest, codec.None} {
		if err := CheckCodec(c); err != nil {
			t.Errorf("%s: %v", c.Name(), err)
		}
	}
	for _, c := range []codec.Codec{codec.LZ4, codec.LZ4HC, codec.Snappy} {
		if err := CheckCodec(c); err == nil || !strings.Contains(err.Error(), c.Name()) {
			t.Errorf("%s: %v, want an error naming it", c.Name(), err)
		}
	}
}

// TestDecodePlain: values written without a dictionary decode without
// Redis, and their errors are the codec's.
func TestDecodePlain(t *testing.T) {
	t.Parallel()
	var s Set
	v := samples(1, 3)[0]
	for _, c := range []codec.Codec{codec.None, codec.Zstd, codec.LZ4} {
		enc, err := codec.AppendValue(nil, c, v)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := s.Decode(nil, enc, limit, nil); err != nil || !bytes.Equal(got, v) {
			t.Errorf("%s: %q, %v", c.Name(), got, err)
		}
		if _, err := s.Decode(nil, enc, len(v)-1, nil); !errors.Is(err, codec.ErrTooLarge) {
			t.Errorf("%s over the limit: %v, want ErrTooLarge", c.Name(), err)
		}
	}
}

// TestFetchedOnce: concurrent reads of values of one dictionary the set
// lacks fetch it once; values that are corrupt or too large are refused
// without a fetch.
func TestFetchedOnce(t *testing.T) {
	t.Parallel()
	srv, r := newClient(t)
	redistest.RequireReal(t, srv, "counts commands with INFO commandstats")
	d := trained(t, 71)
	r.rdb.Set(context.Background(), codec.DictionaryKey(d.ID()), d.Bytes(), 0)
	vs := samples(200, 72)
	var s Set
	srv.ResetStats(t)
	encs := make([][]byte, len(vs))
	for i, v := range vs {
		encs[i] = encode(t, d, v)
	}
	var wg sync.WaitGroup
	start := make(chan struct{}) // the reads begin together
	errs := make([]error, len(vs))
	for i, v := range vs {
		wg.Go(func() {
			<-start
			got, err := s.Decode(nil, encs[i], limit, r)
			if err == nil && !bytes.Equal(got, v) {
				err = fmt.Errorf("value %d decoded as %q", i, got)
			}
			errs[i] = err
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if n := srv.CommandCount(t, "getrange"); n != 1 {
		t.Errorf("%d concurrent reads fetched the dictionary %d times, want 1", len(vs), n)
	}

	// A frame that claims 1 GiB, naming an id Redis does not hold.
	srv.ResetStats(t)
	bomb := []byte{codec.HeaderZstdDict, 0x28, 0xb5, 0x2f, 0xfd, 0xe3, // single segment, 8-byte size, 4-byte id
		0, 0, 0, 0x40, // id 40000000
		0, 0, 0, 0x40, 0, 0, 0, 0, // 1 GiB
		0x43, 0x1f, 0x00, 'x'} // one last RLE block of 1,000 bytes
	if _, err := s.Decode(nil, bomb, limit, r); !errors.Is(err, codec.ErrTooLarge) {
		t.Errorf("Decode of a 1 GiB frame: %v, want ErrTooLarge", err)
	}
	if _, err := s.Decode(nil, append(encode(t, d, vs[0])[:20:20], 0xff, 0xff), limit, r); !errors.Is(err, codec.ErrCorrupt) {
		t.Errorf("Decode of a corrupt frame: %v, want ErrCorrupt", err)
	}
	if n := srv.CommandCount(t, "getrange"); n != 0 {
		t.Errorf("a value too large or corrupt fetched its dictionary (%d GETRANGEs)", n)
	}
}

// TestMissing: a dictionary Redis does not hold is a typed error naming
// its id, remembered for a while (reads cost no fetch), then fetched
// again; once back in Redis, it is used.
func TestMissing(t *testing.T) {
	t.Parallel()
	_, r := newClient(t)
	d := trained(t, 51)
	v := samples(1, 52)[0]
	enc := encode(t, d, v)
	var s Set
	for i := range 3 {
		_, err := s.Decode(nil, enc, limit, r)
		var de *codec.DictionaryError
		if !errors.Is(err, codec.ErrUnknownDictionary) || !errors.As(err, &de) || de.ID != d.ID() || !strings.Contains(err.Error(), fmt.Sprintf("%08x", d.ID())) {
			t.Fatalf("Decode %d: %v, want an unknown dictionary %08x", i, err, d.ID())
		}
	}
	if n := r.getRanges.Load(); n != 1 {
		t.Errorf("3 reads of a missing dictionary fetched it %d times, want 1 (remembered)", n)
	}

	r.rdb.Set(context.Background(), codec.DictionaryKey(d.ID()), d.Bytes(), 0)
	if _, err := s.Decode(nil, enc, limit, r); !errors.Is(err, codec.ErrUnknownDictionary) {
		t.Fatalf("Decode while the missing id is remembered: %v", err)
	}
	s.expire(t, d.ID())
	if got, err := s.Decode(nil, enc, limit, r); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("Decode once the dictionary is back: %q, %v", got, err)
	}
	if n := r.getRanges.Load(); n != 2 {
		t.Errorf("%d fetches, want 2", n)
	}
}

// TestRedisFailure: a fetch that Redis failed is the failure, not an
// unknown dictionary, and is not remembered: the next read fetches again.
func TestRedisFailure(t *testing.T) {
	t.Parallel()
	d := trained(t, 53)
	enc := encode(t, d, samples(1, 54)[0])
	cause := errors.New("connection refused")
	r := &stub{err: cause}
	var s Set
	for i := range 2 {
		_, err := s.Decode(nil, enc, limit, r)
		if !errors.Is(err, cause) || errors.Is(err, codec.ErrUnknownDictionary) || !strings.Contains(err.Error(), codec.DictionaryKey(d.ID())) {
			t.Fatalf("Decode %d: %v, want the Redis failure, naming the key", i, err)
		}
	}
	if n := r.fetches(); n != 2 {
		t.Errorf("2 reads while Redis failed fetched %d times, want 2", n)
	}
	if s.lookup(d.ID()) != nil {
		t.Error("a Redis failure was kept")
	}
}

// TestHostile: whatever the dictionary's key holds that is not the
// dictionary named is refused, and reading it costs no more memory than a
// dictionary may take.
func TestHostile(t *testing.T) {
	// Not parallel: it measures memory.
	_, r := newClient(t)
	ctx := context.Background()
	d, other := trained(t, 61), trained(t, 62)
	id := d.ID()
	enc := encode(t, d, samples(1, 63)[0])
	huge := bytes.Repeat([]byte{0x37, 0xa4, 0x30, 0xec}, 16<<20) // 64 MiB, beginning like a dictionary
	forged := withID(other, id)                                  // another dictionary claiming the id
	key := codec.DictionaryKey(id)
	for name, put := range map[string]func() error{
		"another dictionary": func() error { return r.rdb.Set(ctx, key, other.Bytes(), 0).Err() },
		"forged id":          func() error { return r.rdb.Set(ctx, key, forged, 0).Err() },
		"not a dictionary":   func() error { return r.rdb.Set(ctx, key, "hello", 0).Err() },
		"64 MiB":             func() error { return r.rdb.Set(ctx, key, huge, 0).Err() },
		"a hash":             func() error { return r.rdb.HSet(ctx, key, "f", "v").Err() },
	} {
		t.Run(name, func(t *testing.T) {
			r.rdb.Del(ctx, key)
			if err := put(); err != nil {
				t.Fatal(err)
			}
			var s Set // a new set: nothing remembered
			runtime.GC()
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			_, err := s.Decode(nil, enc, limit, r)
			runtime.ReadMemStats(&m1)
			var de *codec.DictionaryError
			if !errors.Is(err, codec.ErrUnknownDictionary) || !errors.As(err, &de) || de.ID != id {
				t.Fatalf("Decode: %v, want an unknown dictionary %08x", err, id)
			}
			if alloc := m1.TotalAlloc - m0.TotalAlloc; alloc > 2<<20 {
				t.Errorf("the Decode allocated %d bytes, want under 2 MiB (a dictionary is at most %d)", alloc, codec.MaxDictionarySize)
			}
			if e := s.lookup(id); e == nil || e.retry == 0 {
				t.Error("the refusal is not remembered: every read would fetch it again")
			}
		})
	}
}

// TestBounded: a set remembers at most 64 dictionaries it fetched or
// found missing; past that the oldest are forgotten, and fetched again
// when read.
func TestBounded(t *testing.T) {
	t.Parallel()
	const n = 100
	srv, r := newClient(t)
	redistest.RequireReal(t, srv, "counts commands with INFO commandstats")
	var s Set
	read := func(i int) {
		if _, err := s.Decode(nil, emptyDictValue(1<<20+uint32(i)), limit, r); !errors.Is(err, codec.ErrUnknownDictionary) {
			t.Fatalf("Decode %d: %v, want an unknown dictionary", i, err)
		}
	}
	var oldest time.Time // when the first id still remembered was fetched
	for i := range n {
		if i == n-64 {
			oldest = time.Now()
		}
		read(i)
	}
	srv.ResetStats(t)
	read(n - 64) // the oldest remembered, then the newest: fetched only if forgotten
	read(n - 1)
	remembered := srv.CommandCount(t, "getrange")
	read(0)
	forgotten := srv.CommandCount(t, "getrange") - remembered
	if time.Since(oldest) > 900*time.Millisecond {
		t.Skipf("reads too slow here (%v) to tell the bound from the second a missing id is remembered", time.Since(oldest))
	}
	if remembered != 0 || forgotten != 1 {
		t.Errorf("read again, the last 64 ids made %d fetches (want 0: remembered) and the first %d (want 1: forgotten, past the bound)", remembered, forgotten)
	}
}

// TestEviction: past the bound, ids found missing go first, then, as a
// clock does, dictionaries not read since the eviction before; a policy's
// own are never evicted.
func TestEviction(t *testing.T) {
	t.Parallel()
	base := trained(t, 91)
	own := trained(t, 92)
	r := &stub{held: map[string][]byte{}}
	var s Set
	if _, _, err := s.Writer(own.Bytes(), codec.Zstd); err != nil {
		t.Fatal(err)
	}
	dicts := make([]*codec.Dictionary, 65)
	for i := range dicts {
		dicts[i] = variant(t, base, i)
		r.held[codec.DictionaryKey(dicts[i].ID())] = dicts[i].Bytes()
	}
	dict := func(i int) uint32 { return dicts[i].ID() }
	missing := func(i int) uint32 { return 3<<20 + uint32(i) }
	get := func(id uint32) {
		t.Helper()
		if _, err := s.Dictionary(id, r); err != nil && !errors.Is(err, codec.ErrUnknownDictionary) {
			t.Fatal(err)
		}
	}
	for i := range 60 {
		get(dict(i))
	}
	for i := range 4 {
		get(missing(i))
	}
	if s.lookup(dict(0)) == nil || s.lookup(missing(0)) == nil {
		t.Fatal("64 fetched entries: one was evicted under the bound")
	}
	// Past the bound: the clock passes over the dictionaries, all read,
	// marking them unread, and evicts the missing ids first.
	for i := 60; i < 64; i++ {
		get(dict(i))
	}
	for i := range 4 {
		if s.lookup(missing(i)) != nil {
			t.Errorf("missing id %d kept past the bound", i)
		}
	}
	// Read dictionary 1 again; fetch one more: dictionary 0, unread since
	// the clock passed, goes; 1 stays.
	get(dict(1))
	get(dict(64))
	if s.lookup(dict(0)) != nil {
		t.Error("a dictionary unread since the last eviction was kept")
	}
	if s.lookup(dict(1)) == nil {
		t.Error("a dictionary read since the last eviction was evicted")
	}
	if e := s.lookup(own.ID()); e == nil || e.own == nil {
		t.Error("a policy's own dictionary was evicted")
	}
	if n := len(*s.held.Load()); n != maxFetched+1 {
		t.Errorf("the set holds %d entries, want %d fetched and the policy's own", n, maxFetched)
	}
}
