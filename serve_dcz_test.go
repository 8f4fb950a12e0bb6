package packcache_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// Serve with Policy.Deltas (RFC 9842): the body offered as a dictionary,
// the version kept in Redis, and a client holding it answered with dcz,
// by this process or another; everything else answered as without it.

// chromiumAccept is the Accept-Encoding of Chromium on a secure origin
// (http://127.0.0.1 included) with dictionaries.
const chromiumAccept = "gzip, deflate, br, zstd, dcb, dcz"

// dictionaryOf is the Available-Dictionary of a client holding plain.
func dictionaryOf(plain []byte) string {
	sum := sha256.Sum256(plain)
	return ":" + base64.StdEncoding.EncodeToString(sum[:]) + ":"
}

// versionsKey is the key of key's versions (FORMAT.md section 10).
func versionsKey(key string) string { return "packcache:dcz:{" + key + "}" }

// storedPlain returns what key holds in Redis, decoded: the JSON a
// client of Serve decodes.
func storedPlain(t *testing.T, rdb redis.UniversalClient, key string) (plain, stored []byte) {
	t.Helper()
	stored = rawGet(t, rdb, key)
	plain, err := codec.DecodeValue(nil, stored, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	return plain, stored
}

// waitVersion waits until Redis keeps plain as a version of key.
func waitVersion(t *testing.T, rdb redis.UniversalClient, key string, plain []byte) {
	t.Helper()
	sum := sha256.Sum256(plain)
	waitFor(t, 50*time.Second, "the version of "+key+" in Redis", func() bool {
		return rdb.HExists(context.Background(), versionsKey(key), hex.EncodeToString(sum[:])).Val()
	})
}

// undcz checks that b is a dcz body against dict, the version it names,
// and returns what it decodes to, with a decoder that refuses a window
// larger than RFC 9842 allows.
func undcz(t *testing.T, b, dict []byte) []byte {
	t.Helper()
	sum := sha256.Sum256(dict)
	head := append([]byte{0x5e, 0x2a, 0x4d, 0x18, 0x20, 0x00, 0x00, 0x00}, sum[:]...)
	if !bytes.HasPrefix(b, head) {
		t.Fatalf("the dcz body does not begin with the magic and the dictionary's SHA-256: % x", b[:min(len(b), len(head))])
	}
	limit := max(uint64(8<<20), uint64(len(dict))*5/4)
	d, err := zstd.NewReader(nil, zstd.WithDecoderDictRaw(0, dict), zstd.WithDecoderMaxWindow(limit))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	out, err := d.DecodeAll(b[len(head):], nil)
	if err != nil {
		t.Fatalf("dcz: %v", err)
	}
	return out
}

// commandCount counts the commands of a name a client sends, and among
// them those with args arguments (the command's name included): 8 for
// the versions' write (EVALSHA, its SHA, 1, the key, 4 ARGV).
type commandCount struct {
	name     string
	args     int
	n, nArgs atomic.Int64
}

func (c *commandCount) count(cmd redis.Cmder) {
	if strings.EqualFold(cmd.Name(), c.name) {
		c.n.Add(1)
		if len(cmd.Args()) == c.args {
			c.nArgs.Add(1)
		}
	}
}

func (c *commandCount) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *commandCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(cmd)
		return next(ctx, cmd)
	}
}
func (c *commandCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.count(cmd)
		}
		return next(ctx, cmds)
	}
}

// withMessage is ch with one message more.
func withMessage(ch Channel, text string) Channel {
	next := ch
	next.Messages = append(append([]Message(nil), ch.Messages...), Message{
		ID: ch.Messages[len(ch.Messages)-1].ID + 1, Author: "student0001", Text: text,
		Sent: ch.Messages[len(ch.Messages)-1].Sent.Add(time.Minute),
	})
	return next
}

