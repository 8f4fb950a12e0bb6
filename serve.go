package packcache

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"unsafe"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/httpenc"
)

// The HTTP edge, in call order: Serve reads the key through get, as Get
// does; internal/httpenc picks the body the request accepts and writes
// it. What needs T stays here: the serialized value a body is made of
// (served) and the Content-Type. For a near-cache entry the bodies are
// made once and kept in its edge (an httpenc.Edge), whose bytes the entry
// weighs (near.grow).

// Serve writes the value of key as the response to r: read through as Get
// reads it (the loader, coalescing, the near cache, StaleFor and
// RefreshAfter all apply, and the read counts in Stats as a Get), under
// r's context.
//
// The body is chosen by the request's Accept-Encoding, whose q-values are
// honoured (a coding at q=0 is refused; among those accepted the highest q
// wins, and on a tie the smaller body):
//
//   - zstd: a value stored with zstd (header 0x04) is sent as the stored
//     frame, byte for byte, with Content-Encoding: zstd: no decompression,
//     no encoding. Browsers refuse frames whose window exceeds 8 MiB
//     (RFC 9659); such a value, a value written with a dictionary (0x05),
//     and a value stored otherwise (LZ4, Snappy, plain) is served as the
//     serialized value below, never re-encoded as zstd.
//   - gzip: the serialized value gzipped, when it is at least 1 KiB and
//     gzip makes it smaller.
//   - identity: the serialized value as it is. A request without
//     Accept-Encoding gets it, as does one that accepts nothing Serve has
//     unless it refuses identity too (identity;q=0 or *;q=0), which gets
//     406 Not Acceptable.
//
// The serialized value is the stored payload: a plain value as Redis holds
// it, a compressed one decompressed. A value just loaded has no stored
// form to pass on: it is serialized again and served gzipped or as it is,
// and the next request, which reads what the load stored, gets the zstd
// frame.
//
// Every 200 has Content-Type, Content-Length, Vary: Accept-Encoding
// (added to the application's own Vary), and a strong ETag: a hash of
// the body's bytes, marked with its content coding, so that each coding
// of a value has its own. Content-Type is application/json for the JSON
// serializers and for a Cache of json.RawMessage; a Serializer with a
// method ContentType() string names its own; others, and a Cache of
// []byte, get application/octet-stream. A Content-Type the application
// set on w before calling Serve is kept, as are its other headers (such
// as Cache-Control). A request whose If-None-Match matches the ETag of the
// body it would get is answered 304 Not Modified, without a body. HEAD
// gets the headers of GET and no body. Other methods get 405 with Allow:
// GET, HEAD.
//
// Errors are statuses: ErrNotFound and ErrMiss are 404 Not Found;
// ErrClosed, and a failure of Redis (ErrRedis, ErrCircuitOpen) that the
// cache could not answer from a loader, are 503 Service Unavailable, as
// is a read cut short by the end of r's context (the client went away, or
// the server's deadline passed); every other error is 500 Internal Server
// Error. Errors of a 500, and Redis failures other than an open circuit,
// go to the error handler (WithErrorHandler). The body of an error is its
// status text, which names neither the key nor the error, unless
// WithServeError writes it.
//
// With a near cache (WithLocalCache), a hot key costs Serve no Redis read
// and no decompression per request: from the first Serve of a key of a
// near cache on, that near cache keeps with each value it holds the value
// as stored, and the bodies Serve makes from it, each made once (the
// decompressed value and its gzipped form, as clients ask for them) and
// weighed in its bound: an entry weighs what it did for Get (its key, its
// serialized length and an overhead) plus the stored value and the bodies
// made. An entry made before that first Serve is replaced on its next
// Serve by a read of Redis. Invalidation and the TTL rule these as they
// rule the entry: they are the entry.
//
// WARNING: for a key that holds a value written by another writer with a
// zstd frame whose content is not what the serializer would read (say, a
// document in another format), Serve passes the frame on all the same:
// the stored frame is what it sends.
func (c *Cache[T]) Serve(w http.ResponseWriter, r *http.Request, key string) {
	if !httpenc.CheckMethod(w, r) {
		return
	}
	if err := c.life.begin(opGet, key); err != nil {
		serveFailure(w, r, key, err, c.onError, c.serveError)
		return
	}
	defer c.life.exit()
	p := c.policy(key)
	if p.near != nil && !p.near.edged.Load() {
		p.near.edged.Store(true)
	}
	res, err := c.get(r.Context(), key, p, p.loader)
	if err == nil && res.from == fromNear && res.edge == nil {
		// An entry made before the near cache was edged: replace it by
		// a read of Redis, which keeps what Serve needs.
		p.near.entries.Invalidate(key)
		res, err = c.get(r.Context(), key, p, p.loader)
	}
	var b *httpenc.Body
	if err == nil {
		b, err = httpenc.Pick(r, bytesOf(res.stored), res.edge, &served[T]{c: c, key: key, p: p, res: res})
	}
	if err != nil {
		serveFailure(w, r, key, err, c.onError, c.serveError)
		return
	}
	httpenc.Write(w, r, b, contentType(reflect.TypeFor[T](), c.raw, c.ser))
}

