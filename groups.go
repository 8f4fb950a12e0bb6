package packcache

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/owed"
	"github.com/packcache/packcache/internal/singleflight"
)

// Groups: a version per group, checked on read (docs/groups.md).
//
// Redis holds, in one hash slot (the tag {packcache:g}), a sequence and
// one record per group in use:
//
//   - {packcache:g}seq counts invalidations; it is the one key that lives
//     forever (a few bytes, whatever the number of groups or
//     invalidations). It never goes back: Redis may lose it (evicted
//     under allkeys-*, as the key no read touches; a restart of its
//     node), and a script that finds it missing remakes it from the
//     server's clock, in microseconds (seqLua), never from 0, so above
//     every value it held, which grew by one per invalidation from the
//     clock's reading when it was last made.
//   - {packcache:g}:<group> holds the sequence at which the group's record
//     was made. It is made by the first write into the group (after its
//     last invalidation), lives as long as the longest-lived value stored
//     in the group since (grouped writes extend it; a value without expiry
//     makes it persist), and is deleted by InvalidateGroups.
//
// A grouped value carries its groups and a sequence S in its envelope
// (FORMAT.md, 2.4): for a Set, the sequence when it began; for a load,
// the sequence read before the loader was called. It is current while
// every group's record exists and holds a sequence no greater than S.
// InvalidateGroups is one script on that slot: the sequence goes up and
// the records go. A value stored before it then finds its record gone, or
// made anew at a sequence above its own S; a load that began before it
// read an S below the sequence of any record made since, even when the
// loader names its groups only after the invalidation.
//
// Whatever Redis loses of this state, no value stored in a group before
// an invalidation of it is current afterwards: a record lost reads as
// the group invalidated (its members are misses until written again), and
// a record made after a loss is made at the sequence remade above every
// member's S. The promise leans on the clock only there: see FORMAT.md,
// 2.4, for what a clock that steps back can undo.
//
// Every key of the scheme is in one slot, so each step is one command on
// one node, also on a Cluster, where a member's node and the groups' node
// differ: a read of a grouped value costs its own read and one MGET of its
// groups' records; a near cache learns of a group's records changing from
// its invalidation stream, and serves members without asking.

const (
	groupTag    = "{packcache:g}"
	groupSeqKey = groupTag + "seq"
	// groupPrefix begins every group's record. It is outside the
	// sequence's name, so that tracking it reports the records only.
	groupPrefix = groupTag + ":"
	opGroups    = "invalidate-groups"
)

// groupKey is the name of g's record.
func groupKey(g string) string { return groupPrefix + g }

func isGroupKey(k string) bool { return strings.HasPrefix(k, groupPrefix) }

// InGroups puts the value that a Set or SetMany stores, or, given to
// StoreWith, the value a load stores, in each of groups (any strings,
// such as "user:42"), so that InvalidateGroups of any of them invalidates
// it. Values in groups are stored in an envelope (FORMAT.md, section
// 2.4) that releases of packcache before it read as an unknown header.
//
// A Set in groups costs one more round trip, to the node that holds the
// groups' records (docs/groups.md); so does a Get of a grouped value that
// is not answered by the near cache.
func InGroups(groups ...string) SetOption {
	return func(o *setOptions) {
		for _, g := range groups {
			if !slices.Contains(o.groups, g) {
				o.groups = append(o.groups, g)
			}
		}
	}
}

// groupState is what the cache knows of groups.
type groupState struct {
	// used is set once this process has met groups (InGroups,
	// InvalidateGroups, StoreWith, or a grouped value read): from then on
	// a load reads the group sequence before it calls its loader, which
	// it needs to store a value in a group.
	used atomic.Bool
	// checks numbers the checks of a grouped value's groups: a read's
	// (checkGroups), and a load's once its loader has returned (raced).
	// A caller that began after the check its value passed began does
	// not take that value (result.lateFor).
	checks atomic.Uint64

	remote *remote
	pols   *policies
	owed   *owed.Ledger // a group whose invalidation is owed is not trusted
	marks  *marks       // the near caches' marks; nil: no near cache
}