// TestServeDeltas: a client of Serve holding v1 of a 128 KB channel gets
// v2 (v1 and one message) as dcz, in at most 0.05x the stored zstd
// frame, decoding to v2 with v1 as its dictionary, from this process
// (whose near cache makes the delta once) and from another over a client
// of its own; the responses offer themselves as dictionaries; a
// conditional request against the dcz ETag is 304, naming v1 or v2 (the
// dcz response's own dictionary) in Available-Dictionary; the version a dcz
// client decoded is the one kept; after v3, clients holding v1 or v2 each
// get a delta against their own; no delta costs an error.
func TestServeDeltas(t *testing.T) {
	t.Parallel()
	s, rdb := single(t)
	ctx := ctxT(t)
	evals := &commandCount{name: "evalsha", args: 8}
	rdb.AddHook(evals)
	var er errorRecorder
	deltas := packcache.WithPrefix("ch:", packcache.Policy{Deltas: time.Hour})
	c := mustNew[Channel](t, rdb, deltas, packcache.WithCodec(codec.ZstdDefault), packcache.WithLocalCache(packcache.LocalCache{}), packcache.WithErrorHandler(er.handle))
	other := mustNew[Channel](t, s.Universal(t), deltas, packcache.WithCodec(codec.ZstdDefault), packcache.WithErrorHandler(er.handle)) // another process: no near cache

	v1 := makeChannel(37, 150<<10) // 128 KB of JSON
	if err := c.Set(ctx, "ch:1", v1); err != nil {
		t.Fatal(err)
	}
	j1, _ := storedPlain(t, rdb, "ch:1")
	rec := serveOnce(c, "ch:1", "GET", "Accept-Encoding", chromiumAccept)
	if rec.Code != 200 || rec.Header().Get("Content-Encoding") != "zstd" {
		t.Fatalf("v1: status %d, Content-Encoding %q", rec.Code, rec.Header().Get("Content-Encoding"))
	}
	checkOffer(t, rec, "/ch\\\\:1", "max-age=3600")
	waitVersion(t, rdb, "ch:1", j1)
	if ttl := rdb.PTTL(ctx, versionsKey("ch:1")).Val(); ttl <= 0 || ttl > time.Hour {
		t.Errorf("the versions expire in %v, want within Deltas (1h)", ttl)
	}

	v2 := withMessage(v1, "the midterm is moved to room 4")
	puts := evals.nArgs.Load()
	if err := c.Set(ctx, "ch:1", v2); err != nil {
		t.Fatal(err)
	}
	j2, stored2 := storedPlain(t, rdb, "ch:1")
	if len(j2) < 128<<10 {
		t.Fatalf("v2 is %d bytes of JSON, want 128 KB", len(j2))
	}
	frame := stored2[1:]
	for _, tc := range []struct {
		name string
		c    *packcache.Cache[Channel]
	}{{"this process", c}, {"another process", other}} {
		rec := serveOnce(tc.c, "ch:1", "GET", "Accept-Encoding", chromiumAccept, "Available-Dictionary", dictionaryOf(j1))
		h := rec.Header()
		if rec.Code != 200 || h.Get("Content-Encoding") != "dcz" {
			t.Fatalf("%s: v2 to a client holding v1: status %d, Content-Encoding %q", tc.name, rec.Code, h.Get("Content-Encoding"))
		}
		body := rec.Body.Bytes()
		if got := undcz(t, body, j1); !bytes.Equal(got, j2) {
			t.Fatalf("%s: the dcz body does not decode to v2", tc.name)
		}
		if ratio := float64(len(body)) / float64(len(frame)); ratio > 0.05 {
			t.Errorf("%s: dcz %d bytes, the stored frame %d: %.3fx, want at most 0.05x", tc.name, len(body), len(frame), ratio)
		}
		checkOffer(t, rec, "/ch\\\\:1", "max-age=3600")
		et := h.Get("Etag")
		if !strings.HasSuffix(et, `-dcz"`) || h.Get("Content-Length") != strconv.Itoa(len(body)) {
			t.Errorf("%s: ETag %s, Content-Length %s for %d bytes", tc.name, et, h.Get("Content-Length"), len(body))
		}
		// Revalidated, naming v1 still, or v2, the dictionary the dcz
		// response was: 304 either way.
		for _, held := range [][]byte{j1, j2} {
			notModified := serveOnce(tc.c, "ch:1", "GET", "Accept-Encoding", chromiumAccept, "Available-Dictionary", dictionaryOf(held), "If-None-Match", et)
			if notModified.Code != http.StatusNotModified || notModified.Body.Len() != 0 || notModified.Header().Get("Etag") != et {
				t.Errorf("%s: If-None-Match of the dcz ETag, holding %d bytes: status %d, %d bytes, ETag %s", tc.name, len(held), notModified.Code, notModified.Body.Len(), notModified.Header().Get("Etag"))
			}
		}
		t.Logf("%s: v2 %d bytes of JSON, stored frame %d, dcz %d (%.4fx)", tc.name, len(j2), len(frame), len(body), float64(len(body))/float64(len(frame)))
	}

	// A hot key: with the near cache serving, the delta is made once for
	// the entry, and the requests make no Redis call but the one write of
	// v2's version (made by the first Serve that sent v2, if not yet).
	waitNear(t, c, "ch:1")
	serveOnce(c, "ch:1", "GET", "Accept-Encoding", chromiumAccept, "Available-Dictionary", dictionaryOf(j1)) // the entry's delta
	waitVersion(t, rdb, "ch:1", j2)
	before := evals.n.Load()
	var first []byte
	for i := range 50 {
		rec := serveOnce(c, "ch:1", "GET", "Accept-Encoding", chromiumAccept, "Available-Dictionary", dictionaryOf(j1))
		if rec.Header().Get("Content-Encoding") != "dcz" {
			t.Fatalf("hot key, request %d: Content-Encoding %q", i, rec.Header().Get("Content-Encoding"))
		}
		if first == nil {
			first = rec.Body.Bytes()
		} else if !bytes.Equal(first, rec.Body.Bytes()) {
			t.Fatal("hot key: the dcz bodies differ")
		}
	}
	if n := evals.n.Load() - before; n != 0 {
		t.Errorf("50 dcz requests of a hot key made %d script calls, want none", n)
	}
	// v2 was sent from a read of Redis, then from the near cache's entry:
	// written once.
	if n := evals.nArgs.Load() - puts; n != 1 {
		t.Errorf("v2 written %d times by this process, want once", n)
	}
	if st := c.Stats().Served[packcache.ServeResponse{Status: 200, Coding: "dcz"}]; st.Responses < 51 || st.Bytes != st.Responses*uint64(len(first)) {
		t.Errorf("Stats.Served dcz: %+v", st)
	}
	// v3: a client holding v1, older than the last, and one holding v2
	// each get a delta against their own.
	if err := c.Set(ctx, "ch:1", withMessage(v2, "and bring a pencil")); err != nil {
		t.Fatal(err)
	}
	j3, _ := storedPlain(t, rdb, "ch:1")
	for _, held := range [][]byte{j1, j2} {
		rec := serveOnce(other, "ch:1", "GET", "Accept-Encoding", chromiumAccept, "Available-Dictionary", dictionaryOf(held))
		if rec.Header().Get("Content-Encoding") != "dcz" || !bytes.Equal(undcz(t, rec.Body.Bytes(), held), j3) {
			t.Errorf("v3 to a client holding %d bytes: Content-Encoding %q, or not v3", len(held), rec.Header().Get("Content-Encoding"))
		}
	}
	if errs := er.take(); len(errs) != 0 {
		t.Errorf("the error handler was told %v", errs)
	}
}

