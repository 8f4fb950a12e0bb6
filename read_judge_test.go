package packcache

// Table tests of a read's pure decisions (read.go), without Redis: judge,
// what a reply from Redis means, and rule, what a read does with that,
// for every state of a reply, with a loader (read-through) and without.

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
)

type unitDoc struct {
	ID string `json:"id"`
}

// unitCache is the core of a Cache[unitDoc] whose Redis client cannot
// reach a server: a dial, which no test of a pure decision may make,
// fails the test. errs counts the errors the cache reports to its
// handler (WithErrorHandler).
func unitCache(t *testing.T, opts ...Option) (c *cache, errs *atomic.Int64) {
	t.Helper()
	var dials atomic.Int64
	rdb := redis.NewClient(&redis.Options{
		Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1,
		Dialer: func(context.Context, string, string) (net.Conn, error) {
			dials.Add(1)
			return nil, errors.New("no Redis in a unit test")
		},
	})
	errs = new(atomic.Int64)
	opts = append(opts, WithErrorHandler(func(context.Context, string, error) { errs.Add(1) }))
	cc, err := New[unitDoc](rdb, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		rdb.Close()
		if n := dials.Load(); n != 0 {
			t.Errorf("%d dials of Redis: a pure decision's test must not reach Redis", n)
		}
	})
	return cc.core, errs
}

// storedForm is v as a Set under key stores it in Redis.
func storedForm(t *testing.T, c *cache, key string, v unitDoc) string {
	t.Helper()
	e, err := c.form.encode(context.Background(), "set", key, c.pols.of(key), &v)
	if err != nil {
		t.Fatal(err)
	}
	defer e.release()
	return string(e.stored)
}

