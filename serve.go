package packcache

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/httpenc"
)

// The HTTP edge, in call order: Serve reads the key through get, as Get
// does; internal/httpenc picks the body the request accepts and writes
// it. What needs T stays here: the serialized value a body is made of
// (served) and the Content-Type. For a near-cache entry the bodies are
// made once and kept in its edge (an httpenc.Edge), whose bytes the entry
// weighs (near.grow).

// ServeErrorFunc writes the response of a failed Serve: status is what
// Serve would send, err the error the read returned (a key's errors name
// the key). See WithServeError.
type ServeErrorFunc func(w http.ResponseWriter, r *http.Request, status int, err error)

// WithServeError makes f write the responses of Serve's failures (the
// 404, 500 and 503 that come of an error; see Cache.Serve) instead of
// their status text. Errors name the key and may tell of the application's
// internals: f decides what a client sees. A nil f restores the default.
// serve is Serve.
func (c *cache) serve(w http.ResponseWriter, r *http.Request, key string) {
	p := c.pols.of(key)
	if !httpenc.CheckMethod(w, r) {
		c.tel.servedOne(p, http.StatusMethodNotAllowed, "", 0)
		return
	}
	if err := checkKeys(opGet, key); err != nil {
		c.tel.servedOne(p, serveFailure(w, r, key, err, c.tel.onError, c.serveError), "", 0)
		return
	}
	if err := c.life.begin(opGet, key); err != nil {
		c.tel.servedOne(p, serveFailure(w, r, key, err, c.tel.onError, c.serveError), "", 0)
		return
	}
	defer c.life.Exit()
	if p.near != nil && !p.near.edged.Load() {
		p.near.edged.Store(true)
	}
	var res result
	err := c.get(r.Context(), key, p, p.loader, &res)
	if err == nil && res.from == fromNear && res.edge == nil {
		// An entry made before the near cache was edged: replace it by
		// a read of Redis, which keeps what Serve needs.
		p.near.entries.Invalidate(key)
		res = result{}
		err = c.get(r.Context(), key, p, p.loader, &res)
	}
	var b *httpenc.Body
	src := &served{c: c, key: key, p: p, res: res}
	if err == nil {
		b, err = httpenc.Pick(r, bytesOf(res.stored), res.edge, src)
	}
	if err != nil {
		c.tel.servedOne(p, serveFailure(w, r, key, err, c.tel.onError, c.serveError), "", 0)
		return
	}
	if p.deltas > 0 && b != nil {
		b = src.delta(w, r, b)
	}
	status, n := httpenc.Write(w, r, b, contentType(c.form.kind.t, c.form.kind.raw, c.form.ser))
	c.tel.servedOne(p, status, b.Coding(), n)
}

// servedOne counts a response Serve wrote under p, and tells a
// ServeObserver of it.
func (t *telemetry) servedOne(p *policy, status int, coding string, bytes int) {
	t.served.add(ServeResponse{Status: status, Coding: coding}, bytes)
	if o, ok := t.obs.(ServeObserver); ok {
		o.ObserveServe(ServeEvent{Prefix: p.prefix, Status: status, Coding: coding, Bytes: bytes})
	}
}

// servedCounts are Serve's responses by kind: a kind's counts are made
// once, and later responses of that kind add to them without a lock.
type servedCounts struct {
	m sync.Map // ServeResponse -> *servedCount
}

type servedCount struct{ responses, bytes atomic.Uint64 }

func (s *servedCounts) add(k ServeResponse, bytes int) {
	v, ok := s.m.Load(k)
	if !ok {
		v, _ = s.m.LoadOrStore(k, new(servedCount))
	}
	n := v.(*servedCount)
	n.responses.Add(1)
	n.bytes.Add(uint64(bytes))
}

func (s *servedCounts) snapshot() map[ServeResponse]ServeCount {
	out := map[ServeResponse]ServeCount{}
	s.m.Range(func(k, v any) bool {
		n := v.(*servedCount)
		out[k.(ServeResponse)] = ServeCount{Responses: n.responses.Load(), Bytes: n.bytes.Load()}
		return true
	})
	return out
}

// WithServeError sets f to write the response of a Serve whose read
// failed, in place of the default: http.Error with the status's text,
// which names neither the key nor the error. f gets the status Serve chose
// (404 for ErrNotFound, ErrMiss and ErrReservedKey; 503 when the cache is
// closed, Redis failed or the request's context ended; 500 for any other
// error) and the error. It may write any status and body; Stats.Served and
// the ServeObserver count the status Serve chose. f does not change which
// failures reach the error handler (WithErrorHandler); those that do reach
// it before f is called. A nil f keeps the default.
func WithServeError(f ServeErrorFunc) Option {
	return func(cfg *config) error { cfg.serveError = f; return nil }
}