// checkOffer checks that a response offers its body as a dictionary.
func checkOffer(t *testing.T, rec *httptest.ResponseRecorder, match, cacheControl string) {
	t.Helper()
	h := rec.Header()
	if got := h.Get("Use-As-Dictionary"); !strings.HasPrefix(got, `match="`+match+`", id="`) {
		t.Errorf("Use-As-Dictionary %q, want match %q and an id", got, match)
	}
	if got := h.Get("Cache-Control"); got != cacheControl {
		t.Errorf("Cache-Control %q, want %q", got, cacheControl)
	}
	if got := strings.Join(h.Values("Vary"), ", "); !strings.Contains(got, "Accept-Encoding") || !strings.Contains(got, "Available-Dictionary") {
		t.Errorf("Vary %q, want Accept-Encoding and Available-Dictionary", got)
	}
}

// TestServeDeltasFallback: a request that does not offer dcz, or names
// a version malformed, unknown, past its time, or the value itself, gets
// what it would get without Policy.Deltas (the stored frame), and no
// error is told.
func TestServeDeltasFallback(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	var er errorRecorder
	c := mustNew[Channel](t, rdb, packcache.WithCodec(codec.ZstdDefault), packcache.WithPrefix("ch:", packcache.Policy{Deltas: time.Hour}), packcache.WithErrorHandler(er.handle))
	v1 := makeChannel(38, 64<<10)
	for _, key := range []string{"ch:a", "ch:old"} {
		if err := c.Set(ctx, key, v1); err != nil {
			t.Fatal(err)
		}
	}
	j1, _ := storedPlain(t, rdb, "ch:a")
	for _, key := range []string{"ch:a", "ch:old"} {
		serveOnce(c, key, "GET", "Accept-Encoding", chromiumAccept)
		waitVersion(t, rdb, key, j1)
	}
	// ch:old's v1 past its time: its record in the order field (FORMAT.md
	// section 10) ends in 1970.
	order := rdb.HGet(ctx, versionsKey("ch:old"), "order").Val()
	if len(order) != 79 {
		t.Fatalf("order field of %d bytes, want one record of 79", len(order))
	}
	rdb.HSet(ctx, versionsKey("ch:old"), "order", order[:64]+"000000000000001")
	v2 := withMessage(v1, "office hours are cancelled")
	for _, key := range []string{"ch:a", "ch:old"} {
		if err := c.Set(ctx, key, v2); err != nil {
			t.Fatal(err)
		}
	}
	j2, stored2 := storedPlain(t, rdb, "ch:a")
	sum := sha256.Sum256(j1)
	for _, tc := range []struct {
		name, key, accept string
		available         []string
	}{
		{"no dcz", "ch:a", "gzip, deflate, br, zstd", []string{dictionaryOf(j1)}},
		{"no Available-Dictionary", "ch:a", chromiumAccept, nil},
		{"not a byte sequence", "ch:a", chromiumAccept, []string{base64.StdEncoding.EncodeToString(sum[:])}},
		{"not base64", "ch:a", chromiumAccept, []string{":%%%:"}},
		{"16 bytes", "ch:a", chromiumAccept, []string{":" + base64.StdEncoding.EncodeToString(sum[:16]) + ":"}},
		{"unknown", "ch:a", chromiumAccept, []string{dictionaryOf([]byte("{}"))}},
		{"the value itself", "ch:a", chromiumAccept, []string{dictionaryOf(j2)}},
		{"past its time", "ch:old", chromiumAccept, []string{dictionaryOf(j1)}},
	} {
		hdr := []string{"Accept-Encoding", tc.accept}
		for _, a := range tc.available {
			hdr = append(hdr, "Available-Dictionary", a)
		}
		rec := serveOnce(c, tc.key, "GET", hdr...)
		if rec.Code != 200 || rec.Header().Get("Content-Encoding") != "zstd" || !bytes.Equal(rec.Body.Bytes(), stored2[1:]) {
			t.Errorf("%s: status %d, Content-Encoding %q, %d bytes; want the stored frame", tc.name, rec.Code, rec.Header().Get("Content-Encoding"), rec.Body.Len())
		}
		checkOffer(t, rec, "/ch\\\\:"+strings.TrimPrefix(tc.key, "ch:"), "max-age=3600")
	}
	if errs := er.take(); len(errs) != 0 {
		t.Errorf("the error handler was told %v", errs)
	}
}

