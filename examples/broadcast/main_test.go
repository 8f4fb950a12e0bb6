package main

import (
	"context"
	"encoding/json"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/packcache/packcache/internal/redistest"
)

// checkRounds checks what coalescing, and its absence, did in rep's rounds.
func checkRounds(t *testing.T, cfg config, rep report) {
	t.Helper()
	for _, r := range rep.Rounds {
		want := int64(cfg.Students)
		if r.Mode == modeOff {
			want = int64(cfg.Uncoalesced)
		}
		if r.Errors != 0 || r.Requests != want {
			t.Errorf("%s %s: %d of %d requests failed (want %d requests): %v", r.Mode, r.Round, r.Errors, r.Requests, want, r.FirstErr)
		}
	}
	m := int64(cfg.Channels)
	round := func(mode, name string) roundResult {
		t.Helper()
		r, ok := rep.round(mode, name)
		if !ok {
			t.Fatalf("no %s %s round", mode, name)
		}
		return r
	}
	onCold, onWarm := round(modeOn, "cold"), round(modeOn, "warm")
	// Students share a GET while it is in flight or within the share
	// window after it, so how many GETs a round makes depends on how long
	// the surge takes (longer under -race, on a busy machine): without
	// coalescing there would be one per student; require that at least
	// four share each.
	most := int64(cfg.Students) / 4
	if onCold.LoaderCalls != m {
		t.Errorf("coalescing, cold: %d loader calls, want one per channel (%d)", onCold.LoaderCalls, m)
	}
	if onCold.Gets < m || onCold.Gets > most {
		t.Errorf("coalescing, cold: %d GETs, want %d to %d", onCold.Gets, m, most)
	}
	if onWarm.LoaderCalls != 0 || onWarm.Gets < m || onWarm.Gets > most {
		t.Errorf("coalescing, warm: %d loader calls and %d GETs, want 0 and %d to %d", onWarm.LoaderCalls, onWarm.Gets, m, most)
	}
	if cfg.Uncoalesced > 0 {
		offCold, offWarm := round(modeOff, "cold"), round(modeOff, "warm")
		// Without coalescing every student reads Redis itself. How many
		// of them query the database too depends on how many miss before
		// the first query's lease is in Redis (they all start at once):
		// 6 to 90 of 100 in runs here, so only the bounds are certain.
		t.Logf("no coalescing, cold: %d loader calls, %d GETs", offCold.LoaderCalls, offCold.Gets)
		if offCold.Gets < int64(cfg.Uncoalesced) {
			t.Errorf("no coalescing, cold: %d GETs, want one per student (%d) at least", offCold.Gets, cfg.Uncoalesced)
		}
		if offCold.LoaderCalls < m || offCold.LoaderCalls > int64(cfg.Uncoalesced) {
			t.Errorf("no coalescing, cold: %d loader calls, want %d to %d", offCold.LoaderCalls, m, cfg.Uncoalesced)
		}
		if offWarm.LoaderCalls != 0 || offWarm.Gets != int64(cfg.Uncoalesced) {
			t.Errorf("no coalescing, warm: %d loader calls and %d GETs, want 0 and %d", offWarm.LoaderCalls, offWarm.Gets, cfg.Uncoalesced)
		}
	} else if _, ok := rep.round(modeOff, "cold"); ok {
		t.Error("a coalescing-off round ran with Uncoalesced 0")
	}
	if rep.Stored <= 0 || rep.Stored >= rep.PlainBytes/2 {
		t.Errorf("stored %d bytes for %d of JSON", rep.Stored, rep.PlainBytes)
	}
}

// checkHTTP checks the HTTP rounds: every request answered, zstd clients
// sent the stored frames at most 0.35× the bytes of Get + json.Encoder,
// and, with the near cache, without a Redis GET.
func checkHTTP(t *testing.T, cfg config, rep report, near bool) {
	t.Helper()
	if len(rep.HTTP) != len(httpModes) || rep.HTTPNear != near {
		t.Fatalf("%d HTTP rounds (near cache %v), want %d (%v)", len(rep.HTTP), rep.HTTPNear, len(httpModes), near)
	}
	for _, r := range rep.HTTP {
		if r.Errors != 0 || r.Requests != int64(cfg.HTTPRequests) || r.LoaderCalls != 0 {
			t.Errorf("%s, %s: %d of %d requests failed, %d loader calls: %v", r.Handler, r.Client, r.Errors, r.Requests, r.LoaderCalls, r.FirstErr)
		}
	}
	enc, z, gz, id := rep.HTTP[0], rep.HTTP[1], rep.HTTP[2], rep.HTTP[3]
	if enc.Coding != "" || z.Coding != "zstd" || gz.Coding != "gzip" || id.Coding != "" {
		t.Errorf("Content-Encodings %q, %q, %q, %q; want identity, zstd, gzip, identity", enc.Coding, z.Coding, gz.Coding, id.Coding)
	}
	if share := float64(z.WirePerRequest) / float64(enc.WirePerRequest); share > 0.35 {
		t.Errorf("zstd passthrough: %d bytes per request, %.2f× Get + json.Encoder's %d", z.WirePerRequest, share, enc.WirePerRequest)
	}
	if near && z.Gets != 0 {
		t.Errorf("Serve with the near cache: %d Redis GETs", z.Gets)
	}
}

