package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := run(ctx, config{}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"zstd", "lz4", "snappy", "plain JSON"}
	if len(rep.Rows) != len(want) {
		t.Fatalf("got %d rows, want %d", len(rep.Rows), len(want))
	}
	for i, r := range rep.Rows {
		if !r.Equal {
			t.Errorf("%s: value read back differs", r.Options)
		}
		if !strings.HasPrefix(r.Codec, want[i]) {
			t.Errorf("%s: stored as %q, want %s", r.Options, r.Codec, want[i])
		}
		if r.Plain < 90_000 || r.Plain > 120_000 {
			t.Errorf("%s: document is %d bytes, want about 100 KB", r.Options, r.Plain)
		}
		if compressed := want[i] != "plain JSON"; compressed && r.Stored >= r.Plain/2 {
			t.Errorf("%s: stored %d of %d bytes", r.Options, r.Stored, r.Plain)
		} else if !compressed && r.Stored != r.Plain {
			t.Errorf("%s: stored %d bytes, want the %d of the JSON", r.Options, r.Stored, r.Plain)
		}
	}
	if !rep.SmallEqual || !strings.HasPrefix(rep.SmallRaw, `{"id":"cust-000123"`) {
		t.Errorf("small value: equal %v, stored %q", rep.SmallEqual, rep.SmallRaw)
	}
}

// With REDIS_ADDR, the program must leave a Redis it did not start as it
// found it: its own keys deleted, everyone else's untouched.
func TestExternalRedisCleanedUp(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.Set("someone-else", "keep me")
	if _, err := run(context.Background(), config{RedisAddr: mr.Addr()}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if keys := mr.Keys(); len(keys) != 1 || keys[0] != "someone-else" {
		t.Errorf("keys left behind: %q", keys)
	}
}
