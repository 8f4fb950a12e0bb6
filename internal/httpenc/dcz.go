package httpenc

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
)

// Dictionary-compressed responses (RFC 9842): a body Serve sends is
// offered to the client as a dictionary (Offer), and a later request
// whose Available-Dictionary names a version the caller still keeps
// (Versions) gets the value as a zstd frame compressed against that
// version (Delta), Content-Encoding dcz.

// A Sum is the SHA-256 of a version's serialized bytes: the name a client
// gives a dictionary in Available-Dictionary.
type Sum [sha256.Size]byte

// SumOf returns the Sum of the serialized bytes b.
func SumOf(b []byte) Sum { return sha256.Sum256(b) }

// Versions keeps the versions of a value that clients may hold as
// dictionaries.
type Versions interface {
	// Version returns the serialized version whose Sum is sum, and how
	// much longer it may be used as a dictionary, or nil if it is not kept
	// (never kept, or past its time). The bytes are not modified, and may
	// be kept in an Edge.
	Version(ctx context.Context, sum Sum) ([]byte, time.Duration, error)
}

// dczMagic begins every dcz body, before the dictionary's SHA-256 and
// the zstd frame (RFC 9842, section 4.2): the header of a zstd skippable
// frame (magic 0x184D2A5E, little-endian) of 32 bytes, the SHA-256, so
// that a decoder without dictionaries skips it.
const dczMagic = "\x5e\x2a\x4d\x18\x20\x00\x00\x00"

// dczWindow is the window of the frames of dcz bodies. RFC 9842 lets a
// decoder refuse a window over 8 MiB or 1.25 times the dictionary,
// whichever is larger: 8 MiB is within it whatever the dictionary.
const dczWindow = 8 << 20

// maxDeltas is how many deltas an Edge keeps, each against another
// version: a value's clients hold its few latest versions. A request for
// a delta against yet another version makes its own, kept by none.
const maxDeltas = 4

// wantedDictionary returns the dictionary r names, if it asks for dcz:
// its Accept-Encoding names dcz with a q-value above 0, and it has one
// Available-Dictionary field (RFC 9842, section 2.2), a structured field
// byte sequence (RFC 8941, section 3.3.5: ":", base64 with padding, ":")
// of 32 bytes. Anything else is no request for a delta.
func wantedDictionary(r *http.Request) (Sum, bool) {
	var sum Sum
	v := r.Header["Available-Dictionary"]
	if len(v) != 1 || !acceptsDcz(r.Header["Accept-Encoding"]) {
		return sum, false
	}
	f := strings.Trim(v[0], " \t")
	if len(f) < 2 || f[0] != ':' || f[len(f)-1] != ':' {
		return sum, false
	}
	b, err := base64.StdEncoding.DecodeString(f[1 : len(f)-1])
	if err != nil || len(b) != len(sum) {
		return sum, false
	}
	copy(sum[:], b)
	return sum, true
}

