package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// grouped stores doc under key as packcache stores a value in groups
// (FORMAT.md section 2.4): zstd inside an envelope naming groups and the
// sequence seq, with a TTL field of ownTTL if not zero.
func grouped(t *testing.T, tg redistest.Target, key string, doc []byte, seq uint64, ownTTL time.Duration, groups ...string) []byte {
	t.Helper()
	v, err := codec.AppendEnvelope(nil, codec.Envelope{Groups: groups, Seq: seq, TTL: ownTTL}, encode(t, codec.ZstdDefault, doc))
	if err != nil {
		t.Fatal(err)
	}
	set(t, tg, time.Hour, map[string][]byte{key: v})
	return v
}

func inspectJSON(t *testing.T, tg redistest.Target, wantCode int, keys ...string) []keyReport {
	t.Helper()
	res := cli(t, with(tg, append([]string{"inspect", "--json"}, keys...)...)...)
	if res.code != wantCode {
		t.Fatalf("inspect %v: exit %d, want %d; stderr %q", keys, res.code, wantCode, res.stderr)
	}
	var reports []keyReport
	if err := json.Unmarshal([]byte(res.stdout), &reports); err != nil {
		t.Fatalf("--json output: %v\n%s", err, res.stdout)
	}
	return reports
}

// TestInvalidateGroups: invalidate --group deletes the groups' records
// and moves the sequence on, in one script, reading no member; inspect
// shows a grouped value's envelope, its groups and whether each is still
// current, before and after; and the groups' own keys.
func TestInvalidateGroups(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		doc := jsonDoc(1, 3000)
		// As a writer leaves them: the sequence at 7, the groups' records
		// made at 5 and 7, a value written at 7 in both.
		set(t, tg, 0, map[string][]byte{groupSeqKey: []byte("7"), groupPrefix + "user:42": []byte("5"), groupPrefix + "tenant:3": []byte("7")})
		stored := grouped(t, tg, "g:1", doc, 7, 2*time.Second, "user:42", "tenant:3")

		r := inspectJSON(t, tg, 0, "g:1")[0]
		e := r.Envelope
		if e == nil || e.Seq == nil || *e.Seq != 7 || !e.Current || len(e.Groups) != 2 || e.OwnTTL != 2000 {
			t.Fatalf("inspect before: envelope %+v", e)
		}
		if r.Kind != "zstd" || r.Stored != len(stored) || r.Decoded == nil || *r.Decoded != len(doc) {
			t.Errorf("inspect before: kind %s stored %d decoded %v; want the zstd value inside, %d bytes stored", r.Kind, r.Stored, r.Decoded, len(stored))
		}
		for _, g := range e.Groups {
			if g.State != "current" || g.Record == nil {
				t.Errorf("group %s before: %+v", g.Name, g)
			}
		}
		res := cli(t, with(tg, "inspect", "g:1")...)
		mustContain(t, res.stdout, "envelope", "0x0b", "sequence", "7 when it was written; 7 now", "user:42: current", "tenant:3: current", "all current: readers serve it", "own ttl")

		tg.ResetStats(t)
		res = cli(t, with(tg, "invalidate", "--group", "user:42", "--group", "nothing:here", "--group", "user:42")...)
		if res.code != 0 {
			t.Fatalf("invalidate: exit %d, stderr %q", res.code, res.stderr)
		}
		mustContain(t, res.stdout, "group sequence now 8", "user:42", "made at sequence 5, deleted", "nothing:here", "no record")
		// One script (EVALSHA, and EVAL where the node has not seen it),
		// plus the connection's PING; nothing that lists or reads members.
		// (Redis counts the commands a script runs: a GET and a DEL of
		// each of the two groups' records.)
		for _, c := range []string{"scan", "keys", "mget", "smembers", "sscan"} {
			if n := tg.CommandCount(t, c); n != 0 {
				t.Errorf("invalidate sent %s %d times", c, n)
			}
		}
		if n := tg.CommandCount(t, "get"); n > 2 {
			t.Errorf("invalidate ran %d GETs, want one per group's record", n)
		}
		if n := tg.CommandCount(t, "evalsha") + tg.CommandCount(t, "eval"); n < 1 || n > 2 {
			t.Errorf("invalidate sent %d scripts, want one (EVALSHA, then EVAL on NOSCRIPT)", n)
		}
		if n := tg.Client.Exists(ctx, groupPrefix+"user:42").Val(); n != 0 {
			t.Errorf("user:42's record is still there")
		}
		if s := string(get(t, tg, groupPrefix+"tenant:3")); s != "7" {
			t.Errorf("tenant:3's record is %q, want it untouched", s)
		}

		r = inspectJSON(t, tg, 0, "g:1")[0]
		e = r.Envelope
		if e == nil || e.Current || e.SeqNow == nil || *e.SeqNow != 8 {
			t.Fatalf("inspect after: envelope %+v", e)
		}
		for _, g := range e.Groups {
			want := map[string]string{"user:42": "invalidated", "tenant:3": "current"}[g.Name]
			if g.State != want {
				t.Errorf("group %s after: %s, want %s", g.Name, g.State, want)
			}
		}
		res = cli(t, with(tg, "inspect", "g:1")...)
		mustContain(t, res.stdout, "user:42: invalidated (no record", "tenant:3: current", "invalidated: readers treat it as a miss")

		// A record made anew after the invalidation, at 8: the value,
		// written at 7, stays invalidated.
		set(t, tg, 0, map[string][]byte{groupPrefix + "user:42": []byte("8")})
		res = cli(t, with(tg, "inspect", "g:1")...)
		mustContain(t, res.stdout, "user:42: invalidated (its record was made anew at sequence 8, after the value's 7")

		// The groups' own keys.
		res = cli(t, with(tg, "inspect", groupSeqKey, groupPrefix+"tenant:3")...)
		if res.code != 0 {
			t.Fatalf("inspect of the groups' keys: exit %d, %q", res.code, res.stderr)
		}
		mustContain(t, res.stdout, "the group sequence", "8 invalidations so far", `the record of group "tenant:3"`, "made at sequence 7 (the sequence is now 8)")
	})
}

