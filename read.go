package packcache

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/httpenc"
	"github.com/packcache/packcache/internal/singleflight"
)

// A read, in call order, once its prologue has run (getOne, cache.go):
// get answers from the near cache or a read of the key still shared
// (fast); else it joins or starts the shared read (a singleflight.Group),
// whose work is flight.Run: fetch the key (roundtrip.go), judge what
// Redis holds, and act on the judgement by rule: serve it, fail, or load
// (loader.go). count counts the caller's outcome and value hands it its
// value.

// get is Get, GetOrLoad and Serve, with ld the loader (nil: none): the
// caller's result, counted, into r, for the caller to hand out in its own
// form (Get's is value's). Results pass by pointer: a near hit copies
// none.
func (c *cache) get(ctx context.Context, key string, p *policy, ld loadOne, r *result) error {
	if err := ctx.Err(); err != nil {
		// Already over: no read, no load, nothing counted, as in the
		// batch calls.
		return err
	}
	since := c.groups.checks.Load()
	for {
		err, shared := c.getOnce(ctx, key, p, ld, r)
		if err != nil || !r.lateFor(since) {
			return c.tel.count(p, r, err, shared)
		}
		// A grouped value that a load checked before this call began:
		// read again. The call it came from has finished and is not
		// held, so this joins none that checked before it began but one
		// still under way, and those are finite.
		*r = result{}
	}
}

// getOnce is one attempt of get: the caller's result into r, and whether
// it shared work another began.
func (c *cache) getOnce(ctx context.Context, key string, p *policy, ld loadOne, r *result) (err error, shared bool) {
	if c.owed.Has(key) {
		// What Redis holds may be what a failed write meant to replace.
		*r, err = c.act(ctx, flight{c: c, key: key, p: p, ld: ld}, judgement{v: vOwed})
		return err, r.joined
	}
	if err, ok := c.fast(ctx, key, p, ld != nil, r); ok {
		return err, r.from != fromNear
	}
	f := flight{c: c, key: key, p: p, ld: ld}
	if !c.coalesce {
		*r, err = f.Run(ctx, nil)
		return err, false
	}
	g := &c.lookups
	if ld != nil {
		g = &c.reads
	}
	*r, err, shared = g.Do(ctx, key, f) // f.Joining counts a shared read
	return err, shared
}

// result is what shared work hands its callers.
type result struct {
	val   any    // a *T; nil for none
	data  []byte // the serialized value, when each caller decodes its own
	size  int    // the serialized value's length, when decoded from Redis
	from  source
	stale bool
	// unshared: the read cannot be told of a later change of its key (a
	// grouped value, see checked; or a
	// TrackKeys near cache's read that Redis does not track for this
	// process), so it is shared only while in flight, never held.
	unshared bool
	// joined: the read that produced it joined a load another began, so
	// its callers shared work (for Stats and the Observer).
	joined bool
	// checked is, for a grouped value (one a load put in groups, or one
	// read from Redis in an envelope with groups), the number of the
	// last check of its groups (groupState.checks); 0 otherwise. Such a
	// value is unshared too.
	checked uint64
	// expires is when the value read expires in Redis, in unix
	// nanoseconds, when known (0 otherwise): it is shared no later.
	expires int64
	// stored is the value as Redis holds it, when read from there: Serve
	// may send it as it is. edge is what Serve keeps of a near-cache
	// entry (nil: nothing yet). See serve.go.
	stored string
	edge   *httpenc.Edge
}

// lateFor reports whether r is a grouped value whose groups were last
// checked (by its read, or its load) before a call that began when the
// groups' checks numbered since: an
// invalidation of its groups may have come between the check and the
// call (InvalidateGroups promises such a call no value from before it),
// so the call does not take it, and reads again.
func (r *result) lateFor(since uint64) bool {
	return r.checked != 0 && r.checked <= since
}