// serveFailure answers a Serve of key whose read failed with err, telling
// onError of the failures it should know of, and writing the response
// with serveError if the application gave one. It returns the status.
func serveFailure(w http.ResponseWriter, r *http.Request, key string, err error, onError func(context.Context, string, error), serveError ServeErrorFunc) int {
	status := http.StatusInternalServerError
	report := true
	switch {
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrMiss), errors.Is(err, ErrReservedKey):
		status, report = http.StatusNotFound, false
	case errors.Is(err, ErrClosed):
		status, report = http.StatusServiceUnavailable, false
	case errors.Is(err, ErrRedis):
		// An open circuit was opened by failures already seen; told on
		// every request it would say nothing new.
		status, report = http.StatusServiceUnavailable, !errors.Is(err, ErrCircuitOpen)
	case r.Context().Err() != nil:
		// The client went away or the server's deadline passed: no
		// failure of the cache's.
		status, report = http.StatusServiceUnavailable, false
	}
	if report && onError != nil {
		onError(r.Context(), key, err)
	}
	if serveError != nil {
		serveError(w, r, status, err)
		return status
	}
	http.Error(w, http.StatusText(status), status)
	return status
}

// served is the value a Serve sends, as httpenc.Pick sees it: what only
// the cache knows, its serialized form and the weight of its near-cache
// entry.
type served struct {
	c   *cache
	key string
	p   *policy
	res result
}

// Serialized returns the serialized value, and the bytes allocated for
// it: the stored value itself when it is plain, the stored payload
// decompressed, the value's own bytes for a Cache of []byte or
// json.RawMessage, or (a value just loaded, or one whose stored form this
// package cannot decode alone, such as one written with a dictionary) the
// value serialized again. For a Cache of json.RawMessage, whose bytes no
// serializer read, bytes that are not JSON are an error matching
// ErrSerialization: Serve answers 500.
func (s *served) Serialized() ([]byte, int, error) {
	res := &s.res
	stored := s.stored()
	var b []byte
	var n int
	switch {
	case res.data != nil: // each caller decodes its own: the payload
		b = res.data
	case s.c.form.kind.raw:
		b = s.c.form.kind.bytes(res.val)
	case codec.Plain(stored):
		b = stored
	}
	if b == nil && len(stored) > 0 {
		if d, err := codec.DecodeValue(nil, stored, s.c.form.maxSize); err == nil {
			b, n = d, cap(d)
		}
	}
	if b == nil {
		d, err := s.c.form.marshal(nil, res.val)
		if err != nil {
			return nil, 0, err
		}
		b, n = d, cap(d)
	}
	if s.c.form.kind.t == rawJSON && !json.Valid(bytes.TrimPrefix(b, bom)) {
		// The serializer never read it: a json.RawMessage is the bytes
		// stored, which anyone may have written (redis-cli SET).
		return nil, 0, keyErr("get", s.key, serializationErr(errNotJSON))
	}
	return b, n, nil
}

var rawJSON = reflect.TypeFor[json.RawMessage]()

// stored is the value as Redis holds it, when known: read from there, or
// kept by the near-cache entry's edge (a near hit); nil otherwise.
func (s *served) stored() []byte {
	if s.res.stored == "" && s.res.edge != nil {
		return s.res.edge.Stored()
	}
	return bytesOf(s.res.stored)
}

// errNotJSON is the cause of a Serve of a json.RawMessage that is not
// JSON: it is not sent as application/json.
var errNotJSON = errors.New("the value is not JSON, so it is not served as application/json")

// delta is Policy.Deltas' part of a Serve of s that sends b, the body
// httpenc.Pick chose: the body to send instead, the value as dcz against
// the version r names if the key's versions keep it (else b); the body
// offered as a dictionary; its version kept (versions.go). A failure to
// read the versions goes to the error handler, and r gets b.
func (s *served) delta(w http.ResponseWriter, r *http.Request, b *httpenc.Body) *httpenc.Body {
	d, err := httpenc.Delta(r, b, s.stored(), s.res.edge, s, servedVersions{c: s.c, key: s.key, p: s.p})
	if err != nil && !errors.Is(err, ErrCircuitOpen) && r.Context().Err() == nil {
		s.c.tel.report(r.Context(), s.key, err)
	}
	httpenc.Offer(w.Header(), r, strings.Trim(d.ETag(), `"`), s.p.deltas)
	s.c.vers.keep(s)
	return d
}

// Kept adds the n bytes a body kept in eg to the weight of the near-cache
// entry that holds eg.
func (s *served) Kept(eg *httpenc.Edge, n int) {
	s.p.near.grow(s.key, eg, n)
}

// contentType is the Content-Type of the bodies of a Cache of t, with
// serializer ser; raw says whether t is stored as is ([]byte or
// json.RawMessage).
func contentType(t reflect.Type, raw bool, ser Serializer) string {
	switch {
	case t == rawJSON:
		return "application/json"
	case raw: // []byte: bytes of any kind
		return "application/octet-stream"
	}
	if ct, ok := ser.(interface{ ContentType() string }); ok {
		return ct.ContentType()
	}
	return "application/octet-stream"
}
