package main

import (
	"context"
	"encoding/json"
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := config{Students: 200, Channels: 5, DBDelay: 10 * time.Millisecond, Codec: "zstd"}
	rep, err := run(ctx, cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rounds) != 4 {
		t.Fatalf("got %d rounds, want 4", len(rep.Rounds))
	}
	m := int64(cfg.Channels)
	for _, r := range rep.Rounds {
		if r.Errors != 0 || r.Requests != int64(cfg.Students) {
			t.Errorf("%s %s: %d of %d requests failed: %v", r.Mode, r.Round, r.Errors, r.Requests, r.FirstErr)
		}
	}
	onCold, onWarm, offCold, offWarm := rep.Rounds[0], rep.Rounds[1], rep.Rounds[2], rep.Rounds[3]
	if onCold.LoaderCalls != m {
		t.Errorf("coalescing, cold: %d loader calls, want one per channel (%d)", onCold.LoaderCalls, m)
	}
	if onCold.Gets < m || onCold.Gets > 4*m {
		t.Errorf("coalescing, cold: %d GETs, want %d to %d", onCold.Gets, m, 4*m)
	}
	if onWarm.LoaderCalls != 0 || onWarm.Gets < m || onWarm.Gets > 4*m {
		t.Errorf("coalescing, warm: %d loader calls and %d GETs, want 0 and %d to %d", onWarm.LoaderCalls, onWarm.Gets, m, 4*m)
	}
	if offCold.LoaderCalls <= m {
		t.Errorf("no coalescing, cold: %d loader calls, want more than %d", offCold.LoaderCalls, m)
	}
	if offWarm.LoaderCalls != 0 || offWarm.Gets != int64(cfg.Students) {
		t.Errorf("no coalescing, warm: %d loader calls and %d GETs, want 0 and %d", offWarm.LoaderCalls, offWarm.Gets, cfg.Students)
	}
	if rep.Stored <= 0 || rep.Stored >= rep.PlainBytes/2 {
		t.Errorf("stored %d bytes for %d of JSON", rep.Stored, rep.PlainBytes)
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
	_, err := run(context.Background(), config{Students: 20, Channels: 3, DBDelay: time.Millisecond, Codec: "zstd", RedisAddr: mr.Addr()}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if keys := mr.Keys(); !reflect.DeepEqual(keys, []string{"someone-else"}) {
		t.Errorf("keys left behind: %q", keys)
	}
}
