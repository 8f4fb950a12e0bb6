package packcache

import (
	"context"
	"encoding/hex"
	"errors"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/httpenc"
)

// The versions Serve sent, kept in Redis for Policy.Deltas (RFC 9842, see
// serve.go and FORMAT.md section 10): each key's last few versions, in one
// hash of their own, so that any process of the fleet can answer a client
// that holds one of them with a delta. A version is written once per
// process, in the background, the first time Serve sends it (and again
// while it is sent, every half Deltas), so that the hit path makes no
// Redis call for it; and read only by a request that names it.

// versionsPrefix begins the keys of the versions of keys (FORMAT.md
// section 10): packcache:dcz:{K} for a key K without '}', which puts it
// in K's hash slot on a Cluster, else packcache:dcz:K (in K's slot too
// when K has a hash tag).
const versionsPrefix = "packcache:dcz:"

// versionsKey is the key of the versions of key.
func versionsKey(key string) string {
	if strings.IndexByte(key, '}') < 0 {
		return versionsPrefix + "{" + key + "}"
	}
	return versionsPrefix + key
}

// maxVersions is how many versions of a key Redis keeps: a client that
// holds an older one gets the full body.
const maxVersions = 4

// A version's record in the hash's order field is 79 bytes: its SHA-256
// in hex, then when it stops being usable, in milliseconds since the
// epoch on Redis's clock, in 15 decimal digits.