func envelope(t *testing.T, env codec.Envelope, inner string) string {
	t.Helper()
	b, err := codec.AppendEnvelope(nil, env, []byte(inner))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestJudgeAndRule: each state of a reply, judged by a reader with a
// loader and without, gives one verdict, and rule's answer to it: serve,
// fail with which error, or load. The policy keeps values a minute past
// their hour's TTL (StaleFor) and refreshes them after 30 minutes; the
// "plain" rows use a policy with neither.
func TestJudgeAndRule(t *testing.T) {
	t.Parallel()
	const key = "k"
	c, _ := unitCache(t, WithTTL(time.Hour), WithPrefix("", Policy{StaleFor: time.Minute, RefreshAfter: 30 * time.Minute}))
	plain, _ := unitCache(t, WithTTL(time.Hour))
	value := storedForm(t, c, key, unitDoc{ID: "v"})
	lease := string(codec.HeaderLease) + "lease-token"
	tombstone := string([]byte{codec.HeaderTombstone})
	grouped := envelope(t, codec.Envelope{Groups: []string{"g"}, Seq: 1, TTL: 2 * time.Hour}, value)
	env := func(check groupCheck, inner string) *groupedReply {
		return &groupedReply{env: codec.Envelope{Groups: []string{"g"}, Seq: 1, TTL: 2 * time.Hour}, inner: inner, check: check, checked: 5}
	}
	failed := keyErr("get", key, redisErr(io.ErrUnexpectedEOF))      // sent, no answer: it may have run
	open := keyErr("get", key, &kindError{ErrRedis, ErrCircuitOpen}) // never sent
	refused := keyErr("get", key, redisErr(redis.ErrClosed))         // the client's own refusal
	groupsDown := keyErr("get", key, redisErr(errors.New("groups: no answer")))
	sent := time.Now()

	type outcome struct {
		load bool
		err  error // errors.Is; nil: none
	}
	serve, miss := outcome{}, outcome{err: ErrMiss}
	load := outcome{load: true}
	for _, tc := range []struct {
		name  string
		plain bool // the policy without StaleFor and RefreshAfter
		// uncounted: an undecodable value that DecodeErrors does not
		// count (judgeGrouped's "not reached" case, as found).
		uncounted bool
		rp        reply
		v         verdict
		without   outcome // rule, without a loader
		with      outcome // rule, with one
		check     func(t *testing.T, j judgement, readThrough bool)
	}{
		{name: "absent", rp: reply{err: redis.Nil, left: -1}, v: vMiss, without: miss, with: load},
		{name: "absent, the read placed its lease", rp: reply{err: redis.Nil, left: -1, lease: "L", placed: true}, v: vMiss, without: miss, with: load,
			check: func(t *testing.T, j judgement, _ bool) {
				if j.placed != "L" {
					t.Errorf("placed %q, want the read's lease", j.placed)
				}
			}},
		{name: "past StaleFor (Redis has let it go)", rp: reply{err: redis.Nil, left: -1}, v: vMiss, without: miss, with: load},
		{name: "value", rp: reply{s: value, left: 59 * time.Minute, sent: sent}, v: vHit, without: serve, with: serve,
			check: func(t *testing.T, j judgement, _ bool) {
				if d, ok := j.r.val.(*unitDoc); !ok || d.ID != "v" || j.refresh || j.digest != "" {
					t.Errorf("value %v, refresh %v, digest %q; want the value, no refresh, no digest", j.r.val, j.refresh, j.digest)
				}
				if want := sent.Add(59 * time.Minute); !j.expires.Equal(want) || j.r.expires != want.UnixNano() || j.left != 59*time.Minute {
					t.Errorf("expires %v (result %d), left %v; want %v from when the read was sent", j.expires, j.r.expires, j.left, want)
				}
				if j.r.stored != value {
					t.Error("the result does not keep the stored bytes (for Serve)")
				}
			}},
		{name: "value, no expiry known", rp: reply{s: value, left: -1}, v: vHit, without: serve, with: serve,
			check: func(t *testing.T, j judgement, _ bool) {
				if !j.expires.IsZero() || j.r.expires != 0 || j.refresh {
					t.Errorf("expires %v (result %d), refresh %v; want none", j.expires, j.r.expires, j.refresh)
				}
			}},
		{name: "value due for refresh", rp: reply{s: value, left: 20 * time.Minute, sent: sent}, v: vHit, without: serve, with: serve,
			check: func(t *testing.T, j judgement, readThrough bool) {
				if j.refresh != readThrough || (j.digest == digest(value)) != readThrough {
					t.Errorf("refresh %v, digest %q; want both only with a loader", j.refresh, j.digest)
				}
			}},
		{name: "stale within StaleFor", rp: reply{s: value, left: 30 * time.Second, sent: sent}, v: vStale, without: miss, with: load,
			check: func(t *testing.T, j judgement, readThrough bool) {
				if d, ok := j.r.val.(*unitDoc); !ok || d.ID != "v" {
					t.Errorf("stale value %v, want the stored one (to fall back on)", j.r.val)
				}
				if (j.digest == digest(value)) != readThrough {
					t.Errorf("digest %q with readThrough %v", j.digest, readThrough)
				}
			}},
		{name: "stale, at the end of StaleFor", rp: reply{s: value, left: time.Minute, sent: sent}, v: vStale, without: miss, with: load},
		{name: "stale, expiring now", rp: reply{s: value, left: 0, sent: sent}, v: vStale, without: miss, with: load},
		{name: "plain policy, expiring now", plain: true, rp: reply{s: value, left: 0, sent: sent}, v: vHit, without: serve, with: serve},
		{name: "another's lease", rp: reply{s: lease, left: -1}, v: vLease, without: miss, with: load,
			check: func(t *testing.T, j judgement, _ bool) {
				if j.lease != lease {
					t.Errorf("lease %q, want %q", j.lease, lease)
				}
			}},
		{name: "tombstone (not found)", rp: reply{s: tombstone, left: -1}, v: vTombstone, without: outcome{err: ErrNotFound}, with: outcome{err: ErrNotFound}},
		{name: "undecodable: unknown header", rp: reply{s: "\x06\x01\x02", left: -1}, v: vUndecodable, without: outcome{err: ErrUnknownHeader}, with: load,
			check: func(t *testing.T, j judgement, readThrough bool) {
				var e *Error
				if !errors.As(j.err, &e) || e.Key != key {
					t.Errorf("error %v does not name the key", j.err)
				}
				if (j.digest == digest("\x06\x01\x02")) != readThrough {
					t.Errorf("digest %q with readThrough %v: a reload is guarded by the bytes it replaces", j.digest, readThrough)
				}
			}},
		{name: "undecodable: not the serializer's", rp: reply{s: `{"id":`, left: -1}, v: vUndecodable, without: outcome{err: ErrSerialization}, with: load},
		{name: "Redis failed after sending", rp: reply{err: failed, left: -1, lease: "L"}, v: vUnavailable, without: outcome{err: ErrRedis}, with: load,
			check: func(t *testing.T, j judgement, _ bool) {
				if j.unsure != "L" {
					t.Errorf("unsure %q: a lease sent without an answer may land", j.unsure)
				}
			}},
		{name: "breaker open", rp: reply{err: open, left: -1, lease: "L"}, v: vUnavailable, without: outcome{err: ErrCircuitOpen}, with: load,
			check: func(t *testing.T, j judgement, _ bool) {
				if j.unsure != "" {
					t.Errorf("unsure %q for a read never sent", j.unsure)
				}
			}},
		{name: "client closed", rp: reply{err: refused, left: -1}, v: vUnavailable, without: outcome{err: ErrRedis}, with: load},
		{name: "caller cancelled", rp: reply{err: context.Canceled, left: -1, lease: "L"}, v: vCancelled, without: outcome{err: context.Canceled}, with: outcome{err: context.Canceled},
			check: func(t *testing.T, j judgement, _ bool) {
				if j.unsure != "L" {
					t.Errorf("unsure %q, want the lease sent", j.unsure)
				}
			}},
		{name: "envelope, groups current", rp: reply{s: grouped, left: 59 * time.Minute, sent: sent, grouped: env(groupsCurrent, value)}, v: vHit, without: serve, with: serve,
			check: func(t *testing.T, j judgement, readThrough bool) {
				if d, ok := j.r.val.(*unitDoc); !ok || d.ID != "v" {
					t.Errorf("value %v, want the one inside", j.r.val)
				}
				if len(j.groups) != 1 || j.groups[0] != "g" || j.r.checked != 5 || !j.r.unshared || j.ttl != 2*time.Hour {
					t.Errorf("groups %v, checked %d, unshared %v, ttl %v; want [g], 5, true, the envelope's 2h", j.groups, j.r.checked, j.r.unshared, j.ttl)
				}
				// With the envelope's 2h TTL, 59 minutes left is past the
				// 30 minutes' refresh: the digest is the envelope's.
				if j.refresh != readThrough || (j.digest == digest(grouped)) != readThrough {
					t.Errorf("refresh %v, digest %q; want both only with a loader, of the whole stored value", j.refresh, j.digest)
				}
			}},
		{name: "envelope, group invalidated", rp: reply{s: grouped, left: -1, grouped: env(groupsInvalid, value)}, v: vInvalid, without: miss, with: load,
			check: func(t *testing.T, j judgement, readThrough bool) {
				if (j.digest == digest(grouped)) != readThrough {
					t.Errorf("digest %q with readThrough %v", j.digest, readThrough)
				}
			}},
		{name: "envelope, group invalidation owed", rp: reply{s: grouped, left: -1, grouped: env(groupsOwed, value)}, v: vOwed, without: miss, with: load},
		{name: "envelope, groups not checked", rp: reply{s: grouped, left: -1, grouped: func() *groupedReply { g := env(groupsFailed, value); g.cerr = groupsDown; return g }()}, v: vUnavailable, without: outcome{err: ErrRedis}, with: load,
			check: func(t *testing.T, j judgement, _ bool) {
				if j.err != groupsDown {
					t.Errorf("error %v, want the groups check's", j.err)
				}
			}},
		{name: "envelope holding a tombstone", rp: reply{s: grouped, left: -1, grouped: env(groupsCurrent, tombstone)}, v: vTombstone, without: outcome{err: ErrNotFound}, with: outcome{err: ErrNotFound}},
		{name: "envelope holding a lease", rp: reply{s: grouped, left: -1, grouped: env(groupsCurrent, lease)}, uncounted: true, v: vUndecodable, without: outcome{err: codec.ErrEnvelope}, with: load},
		{name: "envelope malformed", rp: reply{s: grouped, left: -1, grouped: &groupedReply{err: codec.ErrEnvelope}}, v: vUndecodable, without: outcome{err: codec.ErrEnvelope}, with: load},
		{name: "envelope not parsed", rp: reply{s: grouped, left: -1}, v: vUndecodable, without: outcome{err: codec.ErrEnvelope}, with: load},
	} {
		for _, readThrough := range []bool{false, true} {
			cc := c
			if tc.plain {
				cc = plain
			}
			rp := tc.rp
			p := cc.pols.of(key)
			decodeErrs := p.stats.DecodeErrors
			j := cc.form.judge(key, p, rp, readThrough)
			if j.v != tc.v {
				t.Errorf("%s, readThrough %v: verdict %d, want %d", tc.name, readThrough, j.v, tc.v)
				continue
			}
			if tc.check != nil {
				tc.check(t, j, readThrough)
			}
			if undecodable := p.stats.DecodeErrors != decodeErrs; undecodable != (tc.v == vUndecodable && !tc.uncounted) {
				t.Errorf("%s: DecodeErrors counted %v", tc.name, undecodable)
			}
			want := tc.without
			if readThrough {
				want = tc.with
			}
			ld, err := cc.rule(context.Background(), key, j, readThrough)
			if ld != want.load || (want.err == nil) != (err == nil) || want.err != nil && !errors.Is(err, want.err) {
				t.Errorf("%s, readThrough %v: rule = load %v, %v; want load %v, %v", tc.name, readThrough, ld, err, want.load, want.err)
			}
		}
	}
}

// TestRuleStrictRedis: with WithStrictRedis, a read-through read whose
// Redis failed returns the failure instead of loading; nothing else
// changes. An undecodable value is reported to the error handler as it
// is reloaded, and only then.
func TestRuleStrictRedis(t *testing.T) {
	t.Parallel()
	strict, _ := unitCache(t, WithStrictRedis())
	lax, errs := unitCache(t)
	down := judgement{v: vUnavailable, err: keyErr("get", "k", redisErr(io.ErrUnexpectedEOF))}
	if ld, err := strict.rule(context.Background(), "k", down, true); ld || !errors.Is(err, ErrRedis) {
		t.Errorf("strict, Redis failed: load %v, %v; want ErrRedis", ld, err)
	}
	if ld, err := lax.rule(context.Background(), "k", down, true); !ld || err != nil {
		t.Errorf("not strict, Redis failed: load %v, %v; want a load", ld, err)
	}
	for _, v := range []verdict{vHit, vStale, vTombstone, vLease, vMiss, vUndecodable, vOwed, vInvalid} {
		j := judgement{v: v, err: keyErr("get", "k", ErrCorrupt)}
		ls, es := strict.rule(context.Background(), "k", j, true)
		ll, el := lax.rule(context.Background(), "k", j, true)
		if ls != ll || !errors.Is(es, el) && (es != nil || el != nil) {
			t.Errorf("verdict %d: strict says load %v, %v; not strict load %v, %v", v, ls, es, ll, el)
		}
	}
	errs.Store(0)
	undecodable := judgement{v: vUndecodable, err: keyErr("get", "k", ErrCorrupt)}
	lax.rule(context.Background(), "k", undecodable, false)
	if n := errs.Load(); n != 0 {
		t.Errorf("an undecodable value read without a loader was reported %d times: its error is the caller's", n)
	}
	lax.rule(context.Background(), "k", undecodable, true)
	if n := errs.Load(); n != 1 {
		t.Errorf("an undecodable value reloaded was reported %d times, want 1", n)
	}
}
