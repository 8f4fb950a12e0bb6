package dictset

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
)

// wrongType is the error go-redis returns for a command on a key of
// another type.
type wrongType struct{}

func (wrongType) Error() string {
	return "WRONGTYPE Operation against a key holding the wrong kind of value"
}
func (wrongType) RedisError() {}

var _ redis.Error = wrongType{}

// TestFetch: a fetch reads at most one byte past the largest dictionary,
// uses what it reads only if it is the dictionary with the id named, and
// tells a refusal (kept a while) from a Redis failure (not kept).
func TestFetch(t *testing.T) {
	t.Parallel()
	d, other := trained(t, 81), trained(t, 82)
	id := d.ID()
	key := codec.DictionaryKey(id)
	cause := errors.New("i/o timeout")
	for _, tc := range []struct {
		name  string
		held  []byte
		err   error
		why   string // in the refusal's message; "" for the dictionary
		cause error  // a Redis failure
	}{
		{name: "the dictionary", held: d.Bytes()},
		{name: "absent", why: "does not hold"},
		{name: "another dictionary", held: other.Bytes(), why: "holds dictionary"},
		{name: "forged id", held: withID(other, id), why: "holds dictionary"},
		{name: "not a dictionary", held: []byte("hello"), why: "invalid zstd dictionary"},
		{name: "too large", held: make([]byte, codec.MaxDictionarySize+100), why: "holds over"},
		{name: "a hash", err: wrongType{}, why: "is not a string"},
		{name: "redis failed", err: cause, cause: cause},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &stub{held: map[string][]byte{key: tc.held}, err: tc.err}
			before := time.Now()
			e := fetch(r, id)
			if len(r.ranges) != 1 || r.ranges[0] != [2]int64{0, codec.MaxDictionarySize} {
				t.Fatalf("read ranges %v, want one GETRANGE 0 %d", r.ranges, codec.MaxDictionarySize)
			}
			switch {
			case tc.why == "" && tc.cause == nil:
				if e.err != nil || e.d == nil || e.d.ID() != id || e.retry != 0 {
					t.Fatalf("got %v, %v; want the dictionary", e.d, e.err)
				}
			case tc.cause != nil:
				if e.d != nil || !errors.Is(e.err, tc.cause) || errors.Is(e.err, codec.ErrUnknownDictionary) || !strings.Contains(e.err.Error(), key) || e.retry != 0 {
					t.Fatalf("got %v (retry %d); want the Redis failure, naming %s, not kept", e.err, e.retry, key)
				}
			default:
				var de *codec.DictionaryError
				if e.d != nil || !errors.As(e.err, &de) || de.ID != id || !strings.Contains(e.err.Error(), tc.why) || !strings.Contains(e.err.Error(), key) {
					t.Fatalf("got %v; want an unknown dictionary %08x: %s", e.err, id, tc.why)
				}
				if e.retry < before.Add(retryAfter).UnixNano() {
					t.Errorf("a refusal is to be fetched again at %d, before a second from now", e.retry)
				}
			}
		})
	}
}