// TestServeDeltasBounded: Redis keeps the last 4 versions of a key,
// whatever number Serve sent.
func TestServeDeltasBounded(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[Channel](t, rdb, packcache.WithCodec(codec.ZstdDefault), packcache.WithPrefix("ch:", packcache.Policy{Deltas: time.Hour}))
	ch := makeChannel(39, 8<<10)
	var plains [][]byte
	for i := range 6 {
		ch = withMessage(ch, "message "+strconv.Itoa(i))
		if err := c.Set(ctx, "ch:b", ch); err != nil {
			t.Fatal(err)
		}
		j, _ := storedPlain(t, rdb, "ch:b")
		plains = append(plains, j)
		serveOnce(c, "ch:b", "GET", "Accept-Encoding", chromiumAccept)
		waitVersion(t, rdb, "ch:b", j)
	}
	if n := rdb.HLen(ctx, versionsKey("ch:b")).Val(); n != 4+1 {
		t.Errorf("the versions' hash has %d fields, want 4 versions and the order", n)
	}
	for i, j := range plains {
		sum := sha256.Sum256(j)
		if kept := rdb.HExists(ctx, versionsKey("ch:b"), hex.EncodeToString(sum[:])).Val(); kept != (i >= 2) {
			t.Errorf("version %d kept: %v, want %v", i+1, kept, i >= 2)
		}
	}
}

