package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// A single-server cursor resumed on another server holding the same keys
// (after a Sentinel failover, or a restart that reloads the data): SCAN
// cursors are meaningless there, and keys are silently skipped.
func TestRecompressRefusesCursorOfAnotherServer(t *testing.T) {
	t.Parallel() // servers of its own
	// No diskless-sync delay: by default the master waits 5 s for more
	// replicas before it sends the first one its data.
	m := redistest.Start(t, "--repl-diskless-sync-delay", "0")
	redistest.RequireReal(t, m, "--replicaof")
	host, port, _ := strings.Cut(m.Addr(), ":")
	r := redistest.Start(t, "--replicaof", host, port)
	ctx := context.Background()
	mc, rc := m.Client(t), r.Client(t)
	const n = 5000
	p := mc.Pipeline()
	for i := range n {
		p.Set(ctx, fmt.Sprintf("c:%d", i), jsonDoc(i, 1500), time.Hour)
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for {
		sz, _ := rc.DBSize(ctx).Result()
		if sz == n {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The first run, on the master, got through some pages: what it
	// rewrote replicated. Simulate it with SCAN (the cursor it printed)
	// plus recompressing those keys on the master.
	var cur uint64
	done := map[string]bool{}
	for range 4 {
		keys, next, err := mc.Scan(ctx, cur, "c:*", 500).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			done[k] = true
		}
		cur = next
	}
	t.Logf("first run covered %d keys, cursor %d", len(done), cur)
	// Failover: the replica becomes the master.
	if err := rc.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	// The cursor as the first run printed it names the old master's
	// process; resumed on the new master it must be refused, changing
	// nothing, rather than skip keys silently.
	id, err := mc.Info(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	_, id, _ = strings.Cut(id, "run_id:")
	cursor := fmt.Sprintf("%d@%s", cur, id[:12])
	res := cli(t, "--addr", r.Addr(), "recompress", "--prefix", "c:", "--codec", "lz4", "--cursor", cursor)
	if res.code != exitUsage || !strings.Contains(res.stderr, "now server") {
		t.Fatalf("resuming another server's cursor: exit %d, %s", res.code, res.stderr)
	}
	gets := make([]*redis.StringCmd, n)
	if _, err := rc.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range gets {
			gets[i] = p.Get(ctx, fmt.Sprintf("c:%d", i))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, g := range gets {
		if v, _ := g.Bytes(); v[0] == codec.HeaderLZ4 {
			t.Fatal("the refused run changed a value")
		}
	}
}
