package main

// rueidis (github.com/redis/rueidis) with its client-side caching
// (DoCache), and rueidisaside (its cache-aside client, a read-through Get
// with a loader over the same client-side caching), as peers of packcache
// in the peers, near and cost suites.
//
// Both store exactly what packcache stores: packcache.JSON, compressed
// with zstd behind packcache's header byte when it is over
// DefaultCompressAbove and compression saves a byte, plain otherwise
// (encodeStored). Their client-side cache keeps the reply (those stored
// bytes) per connection, invalidated by Redis CLIENT TRACKING; each Get
// decodes it again (zstd and packcache.JSON), as the hand-written peer
// (b) and go-redis/cache + TinyLFU do, where packcache's near cache and
// share window hand out a decoded value they keep.

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidisaside"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
)

// Names of the rueidis subjects in the peers table and in the near suite.
const (
	pRueidis = "(e) rueidis DoCache"
	pAside   = "(e) rueidisaside Get"
	nRueidis = "rueidis DoCache"
	nAside   = "rueidisaside Get"
)

// notLikeForLike begins the note under a table whose rows do not do the
// same work.
const notLikeForLike = "> **Not like for like:**"

// rueidisVersion names the rueidis modules this binary was built with.
func rueidisVersion() string {
	v := map[string]string{}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			v[d.Path] = d.Version
		}
	}
	return fmt.Sprintf("%s, rueidisaside %s", v["github.com/redis/rueidis"], v["github.com/redis/rueidis/rueidisaside"])
}

// rueidisTTL is the client-side TTL of DoCache and rueidisaside's ttl,
// the TTL of nearLocal and of go-redis/cache's TinyLFU. rueidisaside also
// stores the values its loader returns with it (SET PX).
const rueidisTTL = time.Minute

// asideClientTTL is rueidisaside's ClientTTL, the TTL of its client
// marker (rueidisid:<random>), which it refreshes every ClientTTL/2 by a
// SET: an hour, not the default 10 s, so that no refresh falls in another
// subject's INFO commandstats counts (packcache's cold surge target counts
// SETs).
const asideClientTTL = time.Hour

// rueidisOption is the rueidis client option every rueidis subject uses:
// RESP3 and CLIENT TRACKING ON OPTIN (DoCache sends CLIENT CACHING YES
// with each read of Redis), rueidis's defaults, which Redis 6.0 and later
// have. CLIENT SETINFO is Redis 7.2's, so it is not sent. The time-outs are
// those of packbench's go-redis client.
func rueidisOption(addr string) rueidis.ClientOption {
	return rueidis.ClientOption{
		InitAddress:       []string{addr},
		ForceSingleClient: true, // no CLUSTER SLOTS probe
		ClientSetInfo:     rueidis.DisableClientSetInfo,
		ConnWriteTimeout:  30 * time.Second,
	}
}

// countingClient is a rueidis.Client that counts DoCache's answers: from
// the client-side cache (hits) or from Redis (misses).
type countingClient struct {
	rueidis.Client
	hits, misses atomic.Uint64
}

func (c *countingClient) DoCache(ctx context.Context, cmd rueidis.Cacheable, ttl time.Duration) rueidis.RedisResult {
	r := c.Client.DoCache(ctx, cmd, ttl)
	if r.IsCacheHit() {
		c.hits.Add(1)
	} else {
		c.misses.Add(1)
	}
	return r
}

// encodeStored returns what packcache default stores for v.
func encodeStored(v Channel) ([]byte, error) {
	b, err := packcache.JSON.Marshal(nil, &v)
	if err != nil {
		return nil, err
	}
	if len(b) > (1024) {
		z, err := codec.AppendValue(make([]byte, 0, len(b)/2), codec.Zstd, b)
		if err != nil {
			return nil, err
		}
		if len(z)+1 <= len(b) {
			return z, nil
		}
	}
	return b, nil
}