// TestServeDeltasOff: without Policy.Deltas, a request naming a version
// gets the stored frame, no response offers a dictionary, Vary and
// Cache-Control are as they were, and nothing is written to Redis.
func TestServeDeltasOff(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[Channel](t, rdb, packcache.WithCodec(codec.ZstdDefault))
	v1 := makeChannel(40, 32<<10)
	if err := c.Set(ctx, "ch:off", v1); err != nil {
		t.Fatal(err)
	}
	j1, stored := storedPlain(t, rdb, "ch:off")
	for range 2 {
		rec := serveOnce(c, "ch:off", "GET", "Accept-Encoding", chromiumAccept, "Available-Dictionary", dictionaryOf(j1))
		checkHeaders(t, rec, "application/json")
		h := rec.Header()
		if h.Get("Content-Encoding") != "zstd" || !bytes.Equal(rec.Body.Bytes(), stored[1:]) || h.Get("Use-As-Dictionary") != "" || h.Get("Cache-Control") != "" {
			t.Errorf("headers %v, %d bytes", h, rec.Body.Len())
		}
	}
	if n := rdb.Exists(ctx, versionsKey("ch:off")).Val(); n != 0 {
		t.Errorf("versions kept without Deltas")
	}
}

// TestServeDeltasCacheControl: an application's own Cache-Control is
// kept.
func TestServeDeltasCacheControl(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	c := mustNew[Channel](t, rdb, packcache.WithPrefix("ch:", packcache.Policy{Deltas: time.Minute}))
	if err := c.Set(ctxT(t), "ch:cc", makeChannel(41, 4<<10)); err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest("GET", "/ch/cc", nil)
	req.Header.Set("Accept-Encoding", chromiumAccept)
	rec := httptest.NewRecorder()
	rec.Header().Set("Cache-Control", "private, max-age=30")
	c.Serve(rec, req, "ch:cc")
	checkOffer(t, rec, "/ch/cc", "private, max-age=30")
}

// TestServeDeltasCluster: on a Cluster as on one node, the versions of a
// key live in its hash slot (FORMAT.md section 10), for a key with a hash
// tag and one without, and a client holding v1 gets v2 as dcz from
// another cache instance.
func TestServeDeltasCluster(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		ctx := ctxT(t)
		deltas := packcache.WithPrefix("ch:", packcache.Policy{Deltas: time.Hour})
		c := mustNew[Channel](t, tg.Client, packcache.WithCodec(codec.ZstdDefault), deltas)
		other := mustNew[Channel](t, tg.Client, packcache.WithCodec(codec.ZstdDefault), deltas)
		for _, key := range []string{"ch:plain", "ch:{room}:7"} {
			v1 := makeChannel(42, 16<<10)
			if err := c.Set(ctx, key, v1); err != nil {
				t.Fatal(err)
			}
			j1, _ := storedPlain(t, tg.Client, key)
			serveOnce(c, key, "GET", "Accept-Encoding", chromiumAccept)
			vkey := "packcache:dcz:" + key
			if !strings.Contains(key, "}") {
				vkey = versionsKey(key)
			}
			sum := sha256.Sum256(j1)
			waitFor(t, 50*time.Second, "the version of "+key, func() bool {
				return tg.Client.HExists(ctx, vkey, hex.EncodeToString(sum[:])).Val()
			})
			if tg.Cluster != nil {
				slot := func(k string) int64 { return tg.Client.ClusterKeySlot(ctx, k).Val() }
				if slot(vkey) != slot(key) {
					t.Errorf("%s is in slot %d, its versions %s in %d", key, slot(key), vkey, slot(vkey))
				}
			}
			v2 := withMessage(v1, "see you on monday")
			if err := c.Set(ctx, key, v2); err != nil {
				t.Fatal(err)
			}
			j2, _ := storedPlain(t, tg.Client, key)
			rec := serveOnce(other, key, "GET", "Accept-Encoding", chromiumAccept, "Available-Dictionary", dictionaryOf(j1))
			if rec.Header().Get("Content-Encoding") != "dcz" || !bytes.Equal(undcz(t, rec.Body.Bytes(), j1), j2) {
				t.Errorf("%s: Content-Encoding %q, or the body is not v2", key, rec.Header().Get("Content-Encoding"))
			}
		}
	})
}