// ShareUntil says until when, in unix nanoseconds, a finished read with
// this outcome may be shared with later callers: values and misses may,
// for the share window but never past the value's expiry; errors and
// stale values may not (0), so that the next caller tries again.
func (r result) ShareUntil(err error) int64 {
	if (err != nil && !errors.Is(err, ErrMiss) && !errors.Is(err, ErrNotFound)) || r.stale || r.unshared {
		return 0
	}
	if r.expires != 0 {
		return r.expires
	}
	return 1<<63 - 1
}

type source uint8

// fast answers a Get from the near cache or from a read of the key still
// shared, without locks: the path a surge's callers take. It is kept
// small, apart from get, so that their goroutines' stacks need not grow.
func (c *cache) fast(ctx context.Context, key string, p *policy, readThrough bool, r *result) (err error, ok bool) {
	if p.near != nil {
		if e, ok := p.near.get(key); ok {
			r.val, r.data, r.edge, r.from = e.val, e.data, e.edge, fromNear
			return nil, true
		}
	}
	if !c.coalesce {
		return nil, false
	}
	g := &c.lookups
	if readThrough {
		g = &c.reads
	}
	cl, ok := g.LookHot(key, time.Now().UnixNano())
	if !ok {
		return nil, false
	}
	select {
	case <-cl.Done():
	default:
		// Under way: a loader waiting for its own key's read would wait
		// for itself.
		if err := reentrant(ctx, c, key); err != nil {
			return err, true
		}
	}
	atomic.AddUint64(&p.stats.CoalescedWaits, 1)
	*r, err = singleflight.Wait(ctx, cl)
	return err, true
}

// flight holds what one read needs, passed by value so that no closure is
// allocated for it.
type flight struct {
	c   *cache
	key string
	p   *policy
	ld  loadOne
	cl  *singleflight.Call[result] // the read's call, once it runs (nil without coalescing)
}

// Run is the work of one read, shared by the callers that coalesce (cl
// is their call; nil without coalescing): it reads key, judges what Redis
// holds, and acts on the judgement.
func (f flight) Run(ctx context.Context, cl *singleflight.Call[result]) (result, error) {
	c, key, p := f.c, f.key, f.p
	f.cl = cl
	var t ticket
	if p.near != nil {
		t = c.marks.take(key) // before the read is sent
	}
	rp := c.remote.fetch(ctx, key, p, f.ld != nil)
	if rp.err == nil && len(rp.s) > 0 && rp.s[0] == codec.HeaderExtended {
		rps := []reply{rp} // a value in an envelope: its groups are checked (groups.go)
		c.groups.checkGroups(ctx, rps)
		rp = rps[0]
	}
	if cl != nil {
		cl.Seal()
	}
	j := c.form.judge(key, p, rp, f.ld != nil)
	if p.near != nil && j.v == vHit && !j.refresh {
		p.near.keepRead(key, p, t, j, rp)
	}
	r, err := c.act(ctx, f, j)
	// Under TrackKeys only a tracked read hears of a later write of its
	// key: an untracked one is not held for the share window, which no
	// invalidation would end.
	r.unshared = r.unshared || p.near != nil && p.near.lc.Tracking == TrackKeys && !rp.tracked
	return r, err
}

// Joining counts a caller sharing the read and catches a loader that
// would wait for its own key's read.
func (f flight) Joining(ctx context.Context, key string, running bool) error {
	atomic.AddUint64(&f.p.stats.CoalescedWaits, 1)
	if !running {
		return nil
	}
	return reentrant(ctx, f.c, key)
}

// act does with a judgement what rule says, for one key.
func (c *cache) act(ctx context.Context, f flight, j judgement) (result, error) {
	load, err := c.rule(ctx, f.key, j, f.ld != nil)
	switch {
	case err != nil:
		switch {
		case j.unsure == "":
		case j.v == vCancelled: // the node is up: the caller gave up
			c.remote.dropLease(ctx, f.key, j.unsure)
		default: // see judgement.unsure
			c.remote.leases.remember(f.key, j.unsure)
		}
		return result{}, err
	case load:
		return c.load(ctx, f, j)
	}
	if j.refresh {
		c.refresh(ctx, f.key, f.p, oneLoader{f.ld}, j)
	}
	return j.r, nil
}

