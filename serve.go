package packcache

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/maypok86/otter/v2"

	"github.com/packcache/packcache/codec"
)

// The HTTP edge, in call order: Serve reads the key through get, as Get
// does, picks the body the request accepts (pick), and writes it. A body
// is the stored zstd frame as it is, or the serialized value, gzipped or
// not; for a near-cache entry the bodies are made once and kept in its
// edge.

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
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
		return
	}
	if !c.life.enter() {
		c.serveFailure(w, r, key, keyErr("get", key, ErrClosed))
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
	if err != nil {
		c.serveFailure(w, r, key, err)
		return
	}
	acc := parseAcceptEncoding(r.Header["Accept-Encoding"])
	b, err := c.pick(acc, key, p, res)
	switch {
	case err != nil:
		c.serveFailure(w, r, key, err)
		return
	case b == nil:
		http.Error(w, http.StatusText(http.StatusNotAcceptable), http.StatusNotAcceptable)
		return
	}
	h := w.Header()
	addVary(h)
	h["Etag"] = []string{b.etag}
	if etagMatch(r.Header["If-None-Match"], b.etag) {
		// RFC 9110, section 15.4.5: a 304 carries the validators and
		// Vary, not the metadata of a body it does not have.
		delete(h, "Content-Type")
		delete(h, "Content-Length")
		delete(h, "Content-Encoding")
		w.WriteHeader(http.StatusNotModified)
		return
	}
	if _, ok := h["Content-Type"]; !ok {
		h["Content-Type"] = []string{c.contentType()}
	}
	if b.coding != "" {
		h["Content-Encoding"] = []string{b.coding}
	} else {
		delete(h, "Content-Encoding")
	}
	h["Content-Length"] = []string{strconv.Itoa(len(b.b))}
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		w.Write(b.b) // a client gone is nothing to report
	}
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

// serveFailure answers a Serve whose read failed with err.
func (c *Cache[T]) serveFailure(w http.ResponseWriter, r *http.Request, key string, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrMiss):
		status = http.StatusNotFound
	case errors.Is(err, ErrClosed):
		status = http.StatusServiceUnavailable
	case errors.Is(err, ErrRedis):
		status = http.StatusServiceUnavailable
		if !errors.Is(err, ErrCircuitOpen) {
			// An open circuit was opened by failures already seen; told
			// on every request it would say nothing new.
			c.report(r.Context(), key, err)
		}
	case r.Context().Err() != nil:
		// The client went away or the server's deadline passed: no
		// failure of the cache's.
		status = http.StatusServiceUnavailable
	default:
		c.report(r.Context(), key, err)
	}
	if c.serveError != nil {
		c.serveError(w, r, status, err)
		return
	}
	http.Error(w, http.StatusText(status), status)
}

// A body is one response body, with its coding ("": identity) and ETag.
type body struct {
	b      []byte
	coding string
	etag   string
}

// noBody is an edge's answer for a body it cannot make: a stored value
// that is not a zstd frame browsers take, or JSON too small to gzip.
var noBody = &body{}

// An edge is what Serve keeps of a near-cache entry: the value as stored
// and the bodies made from it, each made once, by the first Serve that
// needs it. Each body made anew (not a view of stored or of the value)
// adds its length to the entry's weight.
type edge struct {
	stored string
	// bodies holds, by coding: the stored frame (or noBody), the
	// serialized value gzipped (or noBody), the serialized value.
	bodies [codings]atomic.Pointer[body]
}

// The codings Serve sends, as indexes of accepted and edge.bodies.
const (
	codingZstd = iota
	codingGzip
	codingIdentity
	codings
)

// gzipMin is the smallest serialized value Serve gzips: below it a
// response fits a packet or two either way, and gzip's 18 bytes of
// framing eat much of the gain.
const gzipMin = 1 << 10

// webZstdWindow is the largest window a zstd frame sent as
// Content-Encoding may need: RFC 9659 lets decoders refuse more, and
// browsers do.
const webZstdWindow = 8 << 20