// TestInvalidateRemakesLostSequence: invalidate --group, finding the
// group sequence missing (evicted, or lost in a restart of its node),
// remakes it from the server's clock in microseconds before moving it on
// (FORMAT.md section 2.4), never from 0: the values stored before the
// loss carry sequences a count begun again would reach.
func TestInvalidateRemakesLostSequence(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		start := uint64(time.Now().UnixMicro()) // the server's clock is this machine's
		res := cli(t, with(tg, "invalidate", "--group", "user:42")...)
		if res.code != 0 {
			t.Fatalf("invalidate: exit %d, stderr %q", res.code, res.stderr)
		}
		seq, err := strconv.ParseUint(string(get(t, tg, groupSeqKey)), 10, 64)
		if err != nil || seq <= start {
			t.Fatalf("the sequence remade as %d (%v), want above the clock's %d µs at the start", seq, err, start)
		}
		mustContain(t, res.stdout, "group sequence now "+strconv.FormatUint(seq, 10))
		res = cli(t, with(tg, "invalidate", "--group", "user:42")...)
		mustContain(t, res.stdout, "group sequence now "+strconv.FormatUint(seq+1, 10))
		res = cli(t, with(tg, "inspect", groupSeqKey)...)
		mustContain(t, res.stdout, "made from the server's clock ("+time.UnixMicro(int64(seq)).UTC().Format("2006-01-02T"))
	})
}

// TestInspectMalformedEnvelope: an envelope that runs past the value is
// corrupt, said with FORMAT.md's rule, and inspect exits 1.
func TestInspectMalformedEnvelope(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		set(t, tg, time.Hour, map[string][]byte{"g:bad": {0x0b, 0x20, 0x01}})
		r := inspectJSON(t, tg, exitFailure, "g:bad")[0]
		if r.Kind != "envelope" || r.Error == "" || !strings.Contains(r.FormatNote, "section 2.4") {
			t.Errorf("malformed envelope: kind %s error %q note %q", r.Kind, r.Error, r.FormatNote)
		}
	})
}

// TestInvalidateNeedsGroup: invalidate without --group, or with an
// argument, is a usage error that sends nothing.
func TestInvalidateNeedsGroup(t *testing.T) {
	for _, args := range [][]string{
		{"--addr", "127.0.0.1:1", "invalidate"},
		{"--addr", "127.0.0.1:1", "invalidate", "user:42"},
	} {
		if res := cli(t, args...); res.code != exitUsage {
			t.Errorf("%v: exit %d, want %d (%q)", args, res.code, exitUsage, res.stderr)
		}
	}
}
