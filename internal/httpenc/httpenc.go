// Package httpenc is the HTTP side of packcache's Serve: which content
// coding a request gets, the body sent in it, its entity tag, and the
// response written, conditional requests included. It knows nothing of
// the cache: a caller gives it the value as stored and a Source that
// serializes the value when a body needs it.
//
// Start with Pick, which reads a request's Accept-Encoding and returns the
// body to send, and Write, which sends it. What a caller can rely on:
//
//   - A zstd body is the stored zstd frame itself, byte for byte, and
//     only a frame browsers decode: no dictionary, a window of at most
//     8 MiB (RFC 9659). A gzip body is the serialized value gzipped, sent
//     only when the value is at least 1 KiB and gzip makes it smaller. An
//     identity body is the serialized value.
//   - Every body has a strong entity tag, a hash of its bytes marked with
//     its coding: two codings of one value never share one, and one value
//     in one coding always has the same.
//   - An Edge keeps one body per coding: requests that race to make it
//     all get the one kept, and the Source is told of its bytes once.
//   - A dcz body (Delta, RFC 9842) is the value compressed against a
//     version the client names in Available-Dictionary, sent only when
//     the client names dcz in Accept-Encoding, the caller's Versions keeps
//     that version, and the delta is smaller than the body Pick chose;
//     anything else gets Pick's body. Offer offers a body as a dictionary.
//   - A Body's bytes may be views of the stored value or of the serialized
//     value: neither is copied, and neither may change while bodies of
//     them are in use.
//
// The package holds every rule of Serve's negotiation (RFC 9110, sections
// 8.8.3, 12.5.3, 13.1.2 and 15.4.5; RFC 9842): a change to how Serve follows the
// RFC is made here.
package httpenc

// The codings Serve sends, as indexes of accepted and Edge.bodies, in the
// order of their bodies' sizes: the smaller first.
const (
	codingZstd = iota
	codingGzip
	codingIdentity
	codings
)