// ServeErrorFunc writes the response of a failed Serve: status is what
// Serve would send, err the error the read returned (a key's errors name
// the key). See WithServeError.
type ServeErrorFunc func(w http.ResponseWriter, r *http.Request, status int, err error)

// WithServeError makes f write the responses of Serve's failures (the
// 404, 500 and 503 that come of an error; see Cache.Serve) instead of
// their status text. Errors name the key and may tell of the application's
// internals: f decides what a client sees. A nil f restores the default.
func WithServeError(f ServeErrorFunc) Option {
	return func(cfg *config) error { cfg.serveError = f; return nil }
}

// serveFailure answers a Serve of key whose read failed with err, telling
// onError of the failures it should know of, and writing the response
// with serveError if the application gave one.
func serveFailure(w http.ResponseWriter, r *http.Request, key string, err error, onError func(context.Context, string, error), serveError ServeErrorFunc) {
	status := http.StatusInternalServerError
	report := true
	switch {
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrMiss):
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
		return
	}
	http.Error(w, http.StatusText(status), status)
}

// served is the value a Serve sends, as httpenc.Pick sees it: what only
// the cache knows, its serialized form and the weight of its near-cache
// entry.
type served[T any] struct {
	c   *Cache[T]
	key string
	p   *policy[T]
	res result[T]
}

// Serialized returns the serialized value, and the bytes allocated for
// it: the stored value itself when it is plain, the stored payload
// decompressed, the value's own bytes for a Cache of []byte or
// json.RawMessage, or (a value just loaded, or one whose stored form this
// package cannot decode alone, such as one written with a dictionary) the
// value serialized again.
func (s *served[T]) Serialized() ([]byte, int, error) {
	res := &s.res
	var b []byte
	var n int
	switch {
	case res.data != nil: // each caller decodes its own: the payload
		b = res.data
	case s.c.raw:
		b = *(*[]byte)(unsafe.Pointer(&res.val))
	case res.stored != "" && codec.Plain(bytesOf(res.stored)):
		b = bytesOf(res.stored)
	}
	if b == nil && res.stored != "" {
		if d, err := codec.DecodeValue(nil, bytesOf(res.stored), s.c.maxSize); err == nil {
			b, n = d, cap(d)
		}
	}
	if b == nil {
		d, err := s.c.marshal(nil, res.val)
		if err != nil {
			return nil, 0, err
		}
		b, n = d, cap(d)
	}
	return b, n, nil
}

// Kept adds the n bytes a body kept in eg to the weight of the near-cache
// entry that holds eg.
func (s *served[T]) Kept(eg *httpenc.Edge, n int) {
	s.p.near.grow(s.key, eg, n)
}

// contentType is the Content-Type of the bodies of a Cache of t, with
// serializer ser; raw says whether t is stored as is ([]byte or
// json.RawMessage).
func contentType(t reflect.Type, raw bool, ser Serializer) string {
	switch {
	case t == reflect.TypeFor[json.RawMessage]():
		return "application/json"
	case raw: // []byte: bytes of any kind
		return "application/octet-stream"
	}
	if ct, ok := ser.(interface{ ContentType() string }); ok {
		return ct.ContentType()
	}
	return "application/octet-stream"
}