// TestRun runs the example as the README's command does, on the embedded
// miniredis: the coalescing rounds, the smaller coalescing-off comparison,
// and the near round skipped because miniredis has no CLIENT TRACKING.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := config{Students: 200, Channels: 5, DBDelay: 100 * time.Millisecond, Codec: "zstd", Uncoalesced: 100, HTTPRequests: 200, HTTPClients: 8}
	var out strings.Builder
	rep, err := run(ctx, cfg, &out)
	if err != nil {
		t.Fatal(err)
	}
	checkRounds(t, cfg, rep)
	checkHTTP(t, cfg, rep, false)
	if len(rep.Rounds) != 4 {
		t.Errorf("got %d rounds, want 4 (coalescing on and off, cold and warm)", len(rep.Rounds))
	}
	if _, ok := rep.round(modeNear, "warm"); ok {
		t.Error("a near round ran on miniredis, which cannot keep a near cache fresh")
	}
	if !strings.Contains(rep.NearSkipped, "CLIENT TRACKING") {
		t.Errorf("near round skipped for %q, want the reason (CLIENT TRACKING)", rep.NearSkipped)
	}
	for _, want := range []string{"near cache: skipped", "miniredis", "coalescing off: 100 of the 200 students"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output does not say %q:\n%s", want, out.String())
		}
	}
}

// TestNearRound runs the example against a real redis-server: the near
// round serves every student from memory, without a Redis GET or a loader
// call, and the coalescing rounds behave as on miniredis. The program
// leaves the server as it found it.
func TestNearRound(t *testing.T) {
	s := redistest.Start(t)
	redistest.RequireReal(t, s, "the near cache needs CLIENT TRACKING, which miniredis lacks")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rdb := s.Client(t)
	if err := rdb.Set(ctx, "someone-else", "keep me", 0).Err(); err != nil {
		t.Fatal(err)
	}
	cfg := config{Students: 200, Channels: 5, DBDelay: 100 * time.Millisecond, Codec: "zstd", Uncoalesced: 100, RedisAddr: s.Addr(),
		HTTPRequests: 200, HTTPClients: 8}
	var out strings.Builder
	rep, err := run(ctx, cfg, &out)
	if err != nil {
		t.Fatal(err)
	}
	checkRounds(t, cfg, rep)
	if rep.NearSkipped != "" {
		t.Fatalf("near round skipped on redis-server: %s", rep.NearSkipped)
	}
	nr, ok := rep.round(modeNear, "warm")
	if !ok {
		t.Fatal("no near round")
	}
	if nr.Gets != 0 || nr.LoaderCalls != 0 {
		t.Errorf("near cache, warm: %d Redis GETs and %d loader calls, want none", nr.Gets, nr.LoaderCalls)
	}
	checkHTTP(t, cfg, rep, true)
	if strings.Contains(out.String(), "skipped") {
		t.Errorf("the output says something was skipped:\n%s", out.String())
	}
	if keys, err := rdb.Keys(ctx, "*").Result(); err != nil || !reflect.DeepEqual(keys, []string{"someone-else"}) {
		t.Errorf("keys left: %q, %v; want only someone-else's", keys, err)
	}
}

// TestUncoalesced: the coalescing-off rounds are skipped with 0, and never
// release more students than the others.
func TestUncoalesced(t *testing.T) {
	for _, tc := range []struct{ uncoalesced, rounds int }{{0, 2}, {1000, 4}} {
		cfg := config{Students: 100, Channels: 2, DBDelay: 100 * time.Millisecond, Codec: "zstd", Uncoalesced: tc.uncoalesced}
		var out strings.Builder
		rep, err := run(context.Background(), cfg, &out)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Rounds) != tc.rounds {
			t.Errorf("Uncoalesced %d: %d rounds, want %d", tc.uncoalesced, len(rep.Rounds), tc.rounds)
		}
		cfg.Uncoalesced = min(cfg.Uncoalesced, cfg.Students)
		checkRounds(t, cfg, rep)
		if tc.uncoalesced == 0 && !strings.Contains(out.String(), "coalescing off: skipped") {
			t.Errorf("Uncoalesced 0: the output does not say the rounds were skipped:\n%s", out.String())
		}
	}
}

func TestCodecs(t *testing.T) {
	for _, name := range []string{"lz4", "snappy", "none"} {
		rep, err := run(context.Background(), config{Students: 20, Channels: 2, DBDelay: time.Millisecond, Codec: name}, io.Discard)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if compressed := rep.Stored < rep.PlainBytes; compressed != (name != "none") {
			t.Errorf("%s: stored %d bytes for %d of JSON", name, rep.Stored, rep.PlainBytes)
		}
	}
}

func TestChannelsDeterministicAndSized(t *testing.T) {
	if !reflect.DeepEqual(newChannel(7), newChannel(7)) {
		t.Fatal("newChannel is not deterministic")
	}
	for i := range 50 {
		b, err := json.Marshal(newChannel(i))
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 35_000 || len(b) > 130_000 {
			t.Errorf("channel %d: %d bytes of JSON, want 35-130 KB", i, len(b))
		}
	}
}

// With REDIS_ADDR, the program must leave a Redis it did not start as it
// found it: its own keys deleted, everyone else's untouched.
func TestExternalRedisCleanedUp(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.Set("someone-else", "keep me")
	_, err := run(context.Background(), config{Students: 20, Channels: 3, DBDelay: time.Millisecond, Codec: "zstd", Uncoalesced: 20, RedisAddr: mr.Addr()}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if keys := mr.Keys(); !reflect.DeepEqual(keys, []string{"someone-else"}) {
		t.Errorf("keys left behind: %q", keys)
	}
}