// rule is what every read does with a judgement, single or batch, with a
// loader (readThrough) or without: serve j.r (starting a refresh if it is
// due), fail with err, or load. Without a loader, a value past its TTL, a
// value of an invalidated group, a lease and a miss are all ErrMiss, and an undecodable value or a Redis
// failure is the error. With one, all of them load, except a Redis failure
// with WithStrictRedis; an undecodable value is reported as it is
// reloaded. A tombstone is ErrNotFound either way.
func (c *cache) rule(ctx context.Context, key string, j judgement, readThrough bool) (load bool, err error) {
	switch j.v {
	case vHit:
		return false, nil
	case vTombstone:
		return false, ErrNotFound
	case vCancelled:
		// The caller gave up: neither a miss nor Redis's failure.
		return false, j.err
	}
	if !readThrough {
		switch j.v {
		case vUndecodable, vUnavailable:
			return false, j.err
		default: // vStale, vLease, vMiss, vOwed, vInvalid
			return false, ErrMiss
		}
	}
	switch j.v {
	case vUnavailable:
		if c.strict {
			return false, j.err
		}
	case vUndecodable:
		c.tel.report(ctx, key, j.err)
	}
	return true, nil
}

// A verdict is what a stored value means to a reader.
type verdict uint8

const (
	vHit         verdict = iota // a value, decoded
	vStale                      // a value past its TTL, kept only for StaleFor
	vTombstone                  // a remembered ErrNotFound
	vLease                      // a load is in progress somewhere
	vMiss                       // nothing stored
	vUndecodable                // bytes this reader cannot decode
	vUnavailable                // Redis failed, or the node's breaker is open
	vCancelled                  // the caller's context ended before Redis answered
	vOwed                       // an invalidation of the key is owed (pending.go): Redis is not trusted
	vInvalid                    // a value in a group invalidated since it was stored (groups.go)
)

// A judgement is a verdict with what the reader needs to act on it.
type judgement struct {
	v       verdict
	r       result        // vHit and vStale: the value
	err     error         // vUndecodable and vUnavailable: why, as an *Error; vCancelled: the context's error
	lease   string        // vLease: the lease value seen
	digest  string        // vStale, vUndecodable, and a vHit due for refresh: the stored bytes' SHA-1
	left    time.Duration // the value's time to live when read (0: it expires now); -1 when unknown or unlimited
	expires time.Time     // when the value expires, counted from when the read was sent; zero when left is -1
	refresh bool          // vHit: old enough for a background refresh

	// placed is, for a vMiss, the lease the read placed in the key: the
	// load holds it from the start. unsure is, for a vUnavailable or
	// vCancelled, the lease the read sent without learning whether it
	// ran: it may land in the key once the node answers again.
	placed, unsure string

	// A grouped value's groups, and their near-cache marks (groups.go);
	// ttl is the TTL the value was stored with, when it recorded one
	// (else the policy's).
	groups []string
	marks  groupTickets
	ttl    time.Duration
}

