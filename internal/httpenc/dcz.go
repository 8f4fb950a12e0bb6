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
// stored, eg and src are Pick's. With eg not nil, the delta against each
// version is made once, by the first request that needs it, and kept in
// eg for every later one, for as long as vs said the version may be used,
// at most maxDeltas of them; requests that come while it is made wait for
// it (or their context). src is told of the bytes kept. With eg nil,
// every request makes its own.
func Delta(r *http.Request, fallback *Body, stored []byte, eg *Edge, src Source, vs Versions) (*Body, error) {
	sum, ok := wantedDictionary(r)
	if !ok || fallback == nil {
		return fallback, nil
	}
	if eg != nil {
		stored = eg.stored
	}
	plain, err := eg.body(codingIdentity, stored, src)
	if err != nil {
		return fallback, err
	}
	if eg.sum(plain) == sum {
		return fallback, nil // the client has the value: a revalidation's 304, or the value
	}
	b, err := eg.delta(r.Context(), sum, plain, vs, src)
	if err != nil || b == nil || len(b.b) >= len(fallback.b) {
		return fallback, err
	}
	return b, nil
}

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

// A delta is the value as a dcz body against one version: made by the
// first request for it, which closes done.
type delta struct {
	dict  Sum
	done  chan struct{}
	body  *Body     // after done; nil: none (the version is not kept, or an error)
	until time.Time // when the version stops being usable
}

// delta returns the dcz body of plain against the version vs keeps as
// sum, or nil if vs keeps none; kept in eg if eg is not nil.
func (eg *Edge) delta(ctx context.Context, sum Sum, plain *Body, vs Versions, src Source) (*Body, error) {
	if eg == nil {
		b, _, _, err := makeDelta(ctx, sum, plain.b, vs)
		return b, err
	}
	for {
		d, mine := eg.deltaSlot(sum)
		if d == nil { // every slot taken: made for this request alone
			b, _, _, err := makeDelta(ctx, sum, plain.b, vs)
			return b, err
		}
		if mine {
			b, ttl, n, err := makeDelta(ctx, sum, plain.b, vs)
			if b == nil {
				eg.dropDelta(d) // nothing to keep: a later request tries again
			} else {
				d.body, d.until = b, time.Now().Add(ttl)
				src.Kept(eg, n)
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
		eg.dropDelta(d) // the version is past its time: ask vs again
	}
}

// deltaSlot returns eg's delta against sum, and whether the caller is to
// make it (it is new), or nil if there is none and no room for one.
func (eg *Edge) deltaSlot(sum Sum) (*delta, bool) {
	eg.mu.Lock()
	defer eg.mu.Unlock()
	for _, d := range eg.deltas {
		if d.dict == sum {
			return d, false
		}
	}
	if len(eg.deltas) >= maxDeltas {
		return nil, false
	}
	d := &delta{dict: sum, done: make(chan struct{})}
	eg.deltas = append(eg.deltas, d)
	return d, true
}

// dropDelta removes d from eg's deltas, if it is there.
func (eg *Edge) dropDelta(d *delta) {
	eg.mu.Lock()
	defer eg.mu.Unlock()
	for i, e := range eg.deltas {
		if e == d {
			eg.deltas = append(eg.deltas[:i], eg.deltas[i+1:]...)
			return
		}
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
