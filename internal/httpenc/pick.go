package httpenc

import (
	"net/http"
	"sync/atomic"
)

// A Source serializes the value a body is made of. Pick calls it only
// when a request needs the serialized value (an identity or gzip body
// not yet kept), so a zstd request for a stored frame costs no
// serialization.
type Source interface {
	// Serialized returns the value serialized, and how many bytes were
	// allocated to make it: 0 when the bytes are a view of memory held
	// already (the stored value, the value itself). Pick does not modify
	// them, and keeps them in the body it returns.
	Serialized() ([]byte, int, error)
	// Kept tells that eg kept a body made anew, n bytes that the holder
	// of eg should weigh. It is called once for each body eg keeps that
	// allocated, by the goroutine that made it.
	Kept(eg *Edge, n int)
}

// An Edge keeps the bodies of one stored value, each kept by the first
// Pick that makes it, for every later Pick of that value: Picks that race
// to make one all return the one kept. It belongs with the value (a
// near-cache entry): when the value changes, a new Edge is made for the
// new one. It is safe for concurrent use.
type Edge struct {
	stored []byte
	// bodies holds, by coding: the stored frame (or noBody), the
	// serialized value gzipped (or noBody), the serialized value.
	bodies [codings]atomic.Pointer[Body]
	// plainSum is the serialized value's Sum, once a Delta needed it;
	// deltas are the dcz bodies made against earlier versions (dcz.go).
	plainSum atomic.Pointer[Sum]
	deltas   deltaSet
}

// NewEdge returns an Edge for the value stored, as Redis holds it (its
// header and payload; see FORMAT.md). Its bodies may be views of stored,
// which must not change.
func NewEdge(stored []byte) *Edge {
	return &Edge{stored: stored, deltas: deltaSet{max: maxDeltas}}
}

// Stored returns the value as Redis holds it, the bytes eg was made for.
func (eg *Edge) Stored() []byte { return eg.stored }

// Pick returns the body that r's Accept-Encoding prefers, or nil if it
// accepts none the value has (Write answers nil with 406).
//
// The codings r accepts are tried by q-value, highest first, and among
// codings of equal q-value in the order zstd, gzip, identity: the first
// that has a body wins, with no body made only to be compared. zstd is
// the stored frame, when stored is a zstd value browsers decode, or, for
// a value with no stored form, the serialized value compressed with zstd;
// gzip is the serialized value gzipped; either is made only when the
// serialized value is at least 1 KiB and only kept when smaller than it.
// identity is the serialized value. So a browser's Accept-Encoding (gzip,
// deflate, br, zstd: all at q=1) gets a stored frame as it is, and gzip
// only for a value stored otherwise. A request without Accept-Encoding
// accepts identity alone; identity is acceptable unless refused
// (identity;q=0 or *;q=0).
//
// stored is the value as Redis holds it, or nil if it is not known (a
// value just loaded, or one read while Redis fails). With eg not nil,
// stored is eg's and the bodies made are kept in eg, and src is told of
// each kept one's bytes; with eg nil each Pick makes its body anew. An
// error is src's, or the compressor's, and no body is kept for it.
func Pick(r *http.Request, stored []byte, eg *Edge, src Source) (*Body, error) {
	a := parseAcceptEncoding(r.Header["Accept-Encoding"])
	order, n := a.order()
	if eg != nil {
		stored = eg.stored
	}
	for _, k := range order[:n] {
		b, err := eg.body(k, stored, src)
		if err != nil {
			return nil, err
		}
		if b != noBody {
			return b, nil
		}
	}
	return nil, nil
}

// body returns the value's body in coding k, or noBody if it has none,
// kept in eg if eg is not nil.
func (eg *Edge) body(k int, stored []byte, src Source) (*Body, error) {
	if b := eg.kept(k); b != nil {
		return b, nil
	}
	if k == codingZstd && len(stored) > 0 {
		return eg.keep(k, zstdBody(stored), 0, src), nil // stored is weighed already
	}
	plain := eg.kept(codingIdentity)
	if plain == nil {
		p, n, err := src.Serialized()
		if err != nil {
			return nil, err
		}
		plain = eg.keep(codingIdentity, identityBody(p), n, src)
	}
	if k == codingIdentity {
		return plain, nil
	}
	if len(plain.b) < compressMin {
		return noBody, nil
	}
	made := gzipBody
	if k == codingZstd {
		made = zstdMade // no stored form to pass on
	}
	b, n, err := made(plain.b)
	if err != nil {
		return nil, err
	}
	return eg.keep(k, b, n, src), nil
}

// kept returns the body eg keeps in coding k, or nil if there is none
// yet, or no eg.
func (eg *Edge) kept(k int) *Body {
	if eg == nil {
		return nil
	}
	return eg.bodies[k].Load()
}

// keep keeps b, which allocated n bytes, as eg's body in coding k, unless
// another Pick kept one first, and returns the one kept: every request
// gets the same body, and src is told of the bytes of the one kept only.
// With no eg it returns b.
func (eg *Edge) keep(k int, b *Body, n int, src Source) *Body {
	if eg == nil {
		return b
	}
	slot := &eg.bodies[k]
	if slot.CompareAndSwap(nil, b) && n > 0 {
		src.Kept(eg, n)
	}
	return slot.Load()
}