// judge is the one place that decides what a stored value means. It turns
// a Redis reply for key (s and err, and left, the time the value has to
// live) into a judgement, decoding the
// value. Get, GetOrLoad, GetMany, GetOrLoadMany and the loads all use it.
// readThrough says whether the caller has a loader: only then is a digest
// (for a guarded reload) or a refresh worth computing.
func (fm *form) judge(key string, p *policy, rp reply, readThrough bool) judgement {
	s, left := rp.s, rp.left
	switch err := rp.err; {
	case err == redis.Nil && rp.placed:
		return judgement{v: vMiss, placed: rp.lease}
	case err == redis.Nil:
		return judgement{v: vMiss}
	case errors.Is(err, ErrRedis):
		j := judgement{v: vUnavailable, err: err}
		if maybeRan(err) {
			j.unsure = rp.lease
		}
		return j
	case err != nil:
		return judgement{v: vCancelled, err: err, unsure: rp.lease}
	case len(s) == 1 && s[0] == codec.HeaderTombstone:
		return judgement{v: vTombstone}
	case len(s) > 0 && s[0] == codec.HeaderLease:
		return judgement{v: vLease, lease: s}
	case len(s) > 0 && s[0] == codec.HeaderExtended:
		return fm.judgeGrouped(key, p, rp, readThrough)
	}
	j := judgement{left: left, ttl: p.ttl}
	if rp.ttl > 0 {
		j.ttl = rp.ttl
	}
	if left >= 0 {
		j.expires = rp.sent.Add(left)
	}
	derr := fm.decode(key, p, bytesOf(s), &j.r)
	j.r.stored = s // for Serve, which may send it as it is
	if left >= 0 {
		j.r.expires = j.expires.UnixNano()
	}
	if derr != nil {
		atomic.AddUint64(&p.stats.DecodeErrors, 1)
		j.v, j.err = vUndecodable, derr
		if lacksDictionary(derr) {
			// The bytes may be sound: kept, as when Redis fails (a load
			// stores nothing over them).
			j.v = vUnavailable
		}
	} else if p.staleFor > 0 && left >= 0 && left <= p.staleFor {
		j.v = vStale
	} else {
		j.refresh = readThrough && p.refreshAfter > 0 && left >= 0 && j.ttl+p.staleFor-left >= p.refreshAfter
	}
	if readThrough && (j.v != vHit || j.refresh) {
		j.digest = digest(s)
	}
	return j
}

// digest is the SHA-1 of a stored value in hex, as Redis's redis.sha1hex
// computes it, for compare-and-set.
func digest(s string) string {
	sum := sha1.Sum(bytesOf(s))
	return hex.EncodeToString(sum[:])
}