// seqLua holds the Lua functions the groups' scripts use the sequence
// (KEYS[1]) with: seq() reads it, as a string of digits, and bump()
// increments it. A sequence that seq() finds missing, or that bump()'s
// INCR makes 1 (it was missing, or 0, as writers before issue 34 read a
// missing one), was never made or was lost: it is made first as the
// server's clock (TIME) in microseconds. clock() gives that as digits
// built from TIME's strings, never as a Lua number, which Redis may
// print with an exponent. (Scripts are replicated by their effects: the
// SET of what the clock read, not TIME.)
const seqLua = `
local function clock()
  local t = redis.call('TIME')
  return t[1] .. string.format('%06d', tonumber(t[2]))
end
local function seq()
  local s = redis.call('GET', KEYS[1])
  if not s then
    s = clock()
    redis.call('SET', KEYS[1], s)
  end
  return s
end
local function bump()
  local s = redis.call('INCR', KEYS[1])
  if s == 1 then
    redis.call('SET', KEYS[1], clock())
    s = redis.call('INCR', KEYS[1])
  end
  return s
end
`

// invalidateScript is InvalidateGroups: KEYS[1] is the sequence, the
// others are the groups' records, all in one slot. It returns the new
// sequence.
var invalidateScript = redis.NewScript(seqLua + `
local s = bump()
for i = 2, #KEYS do redis.call('DEL', KEYS[i]) end
return s`)

// stampScript readies the groups' records for a grouped write: KEYS[1] is
// the sequence, the others the groups' records. A record missing is made
// at the current sequence; a record's expiry is extended to twice ARGV[1]
// ms when it has less than ARGV[1] left (ARGV[1] = 0: the value has no
// expiry, and neither has the record). It returns the current sequence
// (remade if missing, seqLua), then each record's sequence. With no
// record, it is the read of the sequence of a load that found it missing
// (groupSeq).
var stampScript = redis.NewScript(seqLua + `
local str = seq()
local s = tonumber(str)
local keep = tonumber(ARGV[1])
local out = {s}
for i = 2, #KEYS do
  local c = redis.call('GET', KEYS[i])
  if not c then
    if keep > 0 then redis.call('SET', KEYS[i], str, 'PX', 2 * keep) else redis.call('SET', KEYS[i], str) end
    c = s
  else
    c = tonumber(c)
    local t = redis.call('PTTL', KEYS[i])
    if keep == 0 then
      if t >= 0 then redis.call('PERSIST', KEYS[i]) end
    elseif t >= 0 and t < keep then
      redis.call('PEXPIRE', KEYS[i], 2 * keep)
    end
  end
  out[#out + 1] = c
end
return out`)

// invalidateGroups is InvalidateGroups.
func (c *cache) invalidateGroups(ctx context.Context, groups []string) error {
	groups = dedupe(groups)
	if len(groups) == 0 {
		return nil
	}
	if err := c.life.begin(opGroups, groupKey(groups[0])); err != nil {
		return err
	}
	defer c.life.Exit()
	c.groups.used.Store(true)
	keys := make([]string, len(groups))
	for i, g := range groups {
		keys[i] = groupKey(g)
	}
	// This process at once: its near caches drop the groups' members,
	// and no call that starts from now on shares a read or a load begun
	// before, whether or not Redis takes the invalidation.
	defer c.changed(groupsWritten, keys...)
	w := owed.Write{Op: opGroups, Keys: keys}
	errs := c.owed.Write(ctx, &w, func() []error {
		err := c.remote.roundTrip(ctx, opGroups, groupSeqKey, c.pols.base, true, func(ctx context.Context) error {
			return runGroupScript(ctx, c.remote.rdb, invalidateScript, keys).Err()
		})
		out := make([]error, len(keys))
		for i := range out {
			out[i] = err
		}
		return out
	})
	return errors.Join(dedupeErrs(errs)...)
}

// dedupeErrs drops the copies of one error: the one script's failure is
// every group's.
func dedupeErrs(errs []error) []error {
	var out []error
	for _, e := range errs {
		if e != nil && !slices.ContainsFunc(out, func(o error) bool { return o.Error() == e.Error() }) {
			out = append(out, e)
		}
	}
	return out
}