// pick returns the body of res that acc prefers, or nil if it accepts
// none that res has: the codings it accepts, by q, the smaller body first
// among equals (zstd, gzip, identity), each tried until one has a body.
func (c *Cache[T]) pick(acc accepted, key string, p *policy[T], res result[T]) (*body, error) {
	order := [codings]int{codingZstd, codingGzip, codingIdentity}
	for i := 1; i < codings; i++ {
		for j := i; j > 0 && acc[order[j]] > acc[order[j-1]]; j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
	for _, k := range order {
		if acc[k] <= 0 {
			break
		}
		b, err := c.body(k, key, p, res)
		if err != nil {
			return nil, err
		}
		if b != noBody {
			return b, nil
		}
	}
	return nil, nil
}

// body returns res's body in coding k, or noBody if it has none.
func (c *Cache[T]) body(k int, key string, p *policy[T], res result[T]) (*body, error) {
	if k == codingZstd {
		return c.keep(key, p, res.edge, k, func() (*body, int, error) {
			if res.edge != nil {
				return zstdBody(res.edge.stored), 0, nil // stored is weighed already
			}
			return zstdBody(res.stored), 0, nil
		})
	}
	plain, err := c.keep(key, p, res.edge, codingIdentity, func() (*body, int, error) { return c.plainBody(res) })
	if err != nil || k == codingIdentity {
		return plain, err
	}
	if len(plain.b) < gzipMin {
		return noBody, nil
	}
	return c.keep(key, p, res.edge, codingGzip, func() (*body, int, error) { return gzipBody(plain.b) })
}

// keep returns eg's body in coding k, making it with make first if there
// is none yet; with no edge (a result not from the near cache) it just
// makes it. make returns the body and the bytes it allocated, which the
// entry's weight grows by.
func (c *Cache[T]) keep(key string, p *policy[T], eg *edge, k int, make func() (*body, int, error)) (*body, error) {
	if eg == nil {
		b, _, err := make()
		return b, err
	}
	slot := &eg.bodies[k]
	if b := slot.Load(); b != nil {
		return b, nil
	}
	b, n, err := make()
	if err != nil {
		return nil, err
	}
	if slot.CompareAndSwap(nil, b) && n > 0 {
		p.near.grow(key, eg, n)
	}
	return slot.Load(), nil
}

// grow adds n bytes to the weight of key's entry, if it is still the one
// of eg, or drops the entry if that would take it past the bound.
func (n *near[T]) grow(key string, eg *edge, by int) {
	n.entries.ComputeIfPresent(key, func(e nearEntry[T]) (nearEntry[T], otter.ComputeOp) {
		if e.edge != eg {
			return e, otter.CancelOp
		}
		w := int64(e.weight) + int64(by)
		if w > n.lc.MaxBytes || w > 1<<32-1 {
			return e, otter.InvalidateOp
		}
		e.weight = uint32(w)
		return e, otter.WriteOp
	})
}

// zstdBody returns the frame of stored as a body, or noBody if stored is
// not a zstd value (header 0x04) whose frame browsers take: one without a
// dictionary whose window is at most webZstdWindow.
func zstdBody(stored string) *body {
	if len(stored) < 2 || stored[0] != codec.HeaderZstd {
		return noBody
	}
	frame := bytesOf(stored)[1:]
	var h zstd.Header
	if h.Decode(frame) != nil || h.Skippable || h.DictionaryID != 0 {
		return noBody
	}
	window := h.WindowSize
	if h.SingleSegment {
		window = h.FrameContentSize // the window of a single-segment frame
	}
	if window > webZstdWindow {
		return noBody
	}
	return &body{b: frame, coding: "zstd", etag: etag(frame, "zstd")}
}

// plainBody returns the serialized value of res, and the bytes allocated
// for it: the stored value itself when it is plain, the stored payload
// decompressed, the value's own bytes for a Cache of []byte or
// json.RawMessage, or (a value just loaded, or one whose stored form this
// package cannot decode alone, such as one written with a dictionary) the
// value serialized again.
func (c *Cache[T]) plainBody(res result[T]) (*body, int, error) {
	var b []byte
	var n int
	switch {
	case res.data != nil: // each caller decodes its own: the payload
		b = res.data
	case c.raw:
		b = *(*[]byte)(unsafe.Pointer(&res.val))
	case res.stored != "" && codec.Plain(bytesOf(res.stored)):
		b = bytesOf(res.stored)
	}
	if b == nil && res.stored != "" {
		if d, err := codec.DecodeValue(nil, bytesOf(res.stored), c.maxSize); err == nil {
			b, n = d, cap(d)
		}
	}
	if b == nil {
		d, err := c.marshal(nil, res.val)
		if err != nil {
			return nil, 0, err
		}
		b, n = d, cap(d)
	}
	return &body{b: b, etag: etag(b, "")}, n, nil
}

var gzipWriters sync.Pool // *gzip.Writer

// gzipBody returns plain gzipped, or noBody if gzip does not make it
// smaller, and the bytes allocated.
func gzipBody(plain []byte) (*body, int, error) {
	var buf bytes.Buffer
	buf.Grow(len(plain)/3 + 64)
	zw, _ := gzipWriters.Get().(*gzip.Writer)
	if zw == nil {
		zw, _ = gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	} else {
		zw.Reset(&buf)
	}
	zw.Write(plain)
	err := zw.Close()
	zw.Reset(nil)
	gzipWriters.Put(zw)
	if err != nil {
		return nil, 0, err
	}
	if buf.Len() >= len(plain) {
		return noBody, 0, nil
	}
	b := buf.Bytes()
	return &body{b: b, coding: "gzip", etag: etag(b, "gzip")}, cap(b), nil
}

// etag is the strong entity tag of a body: 128 bits of its SHA-256,
// marked with its coding, so that two codings of one value never share
// one (RFC 9110, section 8.8.3).
func etag(b []byte, coding string) string {
	sum := sha256.Sum256(b)
	tag := make([]byte, 0, 2+22+1+len(coding))
	tag = append(tag, '"')
	tag = base64.RawURLEncoding.AppendEncode(tag, sum[:16])
	if coding != "" {
		tag = append(tag, '-')
		tag = append(tag, coding...)
	}
	return string(append(tag, '"'))
}

// contentType is the Content-Type of the cache's bodies.
func (c *Cache[T]) contentType() string {
	switch {
	case reflect.TypeFor[T]() == reflect.TypeFor[json.RawMessage]():
		return "application/json"
	case c.raw: // []byte: bytes of any kind
		return "application/octet-stream"
	}
	if ct, ok := c.ser.(interface{ ContentType() string }); ok {
		return ct.ContentType()
	}
	return "application/octet-stream"
}

// ContentType names JSON's media type for Serve.
func (goJSONSerializer) ContentType() string { return "application/json" }

// ContentType names JSON's media type for Serve.
func (jsonSerializer) ContentType() string { return "application/json" }

// accepted holds the q-values, in thousandths, that a request's
// Accept-Encoding gives the codings Serve sends, by coding.
type accepted [codings]int

// parseAcceptEncoding reads the Accept-Encoding field values of a request
// (RFC 9110, section 12.5.3). Without the field, only identity is
// accepted: a client that says nothing may not decode anything else.
// A coding not named takes the q of "*" if given, else 0, but identity,
// which is acceptable unless refused: it then comes after every coding
// named. "x-gzip" is gzip.
func parseAcceptEncoding(values []string) accepted {
	if values == nil {
		return accepted{codingIdentity: 1000}
	}
	a := accepted{-1, -1, -1}
	star := -1
	for _, v := range values {
		for elem := range strings.SplitSeq(v, ",") {
			name, params, _ := strings.Cut(elem, ";")
			q, ok := qValue(params)
			if !ok {
				continue // a malformed q: ignore the element
			}
			switch name = strings.TrimSpace(name); {
			case strings.EqualFold(name, "zstd"):
				a[codingZstd] = max(a[codingZstd], q)
			case strings.EqualFold(name, "gzip"), strings.EqualFold(name, "x-gzip"):
				a[codingGzip] = max(a[codingGzip], q)
			case strings.EqualFold(name, "identity"):
				a[codingIdentity] = max(a[codingIdentity], q)
			case name == "*":
				star = max(star, q)
			}
		}
	}
	for _, k := range [...]int{codingZstd, codingGzip} {
		if a[k] < 0 {
			a[k] = max(star, 0)
		}
	}
	if a[codingIdentity] < 0 {
		// Acceptable unless refused, but the least wanted: "gzip;q=0.5"
		// asks for gzip.
		a[codingIdentity] = 1
		if star >= 0 {
			a[codingIdentity] = star
		}
	}
	return a
}

// qValue returns the q parameter among params ("; q=0.5"), in
// thousandths: 1000 without one, and false if it is malformed.
func qValue(params string) (int, bool) {
	q := 1000
	for p := range strings.SplitSeq(params, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok || !strings.EqualFold(strings.TrimSpace(k), "q") {
			continue
		}
		v = strings.TrimSpace(v)
		// qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )
		if v == "" || v[0] != '0' && v[0] != '1' || len(v) > 5 || len(v) > 1 && v[1] != '.' {
			return 0, false
		}
		q = int(v[0]-'0') * 1000
		for i, scale := 2, 100; i < len(v); i, scale = i+1, scale/10 {
			if v[i] < '0' || v[i] > '9' {
				return 0, false
			}
			q += int(v[i]-'0') * scale
		}
		if q > 1000 {
			return 0, false
		}
	}
	return q, true
}

// etagMatch reports whether an If-None-Match field lists tag, or is "*"
// (RFC 9110, section 13.1.2: weak comparison).
func etagMatch(values []string, tag string) bool {
	for _, v := range values {
		for t := range strings.SplitSeq(v, ",") {
			t = strings.TrimSpace(t)
			if t == "*" || strings.TrimPrefix(t, "W/") == tag {
				return true
			}
		}
	}
	return false
}

// addVary adds Accept-Encoding to the response's Vary, unless it is
// there.
func addVary(h http.Header) {
	for _, v := range h["Vary"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f == "*" || strings.EqualFold(f, "Accept-Encoding") {
				return
			}
		}
	}
	h.Add("Vary", "Accept-Encoding")
}