// bytesOf views s as bytes without copying it. The string is a Redis reply
// that is ours alone and is only read: copying a value that may be
// megabytes would be waste.
func bytesOf(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// A reply is what Redis returned for one key: the stored value s, or err
// (redis.Nil for none; an *Error matching ErrRedis; or the caller's own
// context error), and, when the policy needs it, the time the value had
// to live when the read was sent.
type reply struct {
	s   string
	err error
	// left is the value's time to live as PTTL reported it: 0 for a value
	// that expires now (PTTL 0, or gone by the time PTTL ran), -1 when it
	// has no expiry or was not asked for.
	left time.Duration
	// sent is when the read was sent, when left was asked for: the value
	// expires no earlier than sent plus left.
	sent time.Time
	// lease is the lease a read with a loader sent (see fetch); placed
	// says that the read placed it: the key held nothing.
	lease  string
	placed bool
	// grouped is, for a value in an envelope, what checkGroups found;
	// ttl, for the value inside, the TTL its envelope recorded.
	grouped *groupedReply
	ttl     time.Duration
	// tracked says that Redis tracks the key for this process's TrackKeys
	// near cache since before the read; untracked, that the read is made
	// on the client (see nearPipeline).
	tracked, untracked bool
}

// decode turns a stored value into a result, written into r: the caller's
// result lives where the shared work keeps it, so decoding into it costs
// no allocation of its own.
func (fm *form) decode(key string, p *policy, data []byte, r *result) (err error) {
	*r = result{}
	plain := 0 // the serialized value's size, for the observer and the near cache
	defer func() { r.size = plain }()
	if fm.tel.obs != nil {
		start := time.Now()
		defer func() {
			if err == nil {
				fm.tel.observeCodec(p, data, plain, true, start)
			}
		}()
	}
	if fm.kind.raw {
		// The caller owns what it gets: decompress into a new slice of
		// its own, and copy a plain value out of the Redis reply.
		b, err := fm.dicts.Decode(nil, data, fm.maxSize, &p.dictRedis)
		if err != nil {
			return keyErr("get", key, err)
		}
		if codec.Plain(data) {
			b = bytes.Clone(b) // b is the reply itself
		} else if b == nil {
			b = []byte{}
		}
		plain = len(b)
		if fm.perCaller {
			r.data = b // each caller copies it in deliver
			return nil
		}
		r.val = fm.kind.fromBytes(b)
		return nil
	}
	var payload []byte
	if codec.Plain(data) || len(data) == 0 {
		// A plain value is its own payload: no buffer needed.
		var err error
		if payload, err = fm.dicts.Decode(nil, data, fm.maxSize, &p.dictRedis); err != nil {
			return keyErr("get", key, err)
		}
	} else {
		buf := getBuf()
		defer putBuf(buf)
		var err error
		if payload, err = fm.dicts.Decode((*buf)[:0], data, fm.maxSize, &p.dictRedis); err != nil {
			return keyErr("get", key, err)
		}
		if cap(payload) > cap(*buf) {
			*buf = payload[:0] // keep the grown buffer
		}
	}
	plain = len(payload)
	if fm.perCaller {
		// Each caller decodes a copy of its own, later; decode one here
		// as well, so that a value the serializer cannot read is judged
		// undecodable now, and reloaded, rather than failing each caller.
		if err := fm.ser.Unmarshal(payload, fm.kind.new()); err != nil {
			return keyErr("get", key, serializationErr(err))
		}
		r.data = bytes.Clone(payload)
		if r.data == nil {
			r.data = []byte{}
		}
		return nil
	}
	v := fm.kind.new()
	if err := fm.ser.Unmarshal(payload, v); err != nil {
		return keyErr("get", key, serializationErr(err))
	}
	r.val = v
	return nil
}

// unmarshal decodes a serialized value into a new *T.
func (fm *form) unmarshal(data []byte) (any, error) {
	if fm.kind.raw {
		return fm.kind.fromBytes(bytes.Clone(data)), nil
	}
	v := fm.kind.new()
	if err := fm.ser.Unmarshal(data, v); err != nil {
		return nil, serializationErr(err)
	}
	return v, nil
}

// deliver counts a caller's outcome and gives it its value (see count
// and value).
func (c *cache) deliver(key string, p *policy, r result, err error, shared bool) (any, error) {
	err = c.tel.count(p, &r, err, shared)
	return c.form.value(key, &r, err)
}

// count counts a caller's outcome, for Stats and the Observer. shared says
// whether the caller shared work another began.
func (t *telemetry) count(p *policy, r *result, err error, shared bool) error {
	o := readOutcome(r.stale, r.from, err)
	near := o == ReadHit && r.from == fromNear
	// Gets is not counted here: it is the sum of the outcomes (snapshot).
	switch {
	case o == ReadStale:
		atomic.AddUint64(&p.stats.StaleServes, 1)
	case o == ReadMiss:
		atomic.AddUint64(&p.stats.Misses, 1)
	case o == ReadNotFound:
		atomic.AddUint64(&p.stats.NotFoundHits, 1)
	case o == ReadError:
		atomic.AddUint64(&p.stats.GetErrors, 1)
	case near:
		atomic.AddUint64(&p.stats.NearHits, 1)
	default:
		atomic.AddUint64(&p.stats.Hits, 1)
	}
	if t.obs != nil {
		t.obs.ObserveRead(ReadEvent{Prefix: p.prefix, Outcome: o, Shared: shared || r.joined, Near: near})
	}
	return err
}

// readOutcome is what a reader got, as Stats and the Observer count it:
// the one classification of a read's result.
func readOutcome(stale bool, from source, err error) ReadOutcome {
	switch {
	case err == nil && stale:
		return ReadStale
	case err == nil && from == fromLoader:
		return ReadMiss
	case err == nil:
		return ReadHit
	case errors.Is(err, ErrMiss):
		return ReadMiss
	case errors.Is(err, ErrNotFound):
		return ReadNotFound
	}
	return ReadError
}

// value gives a caller the value of its result: its own copy when each
// caller decodes its own.
func (fm *form) value(key string, r *result, err error) (any, error) {
	if err != nil {
		return nil, err
	}
	if r.data == nil {
		return r.val, nil
	}
	v, err := fm.unmarshal(r.data)
	if err != nil {
		return nil, keyErr("get", key, err)
	}
	return v, nil
}
