package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

func TestStats(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		// 40 plain values, 30 zstd, 20 lz4, 5 tombstones, 5 leases under
		// s:, half without expiry; a hash; 7 keys under other:.
		var wantStored, wantDecoded int64
		withTTL, noTTL := map[string][]byte{}, map[string][]byte{}
		add := func(i int, key string, v []byte, decoded int) {
			if i%2 == 0 {
				withTTL[key] = v
			} else {
				noTTL[key] = v
			}
			wantStored += int64(len(v))
			wantDecoded += int64(decoded)
		}
		for i := range 40 {
			doc := jsonDoc(i, 200+i*10)
			add(i, fmt.Sprintf("s:plain:%d", i), doc, len(doc))
		}
		for i := range 30 {
			doc := jsonDoc(i, 3000+i*100)
			add(i, fmt.Sprintf("s:zstd:%d", i), encode(t, codec.Zstd, doc), len(doc))
		}
		for i := range 20 {
			doc := jsonDoc(i, 2000+i*100)
			add(i, fmt.Sprintf("s:lz4:%d", i), encode(t, codec.LZ4, doc), len(doc))
		}
		for i := range 5 {
			add(i, fmt.Sprintf("s:tomb:%d", i), []byte{0x0e}, 0)
			add(i, fmt.Sprintf("s:lease:%d", i), []byte("\x0ctoken-token-tok"), 0)
		}
		set(t, tg, 100*time.Second, withTTL)
		set(t, tg, 0, noTTL)
		tg.Client.HSet(t.Context(), "s:hash", "f", "v")
		for i := range 7 {
			set(t, tg, 0, map[string][]byte{fmt.Sprintf("other:%d", i): []byte(`"x"`)})
		}
		set(t, tg, 0, map[string][]byte{"nocolon": []byte(`1`)})
		tg.ResetStats(t)

		// A sample as large as the prefix makes the estimates exact.
		res := cli(t, with(tg, "stats", "--prefix", "s:", "--sample", "1000", "--count", "7", "--json")...)
		if res.code != 0 {
			t.Fatalf("exit %d", res.code)
		}
		var groups []group
		if err := json.Unmarshal([]byte(res.stdout), &groups); err != nil {
			t.Fatal(err)
		}
		if len(groups) != 1 {
			t.Fatalf("%d groups, want 1", len(groups))
		}
		g := groups[0]
		if g.Prefix != "s:" || g.Keys != 100 || g.NotStrings != 1 {
			t.Errorf("prefix %q keys %d not strings %d; want s:, 100, 1", g.Prefix, g.Keys, g.NotStrings)
		}
		if g.Stored != wantStored {
			t.Errorf("stored %d, want %d", g.Stored, wantStored)
		}
		if d := g.DecodedEst - wantDecoded; d < -2 || d > 2 {
			t.Errorf("decoded estimate %d, want %d (every value sampled)", g.DecodedEst, wantDecoded)
		}
		if g.MemoryEst < g.Stored {
			t.Errorf("memory estimate %d under the stored bytes %d", g.MemoryEst, g.Stored)
		}
		mix := map[string]int64{}
		for _, m := range g.Mix {
			mix[m.Codec] = m.Keys
		}
		if fmt.Sprint(mix) != "map[lease:5 lz4:20 plain:40 tombstone:5 zstd:30]" {
			t.Errorf("codec mix %v", mix)
		}
		if g.PlainKeys != 40 {
			t.Errorf("%d plain keys, want 40", g.PlainKeys)
		}
		if g.TTL.WithExpiry != 51 || g.TTL.WithoutExpiry != 49 || !g.TTL.Exact {
			t.Errorf("TTL: %d with expiry, %d without, exact %v; want 51, 49, true", g.TTL.WithExpiry, g.TTL.WithoutExpiry, g.TTL.Exact)
		}
		if g.TTL.MinMillis <= 0 || g.TTL.MaxMillis > 100_000 || g.TTL.MinMillis > g.TTL.P50Millis || g.TTL.P50Millis > g.TTL.P90Millis || g.TTL.P90Millis > g.TTL.MaxMillis {
			t.Errorf("TTL spread out of order or range: %+v", g.TTL)
		}
		if g.Sampled != 100 || g.Undecodable != 0 {
			t.Errorf("sampled %d, undecodable %d; want 100, 0", g.Sampled, g.Undecodable)
		}

		// Without --prefix: grouped by the leading segment.
		res = cli(t, with(tg, "stats", "--sample", "10")...)
		if res.code != 0 {
			t.Fatalf("exit %d", res.code)
		}
		mustContain(t, res.stdout, "s:  100 keys", "other:  7 keys", "(no colon)  1 key\n", "codec mix", "zstd 30 (30.0%)", "no expiry")
		if strings.Index(res.stdout, "s:  100") > strings.Index(res.stdout, "other:") {
			t.Error("groups not sorted by stored bytes")
		}
		checkReadOnly(t, tg)

		// Progress goes to stderr when asked for.
		res = cli(t, with(tg, "stats", "--prefix", "other:", "--progress")...)
		if !strings.Contains(res.stderr, "keys") {
			t.Errorf("--progress drew nothing on stderr: %q", res.stderr)
		}
		if strings.Contains(res.stdout, "\r") {
			t.Error("progress on stdout")
		}
	})
}

func TestStatsSampleEstimates(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		// 300 zstd values, 30 sampled: the decoded estimate scales the
		// sample's ratio and must land near the truth.
		var want int64
		kv := map[string][]byte{}
		for i := range 300 {
			doc := jsonDoc(i, 1000+i*20)
			kv[fmt.Sprintf("e:%d", i)] = encode(t, codec.Zstd, doc)
			want += int64(len(doc))
		}
		set(t, tg, 0, kv)
		res := cli(t, with(tg, "stats", "--prefix", "e:", "--sample", "30", "--json")...)
		var groups []group
		if err := json.Unmarshal([]byte(res.stdout), &groups); err != nil || len(groups) != 1 {
			t.Fatalf("exit %d, %v", res.code, err)
		}
		g := groups[0]
		if g.Sampled != 30 {
			t.Errorf("sampled %d, want 30", g.Sampled)
		}
		if r := float64(g.DecodedEst) / float64(want); r < 0.8 || r > 1.2 {
			t.Errorf("decoded estimate %d is %.2f of the true %d", g.DecodedEst, r, want)
		}
	})
}