// BenchmarkServeDeltas: 16 clients at once (8 per GOMAXPROCS on this
// machine's 2) fetching a hot 128 KB channel through Serve with the near
// cache: "zstd" clients get the stored frame (Chromium's request without
// a dictionary), "dcz" clients hold v1 and get v2 as dcz. The rates
// compare as the bar asks (dcz at least half the rate of zstd);
// body-B/op is the body sent. Run
//
//	go test -run=NONE -bench=ServeDeltas -benchmem .
func BenchmarkServeDeltas(b *testing.B) {
	s := redistest.Start(b)
	rdb := s.Universal(b)
	ctx := context.Background()
	c := mustNew[Channel](b, rdb, packcache.WithCodec(codec.ZstdDefault), packcache.WithLocalCache(packcache.LocalCache{}),
		packcache.WithPrefix("ch:", packcache.Policy{Deltas: time.Hour}))
	v1 := makeChannel(37, 150<<10)
	if err := c.Set(ctx, "ch:hot", v1); err != nil {
		b.Fatal(err)
	}
	raw1, err := rdb.Get(ctx, "ch:hot").Bytes()
	if err != nil {
		b.Fatal(err)
	}
	j1, _ := codec.DecodeValue(nil, raw1, 64<<20)
	serveOnce(c, "ch:hot", "GET", "Accept-Encoding", chromiumAccept)
	sum := sha256.Sum256(j1)
	if !eventually(time.Minute, func() bool {
		return rdb.HExists(ctx, versionsKey("ch:hot"), hex.EncodeToString(sum[:])).Val()
	}) {
		b.Fatal("v1 not kept in Redis")
	}
	if err := c.Set(ctx, "ch:hot", withMessage(v1, "one message more")); err != nil {
		b.Fatal(err)
	}
	if !eventually(time.Minute, func() bool {
		before := c.Stats().NearHits
		serveOnce(c, "ch:hot", "GET", "Accept-Encoding", chromiumAccept, "Available-Dictionary", dictionaryOf(j1))
		return c.Stats().NearHits > before
	}) {
		b.Fatal("the near cache does not serve")
	}
	for _, tc := range []struct {
		name   string
		header []string
	}{
		{"zstd", []string{"Accept-Encoding", chromiumAccept}},
		{"dcz", []string{"Accept-Encoding", chromiumAccept, "Available-Dictionary", dictionaryOf(j1)}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var body atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(max(16/runtime.GOMAXPROCS(0), 1))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					rec := serveOnce(c, "ch:hot", "GET", tc.header...)
					if rec.Code != 200 || rec.Header().Get("Content-Encoding") != tc.name {
						b.Errorf("status %d, Content-Encoding %q", rec.Code, rec.Header().Get("Content-Encoding"))
						return
					}
					body.Add(int64(rec.Body.Len()))
				}
			})
			b.ReportMetric(float64(body.Load())/float64(b.N), "body-B/op")
		})
	}
}

// blockHook holds every command of a name until release is closed.
type blockHook struct {
	name    string
	release chan struct{}
	held    atomic.Int64
}

func (h *blockHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *blockHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.EqualFold(cmd.Name(), h.name) {
			h.held.Add(1)
			<-h.release
		}
		return next(ctx, cmd)
	}
}
func (h *blockHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestServeDeltasBackground: the first Serve of a version returns
// without waiting for the version's write, which is made in the
// background and lands in Redis once Redis answers.
func TestServeDeltasBackground(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	hold := &blockHook{name: "evalsha", release: make(chan struct{})}
	rdb.AddHook(hold)
	c := mustNew[Channel](t, rdb, packcache.WithCodec(codec.ZstdDefault), packcache.WithPrefix("ch:", packcache.Policy{Deltas: time.Hour}))
	if err := c.Set(ctx, "ch:bg", makeChannel(43, 16<<10)); err != nil {
		t.Fatal(err)
	}
	j, _ := storedPlain(t, rdb, "ch:bg")
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- serveOnce(c, "ch:bg", "GET", "Accept-Encoding", chromiumAccept) }()
	select {
	case rec := <-done:
		if rec.Code != 200 || rec.Header().Get("Use-As-Dictionary") == "" {
			t.Errorf("status %d, Use-As-Dictionary %q", rec.Code, rec.Header().Get("Use-As-Dictionary"))
		}
	case <-time.After(50 * time.Second):
		close(hold.release)
		t.Fatal("Serve waited for the version's write")
	}
	waitFor(t, 50*time.Second, "the version's write begun", func() bool { return hold.held.Load() > 0 })
	close(hold.release)
	waitVersion(t, rdb, "ch:bg", j)
}

