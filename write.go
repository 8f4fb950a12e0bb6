package packcache

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gojson "github.com/goccy/go-json"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/dictset"
	"github.com/packcache/packcache/internal/owed"
)

// A SetOption changes how one Set or SetMany stores its values.
type SetOption func(*setOptions)

type setOptions struct {
	ttl    time.Duration
	ttlSet bool
	groups []string // InGroups
}

// SetTTL stores the value for d, or with no expiry for Off, instead of
// the key's policy's TTL (zero: the policy's). An invalid TTL fails the
// call.
func SetTTL(d time.Duration) SetOption {
	return func(o *setOptions) {
		if d != 0 { // zero: the policy's, as everywhere
			o.ttl, o.ttlSet = d, true
		}
	}
}

// setOne is Set, with value a *T.
func (c *cache) setOne(ctx context.Context, key string, value any, opts []SetOption) error {
	if err := checkKeys(opSet, key); err != nil {
		return err
	}
	if err := c.life.begin(opSet, key); err != nil {
		return err
	}
	defer c.life.Exit()
	p := c.pols.of(key)
	so := setOptions{ttl: p.ttl}
	for _, o := range opts {
		o(&so)
	}
	if err := checkTTL("SetTTL", so.ttl); err != nil {
		return keyErr("set", key, err)
	}
	e, err := c.form.encode(ctx, "set", key, p, value)
	if err != nil {
		return err
	}
	e.detach()
	defer e.release()
	ttl := p.expiry(so.ttl)
	stored, serr := c.groups.groupStored(ctx, key, p, so, e.stored, ttl)
	w := owed.Write{Op: "set", Keys: []string{key}, Stored: [][]byte{stored}, TTL: so.ttl}
	return c.owed.Write(ctx, &w, func() []error {
		err := serr // the groups' records could not be readied: nothing written
		if err == nil {
			err = c.remote.set(ctx, key, p, stored, ttl)
		}
		c.changed(written, key)
		return []error{err}
	})[0]
}

// remove is Delete.
func (c *cache) remove(ctx context.Context, keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	if err := checkKeys(opDelete, keys...); err != nil {
		return err
	}
	if err := c.life.begin(opDelete, keys[0]); err != nil {
		return err
	}
	defer c.life.Exit()
	defer c.changed(written, keys...)
	if len(keys) == 1 {
		return c.del(ctx, keys[0])
	}
	return c.delMany(ctx, keys)
}

func (c *cache) del(ctx context.Context, key string) error {
	w := owed.Write{Op: "delete", Keys: []string{key}}
	return c.owed.Write(ctx, &w, func() []error {
		return []error{c.remote.roundTrip(ctx, "delete", key, c.pols.of(key), true, func(ctx context.Context) error {
			return c.remote.rdb.Del(ctx, key).Err()
		})}
	})[0]
}

// A Serializer turns values into bytes and back. Implementations must be
// safe for concurrent use.
type Serializer interface {
	// Marshal appends the encoding of the value v points to to dst and
	// returns the extended slice.
	Marshal(dst []byte, v any) ([]byte, error)

	// Unmarshal decodes data into the value v points to. It must not retain
	// data after it returns: the cache reuses the buffer.
	Unmarshal(data []byte, v any) error

	// Text reports whether the output is text a reader may meet verbatim,
	// such as JSON. Such values are stored without a header when they are
	// not compressed, so they stay readable in redis-cli and readable by
	// code that knows nothing of packcache. A serializer of a binary format
	// (msgpack, protobuf, gob) returns false, and every value it writes
	// carries a header. See FORMAT.md.
	Text() bool
}

// JSON is the default Serializer. It uses github.com/goccy/go-json, which
// reads the same struct tags and Marshaler and Unmarshaler methods as
// encoding/json and decodes the same documents to the same values (a test
// checks this on a public corpus), about three times as fast: decoding is
// most of the cost of a Get of a large document. Its output may differ from
// encoding/json's in insignificant ways (such as escaping).
var JSON Serializer = goJSONSerializer{}

var bom = []byte("\xef\xbb\xbf")

type goJSONSerializer struct{}

func (goJSONSerializer) Marshal(dst []byte, v any) ([]byte, error) {
	w := appendWriter{dst}
	if err := gojson.NewEncoder(&w).Encode(v); err != nil {
		return dst, err
	}
	return w.b[:len(w.b)-1], nil // less the newline Encode ends the value with
}

func (goJSONSerializer) Unmarshal(data []byte, v any) error {
	// JSON text may begin with a UTF-8 byte-order mark (RFC 8259 lets a
	// parser ignore it), and other writers leave one: skip it. go-json
	// copies data before decoding, so the value keeps no reference to the
	// cache's buffer.
	return gojson.Unmarshal(bytes.TrimPrefix(data, bom), v)
}

func (goJSONSerializer) Text() bool { return true }

// ContentType names JSON's media type for Serve.
func (goJSONSerializer) ContentType() string { return "application/json" }

// appendWriter is an io.Writer that appends to a slice.
type appendWriter struct{ b []byte }