// decodeStored decodes b, a value in packcache's format, which it does not
// modify: b may be rueidis's cached reply, shared by every Get.
func decodeStored(b []byte) (Channel, error) {
	var v Channel
	buf := zbufs.Get().(*[]byte)
	defer zbufs.Put(buf)
	out, err := codec.DecodeValue((*buf)[:0], b, (64 << 20))
	if err != nil {
		return v, err
	}
	if len(b) > 0 && codec.IsHeader(b[0]) {
		*buf = out[:0] // out is b itself when b is plain
	}
	return v, packcache.JSON.Unmarshal(out, &v)
}

// rueidisSet SETs v, as packcache stores it, for an hour.
func rueidisSet(ctx context.Context, c rueidis.Client, key string, v Channel) error {
	b, err := encodeStored(v)
	if err != nil {
		return err
	}
	return c.Do(ctx, c.B().Set().Key(key).Value(rueidis.BinaryString(b)).Ex(time.Hour).Build()).Error()
}

// rueidisPeer reads with DoCache (GET, client-side cached for rueidisTTL)
// and decodes every answer; its read-through Get is the hand-written
// one's: on a miss, load and SET.
func rueidisPeer(e *env, name string, ch Channel) (*peer, error) {
	rc, err := rueidis.NewClient(rueidisOption(e.addr))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	c := &countingClient{Client: rc}
	p := &peer{name: name, loads: new(atomic.Int64), decodes: new(atomic.Int64), csc: c, close: rc.Close}
	p.set = func(ctx context.Context, key string, v Channel) error { return rueidisSet(ctx, c, key, v) }
	p.get = func(ctx context.Context, key string) (Channel, error) {
		b, err := c.DoCache(ctx, c.B().Get().Key(key).Cache(), rueidisTTL).AsBytes()
		if err != nil {
			return Channel{}, err
		}
		p.decodes.Add(1)
		return decodeStored(b)
	}
	p.through = func(ctx context.Context, key string) error {
		_, err := p.get(ctx, key)
		if rueidis.IsRedisNil(err) {
			p.loads.Add(1)
			time.Sleep(loaderDelay)
			return p.set(ctx, key, ch)
		}
		return err
	}
	p.del = func(ctx context.Context, key string) error {
		return c.Do(ctx, c.B().Del().Key(key).Build()).Error()
	}
	return p, nil
}