// putVersionScript keeps a version: KEYS[1] the versions' hash, ARGV the
// version's SHA-256 in hex, the version as a stored value, Deltas in
// milliseconds, and maxVersions. It drops the versions past their time
// and, beyond maxVersions, the oldest; the hash expires Deltas after the
// last version kept. It returns the number of versions kept.
var putVersionScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
local order = redis.call('HGET', KEYS[1], 'order') or ''
local kept = {}
for i = 1, #order - 78, 79 do
	local sum = string.sub(order, i, i + 63)
	local ends = tonumber(string.sub(order, i + 64, i + 78))
	if sum ~= ARGV[1] then
		if ends and ends > now then
			kept[#kept + 1] = {sum, ends}
		else
			redis.call('HDEL', KEYS[1], sum)
		end
	end
end
while #kept >= tonumber(ARGV[4]) do
	redis.call('HDEL', KEYS[1], kept[1][1])
	table.remove(kept, 1)
end
local out = {}
for _, k in ipairs(kept) do
	out[#out + 1] = k[1] .. string.format('%015d', k[2])
end
out[#out + 1] = ARGV[1] .. string.format('%015d', now + ttl)
redis.call('HSET', KEYS[1], 'order', table.concat(out), ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl)
return #out
`)

// getVersionScript reads a version: KEYS[1] the versions' hash, ARGV[1]
// its SHA-256 in hex. It returns the milliseconds it stays usable and the
// stored value, or nil if it is not kept or past its time.
var getVersionScript = redis.NewScript(`
local order = redis.call('HGET', KEYS[1], 'order')
if not order then return nil end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, #order - 78, 79 do
	if string.sub(order, i, i + 63) == ARGV[1] then
		local left = tonumber(string.sub(order, i + 64, i + 78)) - now
		local v = redis.call('HGET', KEYS[1], ARGV[1])
		if left <= 0 or not v then return nil end
		return {left, v}
	end
end
return nil
`)

// versions is what a cache knows of the versions it wrote: by key, the
// last it wrote, so that Serve writes each once (bounded: emptied when
// it holds maxOffered keys), and the writes under way (at most
// maxVersionWrites; a version that finds no room is written by a later
// Serve).
type versions struct {
	offered sync.Map // key -> *offer
	n       atomic.Int64
	writing atomic.Int64
}

// offerSeed hashes the stored bytes of the versions offered.
var offerSeed = maphash.MakeSeed()

const (
	maxOffered       = 1 << 14
	maxVersionWrites = 16
)

// An offer is the version of a key last written: a hash of its stored
// bytes, and the near-cache entry's edge it was last sent from, if any
// (weak, so that an offer keeps no entry's bodies alive past the near
// cache); and when it was written.
type offer struct {
	mark uint64
	edge weak.Pointer[httpenc.Edge]
	at   time.Time
}

// keep writes the version of s's key that Serve sends, in the
// background, unless this cache wrote it less than half p.deltas ago. A
// near hit of the edge last seen costs no hash of the value; a new edge
// of the same version costs one. A value just loaded, which Redis does
// not hold as Serve sent it yet, is kept by the first Serve that reads
// it back.
func (vs *versions) keep(s *served) {
	key := s.key
	stored := s.stored()
	if len(stored) == 0 {
		return
	}
	edge := weak.Make(s.res.edge)
	now := time.Now()
	old, _ := vs.offered.Load(key)
	o, _ := old.(*offer)
	fresh := o != nil && now.Sub(o.at) < s.p.deltas/2
	if fresh && s.res.edge != nil && o.edge == edge {
		return
	}
	mark := maphash.Bytes(offerSeed, stored)
	if fresh && o.mark == mark {
		if s.res.edge != nil {
			vs.offered.CompareAndSwap(key, old, &offer{mark: mark, edge: edge, at: o.at})
		}
		return
	}
	if vs.writing.Add(1) > maxVersionWrites {
		vs.writing.Add(-1)
		return
	}
	o = &offer{mark: mark, edge: edge, at: now}
	var won bool
	if old == nil {
		_, loaded := vs.offered.LoadOrStore(key, o)
		won = !loaded
		if won && vs.n.Add(1) > maxOffered {
			vs.offered.Clear()
			vs.n.Store(0)
		}
	} else {
		won = vs.offered.CompareAndSwap(key, old, o)
	}
	if !won || !s.c.life.TryGo(func() {
		defer vs.writing.Add(-1)
		if !vs.put(s) {
			vs.offered.CompareAndDelete(key, o) // a later Serve writes it
		}
	}) {
		vs.writing.Add(-1)
	}
}

// put writes the version s sends to its key's versions: the stored
// value as it is if this package decodes it alone, else the serialized
// value compressed with zstd. It reports whether it did; a failure goes
// to the error handler.
func (vs *versions) put(s *served) bool {
	c := s.c
	// What Serialized returns, whenever the stored value decodes alone.
	stored := s.stored()
	plain, err := codec.DecodeValue(nil, stored, c.form.maxSize)
	if len(stored) == 0 || err != nil {
		if plain, _, err = s.Serialized(); err == nil {
			stored, err = codec.AppendValue(nil, codec.Zstd, plain)
		}
		if err != nil {
			c.tel.report(c.life.ctx, s.key, err)
			return false
		}
	}
	sum := httpenc.SumOf(plain)
	vkey := versionsKey(s.key)
	err = c.remote.roundTripMany(c.life.ctx, opSet, []string{vkey}, []*policy{s.p}, true, func(ctx context.Context, pipe redis.Cmdable, _ int, sha bool) redis.Cmder {
		return runScript(ctx, pipe, putVersionScript, sha, vkey, hex.EncodeToString(sum[:]), stored, max(s.p.deltas.Milliseconds(), 1), maxVersions)
	})[0]
	if err != nil && !errors.Is(err, ErrCircuitOpen) && !errors.Is(err, ErrClosed) {
		c.tel.report(c.life.ctx, s.key, err)
	}
	return err == nil
}

// servedVersions are the versions of one key, as httpenc.Delta asks for
// them.
type servedVersions struct {
	c   *cache
	key string
	p   *policy
}

// Version reads the version of Sum sum from Redis, and decodes it.
func (v servedVersions) Version(ctx context.Context, sum httpenc.Sum) ([]byte, time.Duration, error) {
	vkey := versionsKey(v.key)
	var cmd *redis.Cmd
	err := v.c.remote.roundTripMany(ctx, opGet, []string{vkey}, []*policy{v.p}, true, func(ctx context.Context, pipe redis.Cmdable, _ int, sha bool) redis.Cmder {
		cmd = runScript(ctx, pipe, getVersionScript, sha, vkey, hex.EncodeToString(sum[:]))
		return cmd
	})[0]
	if err == redis.Nil {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	reply, ok := cmd.Val().([]any)
	if len(reply) != 2 || !ok {
		return nil, 0, keyErr(opGet, vkey, errors.New("the versions script returned no pair"))
	}
	left, _ := reply[0].(int64)
	stored, _ := reply[1].(string)
	b, err := codec.DecodeValue(nil, bytesOf(stored), v.c.form.maxSize)
	if err != nil {
		return nil, 0, keyErr(opGet, vkey, err)
	}
	return b, time.Duration(left) * time.Millisecond, nil
}