// TestServeDeltasScriptFlush: a SCRIPT FLUSH (a restart, a failover)
// before the versions' write and before their read costs each one EVAL,
// never a lost version or delta.
func TestServeDeltasScriptFlush(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	var er errorRecorder
	c := mustNew[Channel](t, rdb, packcache.WithCodec(codec.ZstdDefault), packcache.WithPrefix("ch:", packcache.Policy{Deltas: time.Hour}),
		packcache.WithErrorHandler(er.handle))
	v1 := makeChannel(44, 16<<10)
	if err := c.Set(ctx, "ch:sf", v1); err != nil {
		t.Fatal(err)
	}
	j1, _ := storedPlain(t, rdb, "ch:sf")
	rdb.ScriptFlush(ctx)
	serveOnce(c, "ch:sf", "GET", "Accept-Encoding", chromiumAccept)
	waitVersion(t, rdb, "ch:sf", j1)
	if err := c.Set(ctx, "ch:sf", withMessage(v1, "flushed")); err != nil {
		t.Fatal(err)
	}
	j2, _ := storedPlain(t, rdb, "ch:sf")
	rdb.ScriptFlush(ctx)
	rec := serveOnce(c, "ch:sf", "GET", "Accept-Encoding", chromiumAccept, "Available-Dictionary", dictionaryOf(j1))
	if rec.Header().Get("Content-Encoding") != "dcz" || !bytes.Equal(undcz(t, rec.Body.Bytes(), j1), j2) {
		t.Errorf("after SCRIPT FLUSH: Content-Encoding %q, or not v2", rec.Header().Get("Content-Encoding"))
	}
	if errs := er.take(); len(errs) != 0 {
		t.Errorf("the error handler was told %v", errs)
	}
}

// failHook fails every command of a name with args arguments.
type failHook struct {
	name string
	args int
}

func (h failHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h failHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.EqualFold(cmd.Name(), h.name) && len(cmd.Args()) == h.args {
			err := errors.New("ERR injected")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}
func (h failHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestServeDeltasRedisFails: a read of the versions that fails is no
// failed response: the request gets what it would without a delta, and
// the error handler is told, naming the versions' key.
func TestServeDeltasRedisFails(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	var er errorRecorder
	c := mustNew[Channel](t, rdb, packcache.WithCodec(codec.ZstdDefault), packcache.WithPrefix("ch:", packcache.Policy{Deltas: time.Hour}),
		packcache.WithErrorHandler(er.handle))
	v1 := makeChannel(45, 16<<10)
	if err := c.Set(ctx, "ch:rf", v1); err != nil {
		t.Fatal(err)
	}
	j1, _ := storedPlain(t, rdb, "ch:rf")
	serveOnce(c, "ch:rf", "GET", "Accept-Encoding", chromiumAccept)
	waitVersion(t, rdb, "ch:rf", j1)
	if err := c.Set(ctx, "ch:rf", withMessage(v1, "no delta today")); err != nil {
		t.Fatal(err)
	}
	_, stored := storedPlain(t, rdb, "ch:rf")
	rdb.AddHook(failHook{name: "evalsha", args: 5}) // the versions' read: EVALSHA, its SHA, 1, the key, the SHA-256
	rec := serveOnce(c, "ch:rf", "GET", "Accept-Encoding", chromiumAccept, "Available-Dictionary", dictionaryOf(j1))
	if rec.Code != 200 || rec.Header().Get("Content-Encoding") != "zstd" || !bytes.Equal(rec.Body.Bytes(), stored[1:]) {
		t.Errorf("status %d, Content-Encoding %q; want 200 and the stored frame", rec.Code, rec.Header().Get("Content-Encoding"))
	}
	errs := er.take()
	if len(errs) != 1 || !errors.Is(errs[0], packcache.ErrRedis) || !strings.Contains(errs[0].Error(), versionsKey("ch:rf")) {
		t.Errorf("the error handler was told %v; want one Redis error naming %s", errs, versionsKey("ch:rf"))
	}
}