func (w *appendWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

// form is how a cache stores its values: the serializer, the zstd
// dictionaries beside the policies' codecs, the size limit. Its methods
// turn a value into stored bytes (encode, below) and stored bytes into
// a value (decode, read.go).
type form struct {
	ser       Serializer
	text      bool // ser.Text(), read once: values it writes are text
	kind      kind
	maxSize   int
	perCaller bool        // each caller decodes a copy of its own (WithPerCallerDecode)
	dicts     dictset.Set // zstd dictionaries: the policies' own and those fetched from Redis
	tel       *telemetry  // encodes and decodes are observed
}

// marshal appends v's serialized form to dst. For raw T it returns v's
// own bytes, not a copy.
func (fm *form) marshal(dst []byte, v any) ([]byte, error) {
	if fm.kind.raw {
		return fm.kind.bytes(v), nil
	}
	if v == nil {
		v = fm.kind.new() // T's zero value
	}
	b, err := fm.ser.Marshal(dst, v)
	if err != nil {
		return dst, serializationErr(err)
	}
	return b, nil
}

// An encoded value is what one write stores: the bytes for Redis and the
// serialized value they hold, in pooled buffers that release returns.
type encoded struct {
	stored, payload []byte
	bufs            [2]*[]byte
}

func (e *encoded) release() {
	for _, b := range e.bufs {
		if b != nil {
			putBuf(b)
		}
	}
	e.bufs = [2]*[]byte{}
}

// detach gives e's bytes slices of their own and returns the pooled
// buffers, when the value is small: a write waits on the network, and
// twenty thousand small writes in flight must not each hold two pooled
// buffers sized for large values. Large values keep their buffers, which
// they fill.
func (e *encoded) detach() {
	if len(e.stored) > 4<<10 {
		return
	}
	e.stored = bytes.Clone(e.stored)
	e.payload = nil
	e.release()
}

// maxPooled is the largest buffer kept for reuse: a rare huge value should
// not pin its memory in the pool.
const maxPooled = 8 << 20

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) > maxPooled {
		return
	}
	*b = (*b)[:0]
	bufPool.Put(b)
}

// encode serializes v and frames it with the policy: compressed when its
// size is above the threshold and compression saves at least MinSaving
// bytes, otherwise plain (verbatim for text serializers, behind the none
// header otherwise). The caller releases the result.
//
// op names the call in errors: "set" for a write of the caller's, "load"
// for the store of a loaded value.
func (fm *form) encode(ctx context.Context, op, key string, p *policy, v any) (e encoded, err error) {
	var start time.Time
	if fm.tel.obs != nil {
		start = time.Now()
		defer func() {
			if err == nil {
				fm.tel.observeCodec(p, e.stored, len(e.payload), false, start)
			}
		}()
	}
	sbuf, fbuf := getBuf(), getBuf()
	e.bufs = [2]*[]byte{sbuf, fbuf}
	payload, err := fm.marshal((*sbuf)[:0], v)
	if err != nil {
		e.release()
		return e, keyErr(op, key, err)
	}
	if !fm.kind.raw {
		*sbuf = payload[:0]
	}
	if len(payload) > fm.maxSize {
		e.release()
		return e, keyErr(op, key, &kindError{ErrTooLarge, fmt.Errorf("too large to store: %d bytes serialized, over the limit of %d (WithMaxValueSize)", len(payload), fm.maxSize)})
	}
	e.payload = payload
	verbatim := (fm.kind.raw || fm.text) && codec.Plain(payload)
	plainLen := len(payload)
	if !verbatim {
		plainLen++
	}
	if p.compress && len(payload) > p.threshold && len(payload) > 0 {
		cd := p.codec
		if p.dict != nil {
			ok, err := p.dict.Published(ctx, &p.dictRedis)
			if err != nil {
				fm.tel.report(ctx, key, keyErr(op, key, err))
			}
			if !ok {
				cd = p.undict // a value stored with a dictionary Redis may not hold could be unreadable elsewhere
			}
		}
		out, cerr := codec.AppendValue((*fbuf)[:0], cd, payload)
		if cerr == nil {
			*fbuf = out[:0]
			if len(out)+p.minSaving <= plainLen {
				p.stats.wrote(cd.ID(), len(payload), len(out))
				e.stored = out
				return e, nil
			}
		} else {
			fm.tel.report(ctx, key, keyErr(op, key, cerr))
		}
	}
	if verbatim {
		p.stats.wrote(codec.HeaderNone, len(payload), len(payload))
		e.stored = payload
		return e, nil
	}
	out, _ := codec.AppendValue((*fbuf)[:0], codec.None, payload) // None cannot fail
	*fbuf = out[:0]
	p.stats.wrote(codec.HeaderNone, len(payload), len(out))
	e.stored = out
	return e, nil
}

func (c *counters) wrote(id byte, in, out int) {
	cc := &c.codecs[id]
	cc.values.Add(1)
	cc.bytesIn.Add(uint64(in))
	cc.bytesOut.Add(uint64(out))
}