// Offer sets on h what offers the body of the response to r as a
// dictionary for later requests of r's path (RFC 9842, section 2.1):
// Use-As-Dictionary, matching r's path and no other, with id (an
// sf-string of printable ASCII, as an entity tag is); Available-Dictionary
// in Vary, since the response depends on it; and, unless h has
// Cache-Control already, max-age=fresh (in whole seconds, at least 1): a
// browser keeps a dictionary only while its response is fresh.
func Offer(h http.Header, r *http.Request, id string, fresh time.Duration) {
	var b strings.Builder
	b.WriteString(`match="`)
	for _, c := range []byte(r.URL.EscapedPath()) {
		if strings.IndexByte(`\:*(){}+?`, c) >= 0 {
			// A URL pattern's syntax, escaped in the pattern (\c) and
			// the backslash in the sf-string (\\).
			b.WriteString(`\\`)
		}
		if c == '"' {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	b.WriteString(`", id="`)
	for _, c := range []byte(id) {
		if c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	b.WriteByte('"')
	h["Use-As-Dictionary"] = []string{b.String()}
	addVary(h, "Available-Dictionary")
	if _, ok := h["Cache-Control"]; !ok {
		h["Cache-Control"] = []string{"max-age=" + strconv.FormatInt(max(int64(fresh/time.Second), 1), 10)}
	}
}

// Delta returns the body to answer r with in place of fallback, the body
// Pick chose: the value as dcz, against the version r names, when r asks
// for dcz (its Accept-Encoding names it, and its Available-Dictionary is
// well formed), that version is not the value itself, vs keeps it, its
// bytes have the Sum r names, and the delta is smaller than fallback.
// Otherwise, and on any error (src's, vs's, the compressor's), it returns
// fallback, with the error for the caller to report: a delta is never
// the cause of a failed response.
//
// The body is Content-Encoding dcz: the magic, the version's SHA-256 and
// a zstd frame, without a dictionary id, made with the version as a raw
// content dictionary and a window of 8 MiB, within what RFC 9842 lets a
// client refuse; its entity tag is its own (marked "dcz").
//
// stored, eg and src are Pick's. The delta against each version is made
// once, by the first request that needs it, and kept for every later
// one, for as long as vs said the version may be used; requests that come
// while it is made wait for it (or their context). With eg not nil it is
// kept in eg, for at most maxDeltas versions (a request naming yet
// another makes its own), and src is told of its bytes. With eg nil it is
// kept in a set this package holds, by fallback's entity tag (which names
// the value and the coding) and the version, for at most maxLoneDeltas
// pairs of at most maxLoneBody bytes each, the set emptied when full. A
// request naming the value itself is known as such from then on, in
// either, and costs no serialization; it gets fallback, but for one whose
// If-None-Match lists the entity tag of a dcz body of the value kept
// there (a client revalidating what a delta gave it), which gets that
// body, so that Write answers it 304 Not Modified.
func Delta(r *http.Request, fallback *Body, stored []byte, eg *Edge, src Source, vs Versions) (*Body, error) {
	sum, ok := wantedDictionary(r)
	if !ok || fallback == nil {
		return fallback, nil
	}
	set, k := &loneDeltas, deltaKey{of: fallback.etag, dict: sum}
	if eg != nil {
		set, k, stored = &eg.deltas, deltaKey{dict: sum}, eg.stored
	}
	b, err := set.get(r.Context(), k, &deltaMaker{sum: sum, stored: stored, eg: eg, src: src, vs: vs})
	if b == noBody {
		// The client holds the value: as the dcz body it revalidates,
		// if it got one, so that it gets a 304 and not the whole value.
		// It may have got it through another Edge of the value (an entry
		// the near cache made again) or through none (the near cache
		// could not serve then): dcz bodies are remembered by the value's
		// entity tag too, in loneDeltas or sentDeltas.
		inm := fieldValues(r, "If-None-Match")
		for _, s := range []*deltaSet{set, &loneDeltas, &sentDeltas} {
			of := fallback.etag
			if s == set {
				of = k.of
			}
			if d := s.revalidated(of, inm); d != nil {
				return d, nil
			}
		}
	}
	if err != nil || b == nil || b == noBody || len(b.b) >= len(fallback.b) {
		return fallback, err
	}
	if eg != nil {
		sentDeltas.remember(deltaKey{of: fallback.etag, dict: sum}, b)
	}
	return b, nil
}

// sentDeltas remembers the dcz bodies made in an Edge by the entity tag
// of the value's body they stand for, so that a client revalidating one
// gets its 304 from this process even once that Edge is gone.
var sentDeltas = deltaSet{max: maxLoneDeltas, evict: true}

// remember keeps b, a dcz body made for k, for revalidated alone.
func (s *deltaSet) remember(k deltaKey, b *Body) {
	if len(b.b) > maxLoneBody {
		return
	}
	d, mine := s.slot(k)
	if mine {
		d.body = b
		close(d.done)
	}
}

// revalidated returns the dcz body s keeps, of the value of, whose entity
// tag inm lists (by weak comparison), or nil if there is none.
func (s *deltaSet) revalidated(of string, inm []string) *Body {
	if inm == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, d := range s.m {
		if k.of != of {
			continue
		}
		select {
		case <-d.done:
		default:
			continue // being made
		}
		if d.body != nil && d.body != noBody && etagMatch(inm, d.body.etag, false) {
			return d.body
		}
	}
	return nil
}

// The bounds of the deltas kept without an Edge (see Delta).
const (
	maxLoneDeltas = 128
	maxLoneBody   = 64 << 10
)

// loneDeltas are the deltas of values without an Edge.
var loneDeltas = deltaSet{max: maxLoneDeltas, evict: true}

// sum returns the Sum of plain, the value's serialized body, computed
// once for eg.
func (eg *Edge) sum(plain *Body) Sum {
	if eg == nil {
		return SumOf(plain.b)
	}
	if s := eg.plainSum.Load(); s != nil {
		return *s
	}
	s := SumOf(plain.b)
	eg.plainSum.Store(&s)
	return s
}

// A deltaKey names a delta in a deltaSet: the version it is made
// against, and, in a set of many values' deltas, the value (the entity
// tag of its body).
type deltaKey struct {
	of   string
	dict Sum
}

// A delta is the value as a dcz body against one version: made by the
// first request for it, which closes done.
type delta struct {
	done  chan struct{}
	body  *Body     // after done; nil: none (the version is not kept, or an error); noBody: the value itself
	until time.Time // when the version stops being usable
}

// A deltaSet keeps deltas, at most max of them; when full, it refuses
// more, or, if evict, is emptied.
type deltaSet struct {
	mu    sync.Mutex
	m     map[deltaKey]*delta
	max   int
	evict bool
}

// get returns the delta k names, made by m if the set does not hold it,
// or nil if there is none.
func (s *deltaSet) get(ctx context.Context, k deltaKey, m *deltaMaker) (*Body, error) {
	for {
		d, mine := s.slot(k)
		if d == nil { // the set is full: made for this request alone
			b, _, _, err := m.make(ctx)
			return b, err
		}
		if mine {
			b, ttl, n, err := m.make(ctx)
			if b != nil {
				d.body, d.until = b, time.Now().Add(ttl)
			}
			if b == nil || s.evict && len(b.b) > maxLoneBody {
				s.drop(k, d) // nothing to keep: a later request tries again
			} else {
				m.kept(n)
			}
			close(d.done)
			return b, err
		}
		select {
		case <-d.done:
		case <-ctx.Done():
			return nil, nil // gone: the fallback, which costs nothing
		}
		switch {
		case d.body == nil:
			return nil, nil // the version is not kept: as that request found
		case time.Now().Before(d.until):
			return d.body, nil
		}
		s.drop(k, d) // the version is past its time: ask again
	}
}

// slot returns the delta k names, and whether the caller is to make it
// (it is new), or nil if there is none and no room for one.
func (s *deltaSet) slot(k deltaKey) (*delta, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := s.m[k]; ok {
		return d, false
	}
	if len(s.m) >= s.max {
		if !s.evict {
			return nil, false
		}
		clear(s.m)
	}
	if s.m == nil {
		s.m = make(map[deltaKey]*delta)
	}
	d := &delta{done: make(chan struct{})}
	s.m[k] = d
	return d, true
}

// drop removes d, named k, from s, if it is there.
func (s *deltaSet) drop(k deltaKey, d *delta) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m[k] == d {
		delete(s.m, k)
	}
}

// A deltaMaker makes a request's delta, against the version of Sum sum,
// of the value stored, as Pick makes its bodies.
type deltaMaker struct {
	sum    Sum
	stored []byte
	eg     *Edge
	src    Source
	vs     Versions
}

// forever is how long a fact about a value is kept: its end is the
// value's (the Edge's, or the set's eviction).
const forever = 1 << 62

// make returns the delta, how long it may be used and the bytes it
// allocated; noBody if sum is the value's own Sum; nil if vs keeps no
// version of Sum sum.
func (m *deltaMaker) make(ctx context.Context) (*Body, time.Duration, int, error) {
	plain, err := m.eg.body(codingIdentity, m.stored, m.src)
	if err != nil {
		return nil, 0, 0, err
	}
	if m.eg.sum(plain) == m.sum {
		return noBody, forever, 0, nil // the client has the value: a revalidation's 304, or the value
	}
	return makeDelta(ctx, m.sum, plain.b, m.vs)
}

// kept tells src of the n bytes a delta kept in the Edge holds.
func (m *deltaMaker) kept(n int) {
	if m.eg != nil && n > 0 {
		m.src.Kept(m.eg, n)
	}
}

// makeDelta returns plain as a dcz body against the version vs keeps as
// sum, how long that version may be used, and the bytes allocated; nil
// if vs keeps none, or what it keeps does not have the Sum sum.
func makeDelta(ctx context.Context, sum Sum, plain []byte, vs Versions) (*Body, time.Duration, int, error) {
	dict, ttl, err := vs.Version(ctx, sum)
	if err != nil || dict == nil || ttl <= 0 || SumOf(dict) != sum {
		return nil, 0, 0, err
	}
	b, err := dczBody(dict, sum, plain)
	if err != nil {
		return nil, 0, 0, err
	}
	return b, ttl, cap(b.b), nil
}

// dczBody returns plain compressed against dict, whose Sum is sum, as a
// dcz body.
func dczBody(dict []byte, sum Sum, plain []byte) (*Body, error) {
	enc, err := dczEncoders.get(dict)
	if err != nil {
		return nil, err
	}
	defer dczEncoders.put(enc)
	b := make([]byte, 0, len(dczMagic)+len(sum)+len(plain)/16+64)
	b = append(append(b, dczMagic...), sum[:]...)
	b = enc.EncodeAll(plain, b)
	return &Body{b: b, coding: "dcz", etag: etag(b, "dcz")}, nil
}

// dczEncoders are the encoders of dcz frames, each reset with the
// dictionary of the delta it makes.
var dczEncoders encoderPool

type encoderPool struct{ p sync.Pool }

func (p *encoderPool) get(dict []byte) (*zstd.Encoder, error) {
	opts := []zstd.EOption{zstd.WithEncoderDictRaw(0, dict)}
	if enc, ok := p.p.Get().(*zstd.Encoder); ok {
		if err := enc.ResetWithOptions(nil, opts...); err != nil {
			return nil, err
		}
		return enc, nil
	}
	return zstd.NewWriter(nil, append(opts, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithWindowSize(dczWindow),
		zstd.WithEncoderConcurrency(1), zstd.WithSingleSegment(false))...)
}

func (p *encoderPool) put(enc *zstd.Encoder) {
	// The dictionary is not kept alive by a pooled encoder.
	if enc.ResetWithOptions(nil, zstd.WithEncoderDictDelete()) == nil {
		p.p.Put(enc)
	}
}
