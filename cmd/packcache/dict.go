package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
)

// Zstandard dictionaries (FORMAT.md section 3.6): values written with one
// name it by id, and writers publish it in Redis under
// codec.DictionaryKey(id). The command reads them as any reader of the
// format does: it fetches each dictionary the first time a value names it
// and uses it only if what the key holds has that id.

// dictionaries are the dictionaries a run has fetched, and the ids it
// found missing or refused.
type dictionaries struct {
	mu  sync.Mutex // held during a fetch: the decodes that need it wait
	got map[uint32]dictionaryResult
}

type dictionaryResult struct {
	d   *codec.Dictionary
	err error // matching codec.ErrUnknownDictionary
}

// decode is codec.DecodeValue for every value, those written with a
// dictionary included: it returns the dictionary used, nil for other
// values. A value whose dictionary Redis does not hold is an error
// matching codec.ErrUnknownDictionary.
func (c *conn) decode(ctx context.Context, v []byte) ([]byte, *codec.Dictionary, error) {
	out, err := codec.DecodeValue(nil, v, c.limit)
	var de *codec.DictionaryError
	if !errors.As(err, &de) {
		return out, nil, err
	}
	d, err := c.dictionary(ctx, de.ID)
	if err != nil {
		return nil, nil, err
	}
	out, err = codec.DecodeValueDict(nil, v, c.limit, d)
	return out, d, err
}

// dictionary returns the dictionary with id, fetched from Redis the first
// time. A Redis failure is not kept: the next value naming id tries again.
func (c *conn) dictionary(ctx context.Context, id uint32) (*codec.Dictionary, error) {
	c.dicts.mu.Lock()
	defer c.dicts.mu.Unlock()
	if r, ok := c.dicts.got[id]; ok {
		return r.d, r.err
	}
	d, err := fetchDictionary(ctx, c.rdb, id)
	if err == nil || errors.Is(err, codec.ErrUnknownDictionary) {
		if c.dicts.got == nil {
			c.dicts.got = map[uint32]dictionaryResult{}
		}
		c.dicts.got[id] = dictionaryResult{d, err}
	}
	return d, err
}

// fetchDictionary reads the dictionary with id from Redis, GETRANGE up to
// a byte past the largest a dictionary may be, so that whatever the key
// holds costs no more.
func fetchDictionary(ctx context.Context, rdb redis.UniversalClient, id uint32) (*codec.Dictionary, error) {
	key := codec.DictionaryKey(id)
	b, err := rdb.GetRange(ctx, key, 0, codec.MaxDictionarySize).Bytes()
	if err != nil && !isWrongType(err) {
		return nil, fmt.Errorf("GETRANGE %s: %w", key, err)
	}
	unknown := &codec.DictionaryError{ID: id}
	if err != nil {
		return nil, fmt.Errorf("%w: %s is not a string", unknown, key)
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: Redis does not hold %s", unknown, key)
	}
	d, err := codec.ParseDictionary(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", unknown, key, err)
	}
	if d.ID() != id {
		return nil, fmt.Errorf("%w: %s holds dictionary %08x", unknown, key, d.ID())
	}
	return d, nil
}

// publishDictionary stores d in Redis where readers look for it, with no
// expiry.
func publishDictionary(ctx context.Context, rdb redis.UniversalClient, d *codec.Dictionary) error {
	key := codec.DictionaryKey(d.ID())
	if err := rdb.Set(ctx, key, d.Bytes(), 0).Err(); err != nil {
		return fmt.Errorf("SET %s: %w", key, err)
	}
	return nil
}

// loadDictionary reads --dictionary FILE (a dictionary such as advise
// --train or "zstd --train" writes) or, for --dictionary-id ID, fetches
// the dictionary Redis holds under that id.
func loadDictionary(ctx context.Context, c *conn, file, id string) (*codec.Dictionary, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, usagef("--dictionary: %v", err)
		}
		d, err := codec.ParseDictionary(b)
		if err != nil {
			return nil, usagef("--dictionary %s: %v", file, err)
		}
		return d, nil
	}
	n, err := strconv.ParseUint(strings.TrimPrefix(id, "packcache:dict:"), 16, 32)
	if err != nil {
		return nil, usagef("--dictionary-id takes the id in hex, as in packcache:dict:58c71407, not %q", id)
	}
	return c.dictionary(ctx, uint32(n))
}