// expiry applies the policy's jitter and stale window to a TTL.
func (p *policy) expiry(ttl time.Duration) time.Duration {
	if ttl == Off {
		return ttl
	}
	if p.jitter > 0 {
		ttl -= time.Duration(rand.Float64() * p.jitter * float64(ttl))
		if ttl < time.Millisecond {
			ttl = time.Millisecond
		}
	}
	return ttl + p.staleFor
}

// redisTTL is ttl as go-redis takes it, where 0 means no expiry.
func redisTTL(ttl time.Duration) time.Duration {
	if ttl == Off {
		return 0
	}
	return ttl
}

// set writes stored under key unconditionally: a write of the caller's,
// which overwrites any value and any lease, so that no load begun before
// it can store its value afterwards (see the guarded stores in lease.go).
//
// A value written with the policy's dictionary also asks, in the same
// round trip, whether Redis still holds the dictionary (dictCheck); if it
// does not, the write publishes it again before it returns (see
// dictset.Writer.Lost), and a failure to is reported, not returned: the
// value is stored.
func (r *remote) set(ctx context.Context, key string, p *policy, stored []byte, ttl time.Duration) error {
	var lost bool
	err := r.roundTrip(ctx, "set", key, p, true, func(ctx context.Context) error {
		dk := r.dictCheck(ctx, key, p, stored)
		if dk == "" {
			return r.rdb.Set(ctx, key, stored, redisTTL(ttl)).Err()
		}
		pipe := r.rdb.Pipeline()
		set := pipe.Set(ctx, key, stored, redisTTL(ttl))
		held := pipe.Exists(ctx, dk)
		_, _ = pipe.Exec(ctx) // each command carries its own error
		lost = held.Err() == nil && held.Val() == 0
		return set.Err()
	})
	if err != nil {
		return err
	}
	atomic.AddUint64(&p.stats.Sets, 1)
	if lost {
		if err := p.dict.Lost(ctx, &p.dictRedis); err != nil {
			r.tel.report(ctx, key, keyErr("set", key, err))
		}
	}
	return nil
}

// A change says how keys changed in Redis, which decides what of this
// process's work on them may no longer be handed to later callers.
type change uint8

const (
	// written: by this process's Set, SetMany or Delete. Every read and
	// load of the keys under way is detached from later callers, so that
	// a Get that starts after the write returns sees it.
	written change = iota
	// stored: by a load of this process, whose guarded store succeeded.
	// Only the reads without a loader are detached: one may have found
	// the key missing, which later callers must not be given. Reads with
	// a loader that found it missing share the very load that stored, and
	// that load's value is the one now in Redis.
	stored
	// invalidated: by anyone, as Redis's invalidation stream says (see
	// internal/tracking), so that a Get after the invalidation reads
	// afresh, as after a write of this process. Loads are not detached:
	// their stores are guarded in Redis against any other write (see the
	// comment on writes in write.go), and the stream also reports this
	// process's own leases and stores, which must not detach the load that
	// made them.
	invalidated
	// flushed: any key, by anyone (FLUSHALL, FLUSHDB, a Cluster's masters
	// changing, or an invalidation connection that dropped or subscribed
	// again: what was written meanwhile is unknown). The keys are not
	// given: every near cache is emptied, and every read detached.
	flushed
	// groupsWritten: the records of groups, the keys, by this process's
	// InvalidateGroups. The near caches stop serving the groups' members
	// at once, and calls that start from now on share no read or load
	// begun before.
	groupsWritten
	// groupsInvalidated: the records of groups, as the invalidation
	// stream says: as groupsWritten, but loads are not detached (their
	// stores are guarded in Redis, as for invalidated).
	groupsInvalidated
)

// changed is the one place a change of keys in Redis reaches this
// process: every path that learns of one (its own writes, its loads'
// stores, the invalidation stream) calls it. It removes the keys from
// the near caches and bumps their marks, so that no read begun before
// the change puts its value there afterwards, and detaches from later
// callers the work on them that how says may no longer be shared.
func (c *cache) changed(how change, keys ...string) {
	switch how {
	case groupsWritten, groupsInvalidated:
		if c.nears != nil {
			for _, k := range keys {
				c.marks.touchGroup(strings.TrimPrefix(k, groupPrefix))
			}
		}
		c.lookups.ForgetAll()
		c.reads.ForgetAll()
		if how == groupsWritten {
			c.loads.ForgetAll()
		}
		return
	case flushed:
		c.marks.touchAll()
		for _, n := range c.nears {
			n.entries.InvalidateAll()
		}
		// As for an invalidation of every key: no read begun before is
		// shared after it.
		c.lookups.ForgetAll()
		c.reads.ForgetAll()
		return
	}
	for _, k := range keys {
		if c.nears != nil {
			c.marks.touch(k)
			if n := c.pols.of(k).near; n != nil {
				n.entries.Invalidate(k)
			}
		}
		c.lookups.Forget(k)
		if how == stored {
			continue
		}
		c.reads.Forget(k)
		if how == written {
			c.loads.Forget(k)
		}
	}
}
