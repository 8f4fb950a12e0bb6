package packcache

import (
	"bytes"

	gojson "github.com/goccy/go-json"
	"github.com/packcache/packcache/internal/dictset"
)

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
// turn a value into stored bytes (encode, write.go) and stored bytes
// into a value (decode, read.go).
type form struct {
	ser       Serializer
	text      bool // ser.Text(), read once: values it writes are text
	kind      kind
	maxSize   int
	perCaller bool        // each caller decodes a copy of its own (WithPerCallerDecode)
	dicts     dictset.Set // zstd dictionaries: the policies' own and those fetched from Redis
	tel       *telemetry  // encodes and decodes are observed
}
