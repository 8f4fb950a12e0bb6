package dictset

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
)

// Redis is how a Set reaches Redis. The caller implements it so that each
// call is made as its other calls are: under its time budget and circuit
// breaker, its failures judged and counted as theirs. The Set wraps the
// errors it returns in its own, which name the dictionary's key; they end
// up in errors about the key of a value, so they had better not name an
// operation on the dictionary's key themselves.
type Redis interface {
	// GetRange returns what key holds from byte start to byte end, both
	// included, as GETRANGE does: nothing if key does not exist. The call
	// is the Set's, made for every read waiting for it: no caller's
	// context may end it.
	GetRange(key string, start, end int64) ([]byte, error)

	// RunScript runs script under ctx with key as its one key and args as
	// its arguments, by EVALSHA and, if the node has not seen the script,
	// by EVAL.
	RunScript(ctx context.Context, script *redis.Script, key string, args ...any) error

	// Failed reports whether err, returned by RunScript, says that Redis
	// failed: not that the caller's context ended or the caller closed.
	// A publication that Redis failed is not tried again for a second.
	Failed(err error) bool
}

// fetch reads the dictionary with id through r and verifies it: it must
// parse and have that id. It reads with GETRANGE up to one byte past
// codec.MaxDictionarySize, so that whatever the key holds, a reader
// allocates no more than a dictionary may take. The entry it returns has
// either the dictionary, or an error and, unless Redis failed, the time
// from which to fetch again.
func fetch(r Redis, id uint32) *entry {
	key := codec.DictionaryKey(id)
	e := &entry{id: id}
	b, err := r.GetRange(key, 0, codec.MaxDictionarySize)
	refuse := func(format string, args ...any) *entry {
		e.err = fmt.Errorf("%w: %s", &codec.DictionaryError{ID: id}, fmt.Sprintf(format, args...))
		e.retry = time.Now().Add(retryAfter).UnixNano()
		return e
	}
	var re redis.Error
	switch {
	case errors.As(err, &re) && strings.HasPrefix(re.Error(), "WRONGTYPE"):
		return refuse("%s is not a string", key)
	case err != nil:
		e.err = fmt.Errorf("fetching zstd dictionary %s: %w", key, err)
		return e
	case len(b) == 0:
		return refuse("Redis does not hold %s", key)
	case len(b) > codec.MaxDictionarySize:
		return refuse("%s holds over %d bytes, more than a dictionary may", key, codec.MaxDictionarySize)
	}
	d, err := codec.ParseDictionary(b)
	switch {
	case err != nil:
		return refuse("%s: %v", key, err)
	case d.ID() != id:
		return refuse("%s holds dictionary %08x", key, d.ID())
	}
	e.d = d
	return e
}
