package packcache_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// Profile is a small value, as services cache per user: 150 to 400 bytes
// of JSON, most of it field names and values that recur from one profile
// to the next, which is what a dictionary holds.
type Profile struct {
	ID        int       `json:"id"`
	Username  string    `json:"username"`
	Email     string    `json:"email,omitempty"`
	Name      string    `json:"name,omitempty"`
	Plan      string    `json:"plan,omitempty"`
	City      string    `json:"city,omitempty"`
	Lang      string    `json:"lang,omitempty"`
	Created   string    `json:"created,omitempty"`
	Verified  bool      `json:"verified,omitempty"`
	Followers int       `json:"followers,omitempty"`
	Roles     []string  `json:"roles,omitempty"`
	Settings  *Settings `json:"settings,omitempty"`
	Bio       string    `json:"bio,omitempty"`
}

type Settings struct {
	Theme         string `json:"theme"`
	Notifications bool   `json:"notifications"`
	TZ            string `json:"tz"`
}

var (
	firstNames = strings.Fields("alice bob carol dave erin frank grace heidi ivan judy mallory oscar peggy trent victor walter")
	lastNames  = strings.Fields("smith jones garcia miller davis lopez wilson anderson thomas moore martin lee walker young king")
	cities     = []string{"Berlin", "Lisbon", "Austin", "Osaka", "Lagos", "Toronto", "Madrid", "Seoul", "Lyon", "Denver"}
	langs      = strings.Fields("en-US en-GB de-DE fr-FR pt-BR ja-JP es-ES pl-PL")
	plans      = strings.Fields("free pro team enterprise")
)

// profiles returns n profiles whose JSON is 150 to 400 bytes, the same
// for a seed.
func profiles(n int, seed uint64) []Profile {
	r := rand.New(rand.NewPCG(seed, 7))
	out := make([]Profile, 0, n)
	for i := 0; len(out) < n; i++ {
		p := 0.5 + r.Float64()/2 // each optional part's chance of being there
		has := func() bool { return r.Float64() < p }
		first, last := firstNames[r.IntN(len(firstNames))], lastNames[r.IntN(len(lastNames))]
		v := Profile{ID: 100000 + 7*i + r.IntN(7), Username: fmt.Sprintf("%s.%s%d", first, last, r.IntN(100))}
		if has() {
			v.Email, v.Name = first+"."+last+"@example.com", first+" "+last
		}
		if has() {
			v.Plan, v.City, v.Lang = plans[r.IntN(len(plans))], cities[r.IntN(len(cities))], langs[r.IntN(len(langs))]
		}
		if has() {
			v.Created = fmt.Sprintf("20%02d-%02d-%02dT%02d:%02d:00Z", 15+r.IntN(10), 1+r.IntN(12), 1+r.IntN(28), r.IntN(24), r.IntN(60))
			v.Verified = r.IntN(3) > 0
		}
		if has() {
			v.Followers = r.IntN(5000)
			v.Roles = []string{"user", "admin", "billing"}[:1+r.IntN(3)]
		}
		if has() {
			v.Settings = &Settings{Theme: []string{"dark", "light", "system"}[r.IntN(3)], Notifications: r.IntN(2) == 0, TZ: fmt.Sprintf("UTC%+d", r.IntN(24)-11)}
		}
		if has() {
			ws := make([]string, 2+r.IntN(8))
			for w := range ws {
				ws[w] = words[r.IntN(len(words))]
			}
			v.Bio = strings.Join(ws, " ")
		}
		if b, _ := json.Marshal(v); len(b) >= 150 && len(b) <= 400 {
			out = append(out, v)
		}
	}
	return out
}