// asidePeer reads with rueidisaside's Get (DoCache underneath): without a
// loader for get, with one for the read-through Get; it decodes every
// answer. rueidisaside has no Set: a writer SETs the key, here through
// the aside client's own rueidis client.
func asidePeer(e *env, name string, ch Channel) (*peer, error) {
	c := &countingClient{}
	ca, err := rueidisaside.NewClient(rueidisaside.ClientOption{
		ClientOption: rueidisOption(e.addr),
		ClientTTL:    asideClientTTL,
		ClientBuilder: func(opt rueidis.ClientOption) (rueidis.Client, error) {
			rc, err := rueidis.NewClient(opt)
			if err != nil {
				return nil, err
			}
			c.Client = rc
			return c, nil
		},
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &peer{name: name, loads: new(atomic.Int64), decodes: new(atomic.Int64), csc: c, close: ca.Close}
	loader := func(ctx context.Context, key string) (string, error) {
		p.loads.Add(1)
		time.Sleep(loaderDelay)
		b, err := encodeStored(ch)
		return rueidis.BinaryString(b), err
	}
	get := func(ctx context.Context, key string, fn func(context.Context, string) (string, error)) (Channel, error) {
		s, err := ca.Get(ctx, rueidisTTL, key, fn)
		if err != nil {
			return Channel{}, err
		}
		p.decodes.Add(1)
		// The string's bytes, not a copy, as RedisResult.AsBytes gives.
		return decodeStored(unsafe.Slice(unsafe.StringData(s), len(s)))
	}
	p.set = func(ctx context.Context, key string, v Channel) error { return rueidisSet(ctx, c, key, v) }
	p.get = func(ctx context.Context, key string) (Channel, error) { return get(ctx, key, nil) }
	p.through = func(ctx context.Context, key string) error {
		v, err := get(ctx, key, loader)
		if err == nil && len(v.Messages) != len(ch.Messages) {
			err = errors.New("wrong value")
		}
		return err
	}
	p.del = func(ctx context.Context, key string) error { return ca.Del(ctx, key) }
	return p, nil
}

// rueidisGetSubject is a rueidis peer as a subject of the near suite's
// Get/s and latency measurements; its near hits are DoCache's answers from
// the client-side cache.
func rueidisGetSubject(p *peer, name string) *getSubject {
	return &getSubject{name: name, set: p.set, get: p.get, del: p.del, hits: p.csc.hits.Load, near: true, close: p.close,
		refill: func(get func() error) error { return awaitRefill(get, p.csc) }}
}

// awaitRefill waits for the client-side cache to hold what Redis holds
// now, after a write: for a Get answered by Redis (the write's
// invalidation has arrived, or the key was not cached), then for one
// answered by the cache.
func awaitRefill(get func() error, c *countingClient) error {
	deadline := time.Now().Add(nearWait)
	for m0 := c.misses.Load(); c.misses.Load() == m0; {
		if err := get(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no read of Redis within %v of a write: invalidations (CLIENT TRACKING) did not arrive", nearWait)
		}
		time.Sleep(100 * time.Microsecond)
	}
	return awaitNear(get, c.hits.Load)
}

// rueidisNearSurgeSubject makes a rueidis peer a subject of the near suite's warm
// surge: the key is in its client-side cache before the release.
func (p *peer) rueidisNearSurgeSubject(ch Channel) *surgeSubject {
	s := p.surgeSubject(ch)
	s.close = p.close
	s.nearHits = p.csc.hits.Load
	store := s.prepare
	s.prepare = func(ctx context.Context, key string, warm bool) error {
		if err := store(ctx, key, warm); err != nil || !warm {
			return err
		}
		return awaitRefill(func() error { return s.get(ctx, key) }, p.csc)
	}
	return s
}

// rueidisMisses are the cost suite's rueidis subjects of a miss: by hand
// (DoCache GET, then compress and SET) and rueidisaside's Get with a
// loader returning the stored bytes at once. Each miss f makes uses a key
// of its own, from next.
type rueidisMisses struct {
	hand, aside func() error
	close       func()
}

func newRueidisMisses(ctx context.Context, e *env, di int, doc []byte, next func() string) (*rueidisMisses, error) {
	rc, err := rueidis.NewClient(rueidisOption(e.addr))
	if err != nil {
		return nil, fmt.Errorf("rueidis: %w", err)
	}
	ca, err := rueidisaside.NewClient(rueidisaside.ClientOption{ClientOption: rueidisOption(e.addr), ClientTTL: asideClientTTL})
	if err != nil {
		rc.Close()
		return nil, fmt.Errorf("rueidisaside: %w", err)
	}
	stored := func() ([]byte, error) { return codec.AppendValue(nil, codec.Zstd, doc) }
	m := &rueidisMisses{close: func() { ca.Close(); rc.Close() }}
	m.hand = func() error {
		k := e.key("miss", "rueidis", fmt.Sprint(di), next())
		if err := rc.DoCache(ctx, rc.B().Get().Key(k).Cache(), rueidisTTL).Error(); !rueidis.IsRedisNil(err) {
			return fmt.Errorf("rueidis: DoCache GET of an absent key: %v", err)
		}
		b, err := stored()
		if err != nil {
			return err
		}
		return rc.Do(ctx, rc.B().Set().Key(k).Value(rueidis.BinaryString(b)).Ex(time.Hour).Build()).Error()
	}
	m.aside = func() error {
		k := e.key("miss", "aside", fmt.Sprint(di), next())
		loaded := false
		_, err := ca.Get(ctx, rueidisTTL, k, func(context.Context, string) (string, error) {
			loaded = true
			b, err := stored()
			return rueidis.BinaryString(b), err
		})
		if err == nil && !loaded {
			err = errors.New("rueidisaside: the loader did not run for an absent key")
		}
		return err
	}
	return m, nil
}