// runGroupScript runs a script on the sequence and the records keys, by
// EVALSHA, or EVAL where the node has not seen it.
func runGroupScript(ctx context.Context, rdb redis.Cmdable, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	all := append([]string{groupSeqKey}, keys...)
	cmd := s.EvalSha(ctx, rdb, all, args...)
	if isNoScript(cmd.Err()) {
		cmd = s.Eval(ctx, rdb, all, args...)
	}
	return cmd
}

// stamp readies the records of groups for a grouped write whose values
// live up to keep (Off: without expiry), and returns the current sequence
// and each group's record's sequence.
func (g *groupState) stamp(ctx context.Context, op, key string, groups []string, keep time.Duration) (seq uint64, recs map[string]uint64, err error) {
	g.used.Store(true)
	keys := make([]string, len(groups))
	for i, g := range groups {
		keys[i] = groupKey(g)
	}
	ms := int64(0)
	if keep != Off {
		ms = max(keep.Milliseconds(), 1)
	}
	var cmd *redis.Cmd
	err = g.remote.roundTrip(ctx, op, groupSeqKey, g.pols.of(key), true, func(ctx context.Context) error {
		cmd = runGroupScript(ctx, g.remote.rdb, stampScript, keys, ms)
		return cmd.Err()
	})
	if err != nil {
		return 0, nil, err
	}
	vals, err := cmd.Int64Slice()
	if err != nil || len(vals) != len(groups)+1 {
		return 0, nil, keyErr(op, key, redisErr(fmt.Errorf("groups: unexpected reply %v (%v)", cmd.Val(), err)))
	}
	recs = make(map[string]uint64, len(groups))
	for i, g := range groups {
		recs[g] = uint64(vals[i+1])
	}
	return uint64(vals[0]), recs, nil
}

// groupSeq reads the group sequence, for a load about to call its loader.
// A sequence missing is remade (stampScript, with no record), as the
// load's own stamp would remake it after the loader returned: read as 0,
// every record that stamp makes would be above it, and the load would
// race itself (raced) and call its loader again. The GET alone is the
// common case.
func (g *groupState) groupSeq(ctx context.Context, key string) (uint64, error) {
	var s string
	err := g.remote.roundTrip(ctx, opGet, groupSeqKey, g.pols.of(key), true, func(ctx context.Context) error {
		var err error
		s, err = g.remote.rdb.Get(ctx, groupSeqKey).Result()
		return err
	})
	if err == redis.Nil {
		seq, _, err := g.stamp(ctx, opGet, key, nil, Off)
		return seq, err
	}
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, keyErr(opGet, key, redisErr(fmt.Errorf("group sequence %q: %w", s, err)))
	}
	return n, nil
}

// wrap puts stored in an envelope, when it has groups or a TTL of its
// own to record.
func wrap(stored []byte, e codec.Envelope) ([]byte, error) {
	if e.Groups == nil && e.TTL <= 0 {
		return stored, nil
	}
	return codec.AppendEnvelope(make([]byte, 0, len(stored)+32), e, stored)
}

// envelopeTTL is the TTL a value records in its envelope: a TTL of its
// own, when the policy refreshes values (RefreshAfter counts from it).
func envelopeTTL(p *policy, so setOptions) time.Duration {
	if so.ttlSet && so.ttl != Off && p.refreshAfter > 0 {
		return so.ttl
	}
	return 0
}

// The state of a grouped value's groups, as checkGroups finds it.
type groupCheck uint8

const (
	groupsUnchecked groupCheck = iota // not a grouped value, or not checked
	groupsCurrent                     // every group's record is there, at most the value's sequence
	groupsInvalid                     // a group was invalidated since the value's writer began
	groupsFailed                      // Redis did not answer: err says why
	groupsOwed                        // this process owes an invalidation of a group (ErrPending)
)