// profileDictionary trains a 4 KiB dictionary on 500 profiles of seed.
func profileDictionary(t testing.TB, seed uint64) []byte {
	t.Helper()
	var samples [][]byte
	for _, p := range profiles(500, seed) {
		b, _ := json.Marshal(p)
		samples = append(samples, b)
	}
	d, err := codec.TrainDictionary(samples, 4<<10)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func dictID(t testing.TB, d []byte) uint32 {
	t.Helper()
	return parsed(t, d).ID()
}

// parsed is d parsed: its Bytes are what a writer publishes.
func parsed(t testing.TB, d []byte) *codec.Dictionary {
	t.Helper()
	pd, err := codec.ParseDictionary(d)
	if err != nil {
		t.Fatal(err)
	}
	return pd
}

// setProfiles stores vs under prefix0 ... prefixN-1.
func setProfiles(t testing.TB, c *packcache.Cache[json.RawMessage], prefix string, vs []Profile) {
	t.Helper()
	ctx := ctxT(t)
	for i, v := range vs {
		if err := c.Set(ctx, prefix+strconv.Itoa(i), mustJSON(t, v)); err != nil {
			t.Fatal(err)
		}
	}
}

// checkProfiles fails the test unless c reads back vs under prefix.
func checkProfiles(t testing.TB, c *packcache.Cache[json.RawMessage], prefix string, vs []Profile) {
	t.Helper()
	ctx := ctxT(t)
	for i, want := range vs {
		got, err := c.Get(ctx, prefix+strconv.Itoa(i))
		if err != nil {
			t.Fatalf("Get %s%d: %v", prefix, i, err)
		}
		if a, b := []byte(got), mustJSON(t, want); !bytes.Equal(a, b) {
			t.Fatalf("Get %s%d: %s, want %s", prefix, i, a, b)
		}
	}
}

// mustJSON is v's JSON. The tests store profiles as the JSON bytes
// (Cache[json.RawMessage]): a Cache of a type of their own would be
// compiled again for it, at a cost of its own to every test run.
func mustJSON(t testing.TB, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// profilesDigest is what the child process prints for profiles read back.
func profilesDigest(t testing.TB, vs []Profile) string {
	h := sha256.New()
	for _, v := range vs {
		h.Write(mustJSON(t, v))
	}
	return hex.EncodeToString(h.Sum(nil))
}

func memoryUsage(t testing.TB, rdb redis.UniversalClient, prefix string, n int) int64 {
	t.Helper()
	var sum int64
	for i := range n {
		m, err := rdb.MemoryUsage(context.Background(), prefix+strconv.Itoa(i)).Result()
		if err != nil {
			t.Fatal(err)
		}
		sum += m
	}
	return sum
}

// TestDictionaryStoredRatio: 300 profiles of 150-400 bytes under a
// prefix with a trained dictionary take at most 0.6 of the memory they
// take plain (MEMORY USAGE, keys included), read back equal, and a cache
// without the dictionary reads them all, in this process and in another.
func TestDictionaryStoredRatio(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	redistest.RequireReal(t, s, "MEMORY USAGE")
	d := profileDictionary(t, 1)
	vs := profiles(300, 2) // the ratio is the point, not the count: 1,000 gave 0.469
	w := mustNew[json.RawMessage](t, rdb,
		packcache.WithPrefix("d:", packcache.Policy{Dictionary: d}),
		packcache.WithPrefix("n:", packcache.Policy{Codec: codec.None}))
	setProfiles(t, w, "d:", vs)
	setProfiles(t, w, "n:", vs)
	for i := range vs {
		if id, ok := codec.DictionaryID(rawGet(t, rdb, "d:"+strconv.Itoa(i))); !ok || id != dictID(t, d) {
			t.Fatalf("d:%d is not stored with the dictionary (header %#x)", i, rawGet(t, rdb, "d:"+strconv.Itoa(i))[0])
		}
	}
	withDict, plain := memoryUsage(t, rdb, "d:", len(vs)), memoryUsage(t, rdb, "n:", len(vs))
	ratio := float64(withDict) / float64(plain)
	t.Logf("MEMORY USAGE of %d profiles: %d B with the dictionary, %d B plain: %.3f", len(vs), withDict, plain, ratio)
	if ratio > 0.6 {
		t.Errorf("stored at %.3f of plain, want at most 0.6", ratio)
	}
	checkProfiles(t, w, "d:", vs)

	r := mustNew[json.RawMessage](t, rdb) // no dictionary
	checkProfiles(t, r, "d:", vs)
	tg := redistest.Target{Name: "single", Client: rdb, Server: s}
	want := fmt.Sprintf("read %d %s", len(vs), profilesDigest(t, vs))
	if got := runChild(t, tg, "dict-read", "d:", strconv.Itoa(len(vs))); got != want {
		t.Fatalf("the other process: %q, want %q", got, want)
	}
}

// dictChild is the other process of TestDictionaryStoredRatio: a cache
// built without any dictionary reads the profiles under args[0], 0 to
// args[1], and prints how many it read and their digest.
func dictChild(rdb redis.UniversalClient, args []string) error {
	prefix := args[0]
	n, err := strconv.Atoi(args[1])
	if err != nil {
		return err
	}
	c, err := packcache.New[json.RawMessage](rdb)
	if err != nil {
		return err
	}
	defer c.Close()
	h := sha256.New()
	for i := range n {
		v, err := c.Get(context.Background(), prefix+strconv.Itoa(i))
		if err != nil {
			return err
		}
		h.Write(v)
	}
	fmt.Printf("read %d %s\n", n, hex.EncodeToString(h.Sum(nil)))
	return nil
}

// TestDictionaryRotation: a new dictionary for a prefix applies to new
// writes; values written with the old one stay readable, by caches with
// either dictionary and by one with none.
func TestDictionaryRotation(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	d1, d2 := profileDictionary(t, 11), profileDictionary(t, 12)
	if dictID(t, d1) == dictID(t, d2) {
		t.Fatal("two trainings gave one dictionary")
	}
	old, cur := profiles(100, 13), profiles(100, 14)
	w1 := mustNew[json.RawMessage](t, rdb, packcache.WithPrefix("p:", packcache.Policy{Dictionary: d1}))
	setProfiles(t, w1, "p:old:", old)
	w2 := mustNew[json.RawMessage](t, rdb, packcache.WithPrefix("p:", packcache.Policy{Dictionary: d2}))
	setProfiles(t, w2, "p:new:", cur)
	for gen, want := range map[string]uint32{"old": dictID(t, d1), "new": dictID(t, d2)} {
		for i := range 100 {
			if id, _ := codec.DictionaryID(rawGet(t, rdb, "p:"+gen+":"+strconv.Itoa(i))); id != want {
				t.Fatalf("p:%s:%d names dictionary %08x, want %08x", gen, i, id, want)
			}
		}
	}
	for name, c := range map[string]*packcache.Cache[json.RawMessage]{"old": w1, "new": w2, "none": mustNew[json.RawMessage](t, rdb)} {
		t.Run("reader with "+name, func(t *testing.T) {
			checkProfiles(t, c, "p:old:", old)
			checkProfiles(t, c, "p:new:", cur)
		})
	}
}

// TestDictionaryReferenceZstd: the reference zstd command decodes a stored
// value's payload with the dictionary as Redis holds it.
func TestDictionaryReferenceZstd(t *testing.T) {
	t.Parallel()
	zstdCmd, err := exec.LookPath("zstd")
	if err != nil {
		t.Skip("no zstd command on PATH: the reference decoder is not checked (install Debian's zstd package to check it)")
	}
	_, rdb := single(t)
	d := profileDictionary(t, 21)
	c := mustNew[json.RawMessage](t, rdb, packcache.WithPrefix("p:", packcache.Policy{Dictionary: d}))
	v := profiles(1, 22)[0]
	if err := c.Set(ctxT(t), "p:1", mustJSON(t, v)); err != nil {
		t.Fatal(err)
	}
	stored := rawGet(t, rdb, "p:1")
	id, ok := codec.DictionaryID(stored)
	if !ok {
		t.Fatalf("stored with header %#x, not with the dictionary", stored[0])
	}
	dir := t.TempDir()
	dictFile, payload := filepath.Join(dir, "dict"), filepath.Join(dir, "value.zst")
	if err := os.WriteFile(dictFile, rawGet(t, rdb, codec.DictionaryKey(id)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(payload, stored[1:], 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(zstdCmd, "-q", "-d", "-c", "-D", dictFile, payload).CombinedOutput()
	if err != nil {
		t.Fatalf("zstd -D dict -dc: %v: %s", err, out)
	}
	if want := mustJSON(t, v); !bytes.Equal(out, want) {
		t.Fatalf("zstd decoded %s, want %s", out, want)
	}
}

// TestDictionaryPublishFails: a writer that cannot publish its dictionary
// stores values without it, readable by any reader, reports the failure
// to the error handler, and uses the dictionary once it can publish it.
func TestDictionaryPublishFails(t *testing.T) {
	t.Parallel()
	s, admin := single(t)
	redistest.RequireReal(t, s, "ACL key permissions")
	ctx := ctxT(t)
	// A user that may write p:* but not the dictionary's key.
	if err := admin.Do(ctx, "ACL", "SETUSER", "writer", "on", ">pw", "+@all", "%R~*", "%W~p:*").Err(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), Username: "writer", Password: "pw", ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	d := profileDictionary(t, 41)
	var mu sync.Mutex
	var reported []error
	c := mustNew[json.RawMessage](t, rdb, packcache.WithPrefix("p:", packcache.Policy{Dictionary: d}),
		packcache.WithErrorHandler(func(_ context.Context, key string, err error) {
			mu.Lock()
			reported = append(reported, err)
			mu.Unlock()
		}))
	vs := profiles(20, 42)
	setProfiles(t, c, "p:", vs)
	for i := range vs {
		if v := rawGet(t, admin, "p:"+strconv.Itoa(i)); v[0] == codec.HeaderZstdDict {
			t.Fatalf("p:%d stored with a dictionary Redis does not hold", i)
		}
	}
	mu.Lock()
	// One report, and one more for each second the writes took.
	if len(reported) == 0 || !errors.Is(reported[0], packcache.ErrRedis) || !strings.Contains(reported[0].Error(), codec.DictionaryKey(dictID(t, d))) {
		t.Errorf("reported %v, want an error naming the dictionary's key", reported)
	}
	mu.Unlock()
	checkProfiles(t, mustNew[json.RawMessage](t, admin), "p:", vs)

	// Allowed to publish, the writer does so a second after the failure.
	if err := admin.Do(ctx, "ACL", "SETUSER", "writer", "allkeys").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "a write with the dictionary", func() bool {
		if err := c.Set(ctx, "p:later", mustJSON(t, vs[0])); err != nil {
			t.Fatal(err)
		}
		return rawGet(t, admin, "p:later")[0] == codec.HeaderZstdDict
	})
	if admin.Exists(ctx, codec.DictionaryKey(dictID(t, d))).Val() != 1 {
		t.Fatal("a value stored with the dictionary before it was published")
	}
}

// TestDictionaryMissing: a value whose dictionary Redis does not hold is a
// typed error naming the id, and the value is kept: a reader without a
// loader leaves it, and one with a loader answers from the loader and
// stores nothing over it. Once the dictionary is back, it reads.
func TestDictionaryMissing(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	d := profileDictionary(t, 51)
	id := dictID(t, d)
	w := mustNew[json.RawMessage](t, rdb, packcache.WithPrefix("p:", packcache.Policy{Dictionary: d}))
	v := profiles(1, 52)[0]
	if err := w.Set(ctx, "p:1", mustJSON(t, v)); err != nil {
		t.Fatal(err)
	}
	stored := rawGet(t, rdb, "p:1")
	published := rawGet(t, rdb, codec.DictionaryKey(id))
	rdb.Del(ctx, codec.DictionaryKey(id))

	r := mustNew[json.RawMessage](t, rdb)
	_, err := r.Get(ctx, "p:1")
	var de *codec.DictionaryError
	if !errors.Is(err, codec.ErrUnknownDictionary) || !errors.As(err, &de) || de.ID != id || !strings.Contains(err.Error(), fmt.Sprintf("%08x", id)) {
		t.Fatalf("Get: %v, want an unknown dictionary %08x", err, id)
	}
	var reported atomic.Int64
	loaded := mustJSON(t, Profile{ID: 1, Username: "from the loader"})
	rl := mustNew[json.RawMessage](t, rdb, packcache.WithLoader(packcache.LoaderFunc[json.RawMessage](func(context.Context, string) (json.RawMessage, error) {
		return loaded, nil
	})), packcache.WithErrorHandler(func(_ context.Context, _ string, err error) {
		if errors.Is(err, codec.ErrUnknownDictionary) {
			reported.Add(1)
		}
	}))
	if got, err := rl.Get(ctx, "p:1"); err != nil || !bytes.Equal(got, loaded) {
		t.Fatalf("read-through Get: %+v, %v; want the loader's value", got, err)
	}
	if reported.Load() == 0 {
		t.Error("the unknown dictionary was not reported")
	}
	if !bytes.Equal(rawGet(t, rdb, "p:1"), stored) {
		t.Fatal("the value was overwritten for want of its dictionary")
	}

	// Back in Redis, the dictionary is found a second later (a miss is
	// remembered that long).
	rdb.Set(ctx, codec.DictionaryKey(id), published, 0)
	waitFor(t, 5*time.Second, "the dictionary, published again", func() bool {
		got, err := r.Get(ctx, "p:1")
		return err == nil && bytes.Equal(got, mustJSON(t, v))
	})
}

// TestDictionaryComesBack: with the dictionary's key deleted (through the
// raw client, as eviction would) while values written with it remain,
// the writer's next Set publishes it again before it returns, with no
// expiry, and a reader without a loader, which failed on those values
// meanwhile, then reads them. Sets while Redis holds the dictionary
// publish nothing.
func TestDictionaryComesBack(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	redistest.RequireReal(t, s, "counts commands with INFO commandstats")
	ctx := ctxT(t)
	d := profileDictionary(t, 55)
	dk := codec.DictionaryKey(dictID(t, d))
	published := parsed(t, d).Bytes()
	var reported atomic.Int64
	w := mustNew[json.RawMessage](t, rdb, packcache.WithPrefix("p:", packcache.Policy{Dictionary: d}),
		packcache.WithErrorHandler(func(context.Context, string, error) { reported.Add(1) }))
	vs := profiles(20, 56)
	setProfiles(t, w, "p:", vs)
	s.ResetStats(t)
	setProfiles(t, w, "p:", vs)
	if n := s.CommandCount(t, "evalsha") + s.CommandCount(t, "eval"); n != 0 {
		t.Fatalf("20 Sets while Redis holds the dictionary ran %d scripts, want no publication", n)
	}

	for round := range 3 {
		r := mustNew[json.RawMessage](t, rdb) // no loader, no dictionary: a reader that fetched it keeps it
		if err := rdb.Del(ctx, dk).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Get(ctx, "p:"+strconv.Itoa(round)); !errors.Is(err, codec.ErrUnknownDictionary) {
			t.Fatalf("round %d: Get with the dictionary deleted: %v, want an unknown dictionary", round, err)
		}
		if err := w.Set(ctx, "p:next", mustJSON(t, vs[round])); err != nil {
			t.Fatal(err)
		}
		if got, err := rdb.Get(ctx, dk).Bytes(); err != nil || !bytes.Equal(got, published) {
			t.Fatalf("round %d: after the writer's next Set, %s holds %d bytes (%v), want the dictionary", round, dk, len(got), err)
		}
		if ttl := rdb.PTTL(ctx, dk).Val(); ttl != -1 {
			t.Fatalf("round %d: %s published again with a TTL of %v, want none", round, dk, ttl)
		}
		// A missing dictionary is remembered for a second: wait for the
		// reader to fetch it again.
		waitFor(t, 10*time.Second, "the reader without a loader, reading the values", func() bool {
			_, err := r.Get(ctx, "p:"+strconv.Itoa(round))
			return err == nil
		})
		checkProfiles(t, r, "p:", vs)
	}
	if n := reported.Load(); n != 0 {
		t.Errorf("%d errors reported, want none", n)
	}
}

// TestDictionaryEvicted: under maxmemory with allkeys-lru, Redis evicts
// the dictionary's key itself (no one reads it after it is fetched); a
// value written with it remains, which a reader without a loader cannot
// read; the writer's next Set puts the dictionary back, and the reader
// then reads the value.
func TestDictionaryEvicted(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
	redistest.RequireReal(t, s, "evicts under maxmemory")
	rdb := s.Client(t)
	ctx := ctxT(t)
	d := profileDictionary(t, 57)
	dk := codec.DictionaryKey(dictID(t, d))
	published := parsed(t, d).Bytes()
	w := mustNew[json.RawMessage](t, rdb, packcache.WithPrefix("p:", packcache.Policy{Dictionary: d}))
	v := mustJSON(t, profiles(1, 58)[0])
	if err := w.Set(ctx, "p:1", v); err != nil {
		t.Fatal(err)
	}
	stored := rawGet(t, rdb, "p:1")
	if stored[0] != codec.HeaderZstdDict || rdb.Exists(ctx, dk).Val() != 1 {
		t.Fatal("p:1 not stored with the published dictionary")
	}

	// Room for about 30 more 16 KiB values: writing more makes Redis
	// evict, the least recently used first.
	used := infoField(t, rdb, "memory", "used_memory")
	if err := rdb.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used+512<<10, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	filler := bytes.Repeat([]byte("x"), 16<<10)
	evicted := false
	for i := 0; i < 100000 && !evicted; i++ {
		if err := rdb.Set(ctx, "fill:"+strconv.Itoa(i), filler, 0).Err(); err != nil {
			t.Fatal(err)
		}
		evicted = rdb.Exists(ctx, dk).Val() == 0 // EXISTS is no use of the key for the LRU
	}
	if !evicted {
		t.Fatalf("100,000 values of 16 KiB did not evict %s", dk)
	}
	if n := infoField(t, rdb, "stats", "evicted_keys"); n == 0 {
		t.Fatalf("%s is gone, but Redis evicted nothing", dk)
	}
	// Redis has evicted the dictionary. From here it is to evict no more,
	// so that what follows does not depend on which key it picks next:
	// the value is put back if it went too, as values written with the
	// dictionary remain in general.
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.SetNX(ctx, "p:1", stored, 0).Err(); err != nil {
		t.Fatal(err)
	}

	r := mustNew[json.RawMessage](t, rdb) // no loader, no dictionary
	if _, err := r.Get(ctx, "p:1"); !errors.Is(err, codec.ErrUnknownDictionary) {
		t.Fatalf("Get with the dictionary evicted: %v, want an unknown dictionary", err)
	}
	if err := w.Set(ctx, "p:2", v); err != nil {
		t.Fatal(err)
	}
	if got, err := rdb.Get(ctx, dk).Bytes(); err != nil || !bytes.Equal(got, published) {
		t.Fatalf("after the writer's next Set, %s holds %d bytes (%v), want the dictionary", dk, len(got), err)
	}
	waitFor(t, 10*time.Second, "the reader without a loader, reading p:1", func() bool {
		got, err := r.Get(ctx, "p:1")
		return err == nil && bytes.Equal(got, v)
	})
}

// TestDictionaryComesBackCluster: on a Cluster, a Set whose key is on the
// dictionary key's master checks it in its own round trip and puts it
// back; a Set on another master sends that master nothing (it relies on
// the publication once a minute).
func TestDictionaryComesBackCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	rdb := cl.Client(t)
	ctx := ctxT(t)
	d := profileDictionary(t, 59)
	dk := codec.DictionaryKey(dictID(t, d))
	published := parsed(t, d).Bytes()
	dn := cl.NodeForKey(t, dk)
	same := "p:{" + dk + "}" // the dictionary key's slot
	other := ""
	for i := 0; other == ""; i++ {
		if k := "p:" + strconv.Itoa(i); cl.NodeForKey(t, k) != dn {
			other = k
		}
	}
	w := mustNew[json.RawMessage](t, rdb, packcache.WithPrefix("p:", packcache.Policy{Dictionary: d}))
	v := mustJSON(t, profiles(1, 60)[0])
	if err := w.Set(ctx, same, v); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, dk).Err(); err != nil {
		t.Fatal(err)
	}
	dn.ResetStats(t)
	if err := w.Set(ctx, other, v); err != nil {
		t.Fatal(err)
	}
	if n := dn.CommandCount(t, "exists"); n != 0 {
		t.Errorf("a Set on another master sent the dictionary's %d EXISTS", n)
	}
	if err := w.Set(ctx, same, v); err != nil {
		t.Fatal(err)
	}
	if got, err := rdb.Get(ctx, dk).Bytes(); err != nil || !bytes.Equal(got, published) {
		t.Fatalf("after a Set on its master, %s holds %d bytes (%v), want the dictionary", dk, len(got), err)
	}
	r := mustNew[json.RawMessage](t, rdb)
	for _, k := range []string{same, other} {
		if got, err := r.Get(ctx, k); err != nil || !bytes.Equal(got, v) {
			t.Fatalf("a reader without the dictionary, Get %s: %v", k, err)
		}
	}
}

// TestDictionaryPolicy: New refuses a bad dictionary and a codec that is
// not zstd's beside it; the threshold defaults to DictionaryCompressAbove
// and an explicit one wins; MinSaving keeps plain what does not gain; the
// codec's level is the dictionary's; where the dictionary and the codec
// come from different policies, the prefix's own wins.
func TestDictionaryPolicy(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	d := profileDictionary(t, 81)
	pd, _ := codec.ParseDictionary(d)

	for name, opts := range map[string][]packcache.Option{
		"not a dictionary": {packcache.WithPrefix("p:", packcache.Policy{Dictionary: []byte("hello")})},
		"too large":        {packcache.WithPrefix("p:", packcache.Policy{Dictionary: make([]byte, codec.MaxDictionarySize+1)})},
		"with lz4":         {packcache.WithPrefix("p:", packcache.Policy{Dictionary: d, Codec: codec.LZ4})},
		"on lz4":           {packcache.WithCodec(codec.LZ4), packcache.WithPrefix("", packcache.Policy{Dictionary: d})},
	} {
		if _, err := packcache.New[[]byte](rdb, opts...); err == nil {
			t.Errorf("%s: New accepted it", name)
		} else if name != "with lz4" && name != "on lz4" && !errors.Is(err, codec.ErrInvalidDictionary) {
			t.Errorf("%s: %v, want ErrInvalidDictionary", name, err)
		}
	}

	c := mustNew[[]byte](t, rdb,
		packcache.WithCodec(codec.LZ4),
		packcache.WithPrefix("d:", packcache.Policy{Dictionary: d}),
		packcache.WithPrefix("d3:", packcache.Policy{Dictionary: d, Codec: codec.ZstdLevel(3)}),
		packcache.WithPrefix("big:", packcache.Policy{Dictionary: d, CompressAbove: 500}),
		packcache.WithPrefix("none:", packcache.Policy{Dictionary: d, Codec: codec.None}))
	inherit := mustNew[[]byte](t, rdb,
		packcache.WithPrefix("", packcache.Policy{Dictionary: d}),
		packcache.WithPrefix("lz4:", packcache.Policy{Codec: codec.LZ4}))
	rec := mustJSON(t, profiles(1, 82)[0])
	random := make([]byte, 300)
	rand.NewChaCha8([32]byte{1}).Read(random)
	for _, tc := range []struct {
		c    *packcache.Cache[[]byte]
		key  string
		v    []byte
		want string // plain, lz4, not dict, or dict and the level whose frame it is
	}{
		{c, "d:rec", rec, "dict 1"}, // the cache's LZ4 is not the dictionary's
		{c, "d:60", rec[:60], "plain"},
		{c, "d:100", rec[:100], "dict 1"}, // over DictionaryCompressAbove, far under 1024
		{c, "d:random", random, "not dict"},
		{c, "d3:rec", rec, "dict 3"},
		{c, "big:rec", rec, "plain"},
		{c, "none:rec", rec, "plain"},
		{inherit, "rec", rec, "dict 1"},
		{inherit, "lz4:rec", bytes.Repeat(rec, 8), "lz4"},
	} {
		if err := tc.c.Set(ctx, tc.key, tc.v); err != nil {
			t.Fatal(err)
		}
		got := rawGet(t, rdb, tc.key)
		var level int
		switch _, err := fmt.Sscanf(tc.want, "dict %d", &level); {
		case err == nil:
			if want, _ := codec.AppendValue(nil, pd.Codec(level), tc.v); !bytes.Equal(got, want) {
				t.Errorf("%s: stored with header %#x, not as the dictionary's level %d writes it", tc.key, got[0], level)
			}
		case tc.want == "plain" && codec.IsHeader(got[0]),
			tc.want == "lz4" && got[0] != codec.HeaderLZ4,
			tc.want == "not dict" && got[0] == codec.HeaderZstdDict:
			t.Errorf("%s: stored with header %#x, want %s", tc.key, got[0], tc.want)
		}
		if back, err := tc.c.Get(ctx, tc.key); err != nil || !bytes.Equal(back, tc.v) {
			t.Errorf("%s: read back %q, %v", tc.key, back, err)
		}
	}
}

func ExamplePolicy_dictionary() {
	rdb, done := exampleClient()
	defer done()
	ctx := context.Background()

	// A dictionary trained on values like the prefix's; an application
	// ships it with its code ("packcache advise --train" writes one).
	var samples [][]byte
	for i := range 300 {
		samples = append(samples, fmt.Appendf(nil, `{"id":%d,"user":"user%03d","plan":"%s","locale":"en-US","verified":%t}`,
			i, i*7%1000, []string{"free", "pro", "team"}[i%3], i%4 > 0))
	}
	dict, err := codec.TrainDictionary(samples, 2<<10)
	if err != nil {
		panic(err)
	}
	writer, err := packcache.New[json.RawMessage](rdb, packcache.WithPrefix("user:", packcache.Policy{Dictionary: dict}))
	if err != nil {
		panic(err)
	}
	defer writer.Close()
	v := json.RawMessage(`{"id":1000,"user":"user042","plan":"pro","locale":"en-US","verified":true}`)
	if err := writer.Set(ctx, "user:1000", v); err != nil {
		panic(err)
	}
	stored, _ := rdb.Get(ctx, "user:1000").Bytes()
	c, _ := codec.Lookup(stored[0])
	fmt.Printf("stored with %s, in fewer bytes than plain: %v\n", c.Name(), len(stored) < len(v))

	// A cache without the dictionary reads it: the writer published the
	// dictionary in Redis, and the reader fetches it by the id the value
	// names.
	reader, err := packcache.New[json.RawMessage](rdb)
	if err != nil {
		panic(err)
	}
	defer reader.Close()
	got, err := reader.Get(ctx, "user:1000")
	fmt.Println(string(got), err)
	// Output:
	// stored with zstd-dict, in fewer bytes than plain: true
	// {"id":1000,"user":"user042","plan":"pro","locale":"en-US","verified":true} <nil>
}

// BenchmarkDictionarySet is a Set of a 150-400 byte profile under a
// prefix with a dictionary: what a write with a dictionary costs, its
// check that Redis still holds the dictionary included. Run
//
//	go test -run NONE -bench DictionarySet -benchmem -count 10 .
func BenchmarkDictionarySet(b *testing.B) {
	s := redistest.Start(b)
	rdb := s.Universal(b)
	ctx := context.Background()
	c := mustNew[json.RawMessage](b, rdb, packcache.WithPrefix("p:", packcache.Policy{Dictionary: profileDictionary(b, 61)}))
	v := mustJSON(b, profiles(1, 62)[0])
	if err := c.Set(ctx, "p:1", v); err != nil {
		b.Fatal(err)
	}
	if raw, err := rdb.Get(ctx, "p:1").Bytes(); err != nil || raw[0] != codec.HeaderZstdDict {
		b.Fatalf("stored %v, %v; not with the dictionary", raw, err)
	}
	b.SetBytes(int64(len(v)))
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Set(ctx, "p:1", v); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDictionaryComesBack measures how soon a deleted dictionary key
// is back: each iteration deletes it (through the raw client) and has a
// reader without a loader fail on a value written with it; then the
// writer Sets a value every 10 ms until Redis holds the dictionary again.
// It reports the seconds from the first of those Sets until the key is
// back (s-to-back), the Sets that took (sets-to-back), and the seconds
// until the reader reads the value (s-to-read: a reader remembers a
// missing dictionary for a second). Run
//
//	go test -run NONE -bench DictionaryComesBack -benchtime 5x .
func BenchmarkDictionaryComesBack(b *testing.B) {
	s := redistest.Start(b)
	rdb := s.Universal(b)
	ctx := context.Background()
	d := profileDictionary(b, 63)
	dk := codec.DictionaryKey(dictID(b, d))
	w := mustNew[json.RawMessage](b, rdb, packcache.WithPrefix("p:", packcache.Policy{Dictionary: d}))
	v := mustJSON(b, profiles(1, 64)[0])
	if err := w.Set(ctx, "p:1", v); err != nil {
		b.Fatal(err)
	}
	var toBack, toRead time.Duration
	sets := 0
	for b.Loop() {
		rdb.Del(ctx, dk)
		r, err := packcache.New[json.RawMessage](rdb, packcache.WithRedisTimeout(time.Minute))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := r.Get(ctx, "p:1"); !errors.Is(err, codec.ErrUnknownDictionary) {
			b.Fatalf("Get with the dictionary deleted: %v", err)
		}
		start := time.Now()
		for {
			if err := w.Set(ctx, "p:2", v); err != nil {
				b.Fatal(err)
			}
			sets++
			if rdb.Exists(ctx, dk).Val() == 1 {
				break
			}
			time.Sleep(10 * time.Millisecond) // a writer's pace, in a measurement
		}
		toBack += time.Since(start)
		for {
			if _, err := r.Get(ctx, "p:1"); err == nil {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		toRead += time.Since(start)
		r.Close()
	}
	b.ReportMetric(toBack.Seconds()/float64(b.N), "s-to-back")
	b.ReportMetric(float64(sets)/float64(b.N), "sets-to-back")
	b.ReportMetric(toRead.Seconds()/float64(b.N), "s-to-read")
}

// TestDictionaryComesBackThroughLoads: a writer whose every write is a
// SetMany or a read-through load (no write of which asks Redis in its own
// round trip whether it holds the dictionary) asks it once a second, and
// puts the dictionary back on the write that finds it missing: a deleted
// dictionary is back after a few writes, not after a minute of them.
func TestDictionaryComesBackThroughLoads(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	d := profileDictionary(t, 61)
	dk := codec.DictionaryKey(dictID(t, d))
	vs := profiles(40, 62)
	w := mustNew[json.RawMessage](t, rdb, packcache.WithPrefix("p:", packcache.Policy{Dictionary: d}),
		packcache.WithLoader(packcache.LoaderFunc[json.RawMessage](func(_ context.Context, key string) (json.RawMessage, error) {
			i, _ := strconv.Atoi(key[strings.LastIndexByte(key, ':')+1:])
			return mustJSON(t, vs[i%len(vs)]), nil
		})))
	for _, how := range []string{"SetMany", "load"} {
		if _, err := w.Get(ctx, "p:first:0"); err != nil { // published by a first write
			t.Fatal(err)
		}
		if err := rdb.Del(ctx, dk).Err(); err != nil {
			t.Fatal(err)
		}
		writes := 0
		waitFor(t, 20*time.Second, how+" writes putting the dictionary back", func() bool {
			writes++
			k := fmt.Sprintf("p:%s:%d", how, writes)
			var err error
			if how == "SetMany" {
				err = w.SetMany(ctx, map[string]json.RawMessage{k: mustJSON(t, vs[writes%len(vs)])})
			} else {
				_, err = w.Get(ctx, k)
			}
			if err != nil {
				t.Fatal(err)
			}
			return rdb.Exists(ctx, dk).Val() == 1
		})
		if got := rdb.Get(ctx, dk).Val(); got != string(parsed(t, d).Bytes()) {
			t.Fatalf("%s: %s holds %d bytes, want the dictionary", how, dk, len(got))
		}
		t.Logf("%s: the dictionary back after %d writes", how, writes)
	}
}