// A groupedReply is what checkGroups learns of a reply holding an
// envelope.
type groupedReply struct {
	env   codec.Envelope
	inner string // the value the envelope holds
	err   error  // a malformed envelope (or one with a field unknown here)
	check groupCheck
	cerr  error        // groupsFailed: why
	marks groupTickets // the groups' near-cache marks, taken before the check was sent
	// checked numbers the check (groupState.checks): a call that began
	// after it began does not take the value (result.lateFor).
	checked uint64
}

// checkGroups parses the envelopes among rps and checks the groups of
// those that have any against Redis, with one MGET for them all.
func (gs *groupState) checkGroups(ctx context.Context, rps []reply) {
	var idx []int
	var keys []string
	for i := range rps {
		rp := &rps[i]
		if rp.err != nil || len(rp.s) == 0 || rp.s[0] != codec.HeaderExtended {
			continue
		}
		gs.used.Store(true)
		g := &groupedReply{}
		rp.grouped = g
		env, inner, err := codec.ParseEnvelope(bytesOf(rp.s))
		if err != nil {
			g.err = err
			continue
		}
		g.env, g.inner = env, rp.s[len(rp.s)-len(inner):]
		if env.Groups == nil {
			g.check = groupsCurrent
			continue
		}
		if slices.ContainsFunc(env.Groups, func(gr string) bool { return gs.owed.Has(groupKey(gr)) }) {
			g.check = groupsOwed
			continue
		}
		if gs.marks != nil {
			g.marks = gs.marks.takeGroups(env.Groups) // before the check is sent
		}
		idx = append(idx, i)
		for _, gr := range env.Groups {
			if k := groupKey(gr); !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	if len(idx) == 0 {
		return
	}
	checked := gs.checks.Add(1) // before the check is sent
	var vals []any
	err := gs.remote.roundTrip(ctx, opGet, groupSeqKey, gs.pols.base, true, func(ctx context.Context) error {
		var err error
		vals, err = gs.remote.rdb.MGet(ctx, keys...).Result()
		return err
	})
	recs := make(map[string]uint64, len(keys))
	if err == nil {
		for i, v := range vals {
			if s, ok := v.(string); ok {
				if n, perr := strconv.ParseUint(s, 10, 64); perr == nil {
					recs[keys[i]] = n
				}
			}
		}
	}
	for _, i := range idx {
		g := rps[i].grouped
		if err != nil {
			g.check, g.cerr = groupsFailed, err
			continue
		}
		g.check, g.checked = groupsCurrent, checked
		for _, gr := range g.env.Groups {
			if n, ok := recs[groupKey(gr)]; !ok || n > g.env.Seq {
				g.check = groupsInvalid
				break
			}
		}
	}
}

// judgeGrouped is judge for a reply holding an envelope: what its groups
// say, then what the value inside means.
func (fm *form) judgeGrouped(key string, p *policy, rp reply, readThrough bool) judgement {
	g := rp.grouped
	var j judgement
	switch {
	case g == nil || g.err != nil:
		err := codec.ErrEnvelope
		if g != nil {
			err = g.err
		}
		atomic.AddUint64(&p.stats.DecodeErrors, 1)
		j = judgement{v: vUndecodable, err: keyErr("get", key, err), left: rp.left}
	case g.check == groupsFailed:
		return judgement{v: vUnavailable, err: g.cerr}
	case g.check == groupsOwed:
		return judgement{v: vOwed}
	case g.check == groupsInvalid:
		j = judgement{v: vInvalid, left: rp.left}
	case g.check == groupsCurrent:
		in := rp
		in.s, in.grouped, in.ttl = g.inner, nil, g.env.TTL
		j = fm.judge(key, p, in, readThrough)
		switch j.v {
		case vLease, vMiss, vUnavailable, vCancelled:
			// An envelope holds a value, never a lease: not reached.
			return judgement{v: vUndecodable, err: keyErr("get", key, codec.ErrEnvelope), left: rp.left}
		}
		j.groups = g.env.Groups
		j.marks = g.marks
		// Not for a call that began after the check began, nor held for
		// the share window: a group may have been invalidated since.
		j.r.checked, j.r.unshared = g.checked, true
		if j.digest != "" {
			j.digest = digest(rp.s) // the stored bytes, as the guarded store compares them
		}
		return j
	default:
		return judgement{v: vUnavailable, err: keyErr("get", key, redisErr(errors.New("groups not checked")))}
	}
	if rp.left >= 0 {
		j.expires = rp.sent.Add(rp.left)
	}
	if readThrough {
		j.digest = digest(rp.s)
	}
	return j
}

// groupTickets are the near-cache marks of a value's groups, taken before
// the read that checked them was sent: the value enters and stays in a
// near cache only while they hold.
type groupTickets struct {
	stripes []uint32
	vals    []uint64
}

func (m *marks) groupStripe(g string) uint32 {
	return uint32(maphash.String(m.seed, g) % stripes)
}

// takeGroups takes the marks of groups.
func (m *marks) takeGroups(groups []string) groupTickets {
	t := groupTickets{stripes: make([]uint32, len(groups)), vals: make([]uint64, len(groups))}
	for i, g := range groups {
		t.stripes[i] = m.groupStripe(g)
		t.vals[i] = m.groups[t.stripes[i]].Load()
	}
	return t
}

// groupsValid reports whether no group of t changed since t was taken.
func (m *marks) groupsValid(t groupTickets) bool {
	for i, s := range t.stripes {
		if m.groups[s].Load() != t.vals[i] {
			return false
		}
	}
	return true
}

// touchGroup records a change of g's record.
func (m *marks) touchGroup(g string) { m.groups[m.groupStripe(g)].Add(1) }

// StoreWith, called by a loader with the context it was given, sets how
// the value it returns for key is stored: SetTTL(d) stores it for d (Off:
// without expiry) instead of the policy's TTL, and InGroups puts it in
// groups. A later call for the same key adds to, or replaces, what an
// earlier one set. With a batch loader (GetOrLoadMany) it applies to the
// one key named.
//
// The policy's jitter and StaleFor apply to the TTL chosen as to the
// policy's; a near-cache entry ends with it; RefreshAfter counts from it
// (the value's envelope records it). A loader that returns ErrNotFound
// for key after StoreWith(ctx, key, SetTTL(d)) has the answer remembered
// for d, even without a NegativeTTL; InGroups applies to that answer too.
// DoNotCache still stores nothing.
//
// StoreWith returns an error matching ErrNotLoading, and changes nothing,
// when ctx is not the context of a load of key that is still running: a
// call from outside a loader, for a key the load does not load, or after
// the loader returned. A TTL that is neither positive nor Off is an error
// too.
//
// WARNING: a load reads the group sequence before it calls its loader
// only once the process has met groups (InGroups, InvalidateGroups,
// StoreWith, or a grouped value read): the first load of a process that
// had not, whose loader puts its value in groups, reads the sequence
// then and calls its loader a second time, and stores and returns what
// that second call gives. A loader that must not be called twice for one
// load should have the process meet groups first (an InvalidateGroups of
// a group no value is in, at start-up). A load that finds, once its
// loader has returned, that one of the groups it named was invalidated
// since it read the sequence calls its loader again too (up to twice),
// so that no caller gets a value read before the invalidation.
func StoreWith(ctx context.Context, key string, opts ...SetOption) error {
	l, _ := ctx.Value(loadingKey{}).(*loading)
	for ; l != nil && !slices.Contains(l.keys, key); l = l.parent {
	}
	if l == nil {
		return keyErr("storewith", key, ErrNotLoading)
	}
	var so setOptions
	for _, o := range opts {
		o(&so)
	}
	if so.ttlSet {
		if err := checkTTL("SetTTL", so.ttl); err != nil {
			return keyErr("storewith", key, err)
		}
	}
	if len(so.groups) > 0 {
		if c, ok := l.cache.(*cache); ok {
			c.groups.used.Store(true)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return keyErr("storewith", key, ErrNotLoading)
	}
	if l.opts == nil {
		l.opts = map[string]setOptions{}
	}
	cur := l.opts[key]
	if so.ttlSet {
		cur.ttl, cur.ttlSet = so.ttl, true
	}
	for _, g := range so.groups {
		if !slices.Contains(cur.groups, g) {
			cur.groups = append(cur.groups, g)
		}
	}
	l.opts[key] = cur
	return nil
}

// errNoGroupSeq is the group sequence of a load that did not read it:
// the process had not met groups when the load began.
var errNoGroupSeq = errors.New("packcache: the load began before this process met groups: it read no group sequence")

// grouped reports whether a load's loader, which returned err, put
// values in groups (StoreWith) that the load would store.
func (l *loadRun) grouped(opts map[string]setOptions, err error) bool {
	if err != nil && !errors.Is(err, ErrNotFound) {
		return false // a failure or DoNotCache: nothing is stored
	}
	for _, so := range opts {
		if len(so.groups) > 0 {
			return true
		}
	}
	return false
}

// again calls fn for keys again: for a load that began before this
// process met groups, and so read no group sequence, and whose loader
// put values in groups (it met them then); or for one that raced an
// invalidation of its groups (raced). It reads the sequence,
// then calls fn under a context marked anew (StoreWith works again), and
// returns what that call returned, the options it set, and the sequence
// (and the error reading it).
// Its values are stored as any load's; the first call's are dropped. If
// the sequence cannot be read, the first call's outcome stands, and its
// grouped values go to the callers unstored.
func (l *loadRun) again(ctx context.Context, fn loadFunc, keys []string, vals map[string]any, opts map[string]setOptions, err error) (map[string]any, map[string]setOptions, uint64, error, error) {
	seq, serr := l.c.groups.groupSeq(ctx, keys[0])
	if serr != nil {
		return vals, opts, 0, serr, err
	}
	l.stamped = nil
	first := loadingOf(ctx)
	ctx = context.WithValue(ctx, loadingKey{}, &loading{cache: first.cache, keys: first.keys, parent: first.parent})
	vals, err = singleflight.Protect(ctx, fn, keys, callLoadFunc, panicError)
	return vals, loadingOf(ctx).storeOptions(), seq, nil, err
}

// maxRaced is how many times a load calls its loader again when an
// invalidation of its groups raced it.
const maxRaced = 2

// A groupStamp is what readying the groups' records of a load's values
// found (stamp).
type groupStamp struct {
	groups []string
	recs   map[string]uint64
}

// raced readies the records of the groups the loader put values in, for
// the longest life those values may have, as the store would (envelop
// uses what it found), and reports whether one of the groups was
// invalidated after the load read seq: its record is gone, or was made
// anew since. The load then calls its loader again (again): its values
// would not be stored, and the callers that joined the load after the
// invalidation must not get them. (A caller that joins between this
// check and the load's end does not take its values either: it reads
// again, see lateFor.)
func (l *loadRun) raced(ctx context.Context, keys []string, seq uint64, opts map[string]setOptions, err error) bool {
	l.stamped = nil
	if !l.grouped(opts, err) {
		return false
	}
	var groups []string
	keep := time.Duration(0)
	for i := range l.jobs {
		j := &l.jobs[i]
		so := opts[j.key]
		if !j.load || len(so.groups) == 0 {
			continue
		}
		for _, g := range so.groups {
			if !slices.Contains(groups, g) {
				groups = append(groups, g)
			}
		}
		// The longest a value or a tombstone of the key may live: jitter
		// only shortens it (expiry).
		ttl := j.p.ttl
		if ttl != Off {
			ttl = max(ttl, j.p.negativeTTL)
		}
		if so.ttlSet {
			ttl = so.ttl
		}
		if ttl == Off || keep == Off {
			keep = Off
		} else {
			keep = max(keep, ttl+j.p.staleFor)
		}
	}
	if len(groups) == 0 {
		return false
	}
	l.checked = l.c.groups.checks.Add(1) // before the check is sent
	_, recs, serr := l.c.groups.stamp(ctx, "load", keys[0], groups, keep)
	if serr != nil {
		return false // envelop tries again, and reports
	}
	l.stamped = &groupStamp{groups: groups, recs: recs}
	return slices.ContainsFunc(groups, func(g string) bool { return recs[g] > seq })
}

// envelop puts the load's writes that the loader placed in groups (or
// gave a TTL of their own to record) in their envelopes, with seq, the
// group sequence read before the loader was called (seqErr: not read).
// A grouped write is dropped when seq is not known, or when a group's
// record was made after seq (the group was invalidated after the load
// began, or the record was made anew since): its value goes to the
// callers, unstored.
func (l *loadRun) envelop(ctx context.Context, writes []pendingWrite, seq uint64, seqErr error) []pendingWrite {
	c := l.c
	var groups []string
	keep := time.Duration(0)
	for _, w := range writes {
		for _, g := range w.so.groups {
			if !slices.Contains(groups, g) {
				groups = append(groups, g)
			}
		}
		if len(w.so.groups) > 0 && keep != Off {
			if w.ttl == Off {
				keep = Off
			} else {
				keep = max(keep, w.ttl)
			}
		}
	}
	var recs map[string]uint64
	err := seqErr
	switch {
	case len(groups) == 0 || err != nil:
	case l.stamped != nil && !slices.ContainsFunc(groups, func(g string) bool { return !slices.Contains(l.stamped.groups, g) }):
		recs = l.stamped.recs // readied by raced, for a life no shorter
	default:
		_, recs, err = c.groups.stamp(ctx, "load", writes[0].key, groups, keep)
	}
	out := writes[:0]
	for _, w := range writes {
		j := &l.jobs[w.job]
		e := codec.Envelope{TTL: envelopeTTL(j.p, w.so)}
		if len(w.so.groups) > 0 {
			if err != nil {
				c.tel.report(ctx, w.key, keyErr("load", w.key, fmt.Errorf("not stored in groups %q: %w", w.so.groups, err)))
				w.enc.release()
				continue
			}
			if slices.ContainsFunc(w.so.groups, func(g string) bool { return recs[g] > seq }) {
				atomic.AddUint64(&j.p.stats.Superseded, 1)
				j.kept = true
				w.enc.release()
				continue
			}
			e.Groups, e.Seq = w.so.groups, seq
		}
		stored, werr := wrap(w.stored, e)
		if werr != nil {
			c.tel.report(ctx, w.key, keyErr("load", w.key, werr))
			w.enc.release()
			continue
		}
		w.stored = stored
		out = append(out, w)
	}
	return out
}

// groupStored is the bytes a Set of key stores: stored itself, or, in
// groups (or with a TTL of its own to record), in its envelope, once the
// groups' records are readied for a value living ttl.
func (g *groupState) groupStored(ctx context.Context, key string, p *policy, so setOptions, stored []byte, ttl time.Duration) ([]byte, error) {
	e := codec.Envelope{TTL: envelopeTTL(p, so)}
	if len(so.groups) > 0 {
		seq, _, err := g.stamp(ctx, "set", key, so.groups, ttl)
		if err != nil {
			return stored, err
		}
		e.Groups, e.Seq = so.groups, seq
	}
	out, err := wrap(stored, e)
	if err != nil {
		return stored, keyErr("set", key, err)
	}
	return out, nil
}

// groupStoredMany is groupStored for SetMany: the groups' records are
// readied once, for the longest-lived value, and stored[i] replaced by
// what key i stores.
func (g *groupState) groupStoredMany(ctx context.Context, keys []string, so setOptions, stored [][]byte, ttls []time.Duration) error {
	if len(keys) == 0 {
		return nil
	}
	var seq uint64
	if len(so.groups) > 0 {
		keep := time.Duration(0)
		for _, t := range ttls {
			if t == Off || keep == Off {
				keep = Off
			} else {
				keep = max(keep, t)
			}
		}
		var err error
		if seq, _, err = g.stamp(ctx, "set", keys[0], so.groups, keep); err != nil {
			return err
		}
	}
	for i, k := range keys {
		e := codec.Envelope{TTL: envelopeTTL(g.pols.of(k), so)}
		if len(so.groups) > 0 {
			e.Groups, e.Seq = so.groups, seq
		}
		out, err := wrap(stored[i], e)
		if err != nil {
			return keyErr("set", k, err)
		}
		stored[i] = out
	}
	return nil
}
