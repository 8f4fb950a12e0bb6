package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// closedAddr returns a 127.0.0.1 address nothing listens on.
func closedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// A badCase is a command line that must fail: its exit code and a part of
// its message.
type badCase struct {
	name string
	args []string // with the target's connection flags unless they connect on their own
	own  bool
	code int
	msg  string
}

// checkBad runs c and checks its exit code and message.
func checkBad(t *testing.T, c badCase, args []string) {
	t.Helper()
	res := cli(t, args...)
	if res.code != c.code {
		t.Errorf("%s: exit %d, want %d", c.name, res.code, c.code)
	}
	if !strings.Contains(res.stderr, c.msg) {
		t.Errorf("%s: stderr %q lacks %q", c.name, res.stderr, c.msg)
	}
}

// TestBadConnection runs the command lines that name where to connect
// wrongly, or name a server that is not there: each must exit non-zero
// with a message. They need no server, so they run once, side by side
// (each unreachable one spends go-redis's dial retries, over a second).
func TestBadConnection(t *testing.T) {
	t.Parallel()
	down := closedAddr(t)
	for _, c := range []badCase{
		{"unreachable stats", []string{"--addr", down, "stats"}, true, exitFailure, "cannot reach Redis"},
		{"unreachable inspect", []string{"--addr", down, "inspect", "b:1"}, true, exitFailure, "cannot reach Redis"},
		{"unreachable advise", []string{"--addr", down, "advise", "--prefix", "b:"}, true, exitFailure, "cannot reach Redis"},
		{"unreachable recompress", []string{"--addr", down, "recompress", "--prefix", "b:", "--codec", "zstd"}, true, exitFailure, "cannot reach Redis"},
		{"unreachable cluster", []string{"--cluster", "--addr", down, "stats"}, true, exitFailure, "cannot reach Redis"},
		{"bad URL scheme", []string{"--url", "http://" + down, "stats"}, true, exitUsage, "invalid URL scheme"},
		{"bad URL database", []string{"--url", "redis://" + down + "/zero", "stats"}, true, exitUsage, "invalid database number"},
		{"bad URL option", []string{"--url", "redis://" + down + "?colour=blue", "stats"}, true, exitUsage, "colour"},
		{"URL and addr", []string{"--url", "redis://" + down, "--addr", down, "stats"}, true, exitUsage, "either --url or --addr"},
		{"two addrs", []string{"--addr", down, "--addr", closedAddr(t), "stats"}, true, exitUsage, "add --cluster"},
		{"cluster and sentinel", []string{"--cluster", "--sentinel-master", "m", "--addr", down, "stats"}, true, exitUsage, "exclude each other"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			checkBad(t, c, c.args)
		})
	}
}

// TestBadInput runs every kind of bad input against a server holding
// data: each must exit non-zero with a message, and change nothing.
func TestBadInput(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		kv := map[string][]byte{}
		for i := range 20 {
			kv[fmt.Sprintf("b:%d", i)] = jsonDoc(i, 3000)
		}
		set(t, tg, time.Hour, kv)
		tg.Client.HSet(t.Context(), "b:hash", "f", "v")
		before := snapshot(t, tg)

		down := closedAddr(t)
		cases := []badCase{
			{"unknown codec", []string{"recompress", "--prefix", "b:", "--codec", "brotli"}, false, exitUsage, `unknown codec "brotli"`},
			{"zstd level", []string{"recompress", "--prefix", "b:", "--codec", "zstd", "--level", "23"}, false, exitUsage, "zstd levels are 1-22"},
			{"lz4 level", []string{"recompress", "--prefix", "b:", "--codec", "lz4", "--level", "10"}, false, exitUsage, "lz4 levels"},
			{"snappy level", []string{"recompress", "--prefix", "b:", "--codec", "snappy", "--level", "1"}, false, exitUsage, "no levels"},
			{"threshold", []string{"recompress", "--prefix", "b:", "--codec", "zstd", "--compress-above", "-1"}, false, exitUsage, "--compress-above"},
			{"rate", []string{"recompress", "--prefix", "b:", "--codec", "zstd", "--rate", "fast"}, false, exitUsage, "--rate"},
			{"cursor", []string{"recompress", "--prefix", "b:", "--codec", "zstd", "--cursor", "yesterday"}, false, exitUsage, "--cursor"},
			{"no codec", []string{"recompress", "--prefix", "b:"}, false, exitUsage, `"codec" not set`},
			{"empty prefix", []string{"recompress", "--prefix", "", "--codec", "zstd"}, false, exitUsage, "must not be empty"},
			{"no keys stats", []string{"stats", "--prefix", "nothing:"}, false, exitFailure, `no keys under prefix "nothing:"`},
			{"no keys advise", []string{"advise", "--prefix", "nothing:"}, false, exitFailure, `no keys under prefix "nothing:"`},
			{"no keys recompress", []string{"recompress", "--prefix", "nothing:", "--codec", "zstd"}, false, exitFailure, `no keys under prefix "nothing:"`},
			{"not a string", []string{"inspect", "b:hash"}, false, exitFailure, "a hash, not a string"},
			{"missing key", []string{"inspect", "b:none"}, false, exitFailure, "no such key"},
			{"no key", []string{"inspect"}, false, exitUsage, "requires at least 1 arg"},
			{"unknown command", []string{"compress"}, false, exitUsage, `unknown command "compress"`},
			{"unknown flag", []string{"stats", "--prefixes", "b:"}, false, exitUsage, "unknown flag: --prefixes"},
			{"flag after", []string{"stats", "--sample", "many"}, false, exitUsage, "invalid argument"},
		}
		if tg.Cluster != nil {
			cases = append(cases,
				badCase{"cluster node without --cluster", []string{"--addr", tg.Cluster.Addrs()[0], "stats"}, true, exitUsage, "is a Redis Cluster node: add --cluster"},
				badCase{"cursor of another node", []string{"recompress", "--prefix", "b:", "--codec", "zstd", "--cursor", down + "=0"}, false, exitUsage, "not a master of this cluster"},
			)
		}
		for _, c := range cases {
			args := c.args
			if !c.own {
				args = with(tg, args...)
			}
			checkBad(t, c, args)
		}
		sameData(t, before, snapshot(t, tg), time.Minute)
	})
}

// TestURL connects with --url, and with ParseClusterURL's form with
// --cluster.
func TestURL(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		set(t, tg, 0, map[string][]byte{"url:1": encode(t, codec.Snappy, jsonDoc(1, 2000))})
		url := "redis://"
		var args []string
		if tg.Cluster != nil {
			addrs := tg.Cluster.Addrs()
			url += addrs[0] + "?addr=" + addrs[1] + "&addr=" + addrs[2] + "&dial_timeout=3s"
			args = []string{"--cluster", "--url", url}
		} else {
			args = []string{"--url", url + tg.Server.Addr() + "/0?dial_timeout=3s"}
		}
		res := cli(t, append(args, "inspect", "url:1")...)
		if res.code != 0 || !strings.Contains(res.stdout, "0x03 snappy") {
			t.Errorf("inspect over --url: exit %d", res.code)
		}
	})
}

// startSentinel starts a Sentinel monitoring master as "packcache" and
// returns its address once it reports the master.
func startSentinel(t *testing.T, master *redistest.Server) string {
	t.Helper()
	return redistest.StartSentinel(t, master, "packcache")
}

func TestSentinel(t *testing.T) {
	t.Parallel() // servers of its own
	master := redistest.Start(t)
	saddr := startSentinel(t, master)
	rdb := master.Client(t)
	ctx := context.Background()
	for i := range 20 {
		rdb.Set(ctx, fmt.Sprintf("sent:%d", i), jsonDoc(i, 4000), time.Hour)
	}
	conn := []string{"--sentinel-master", "packcache", "--addr", saddr}
	for _, args := range [][]string{
		{"inspect", "sent:1"},
		{"stats", "--prefix", "sent:"},
		{"advise", "--prefix", "sent:", "--sample", "10"},
		{"recompress", "--prefix", "sent:", "--codec", "zstd"},
	} {
		if res := cli(t, append(conn, args...)...); res.code != 0 {
			t.Errorf("%s through Sentinel: exit %d", args[0], res.code)
		}
	}
	if v := rdb.Get(ctx, "sent:1").Val(); v[0] != codec.HeaderZstd {
		t.Errorf("recompress through Sentinel did not reach the master: % x", v[:4])
	}
	res := cli(t, "--sentinel-master", "nosuchmaster", "--addr", saddr, "stats")
	if res.code != exitFailure || !strings.Contains(res.stderr, "cannot reach Redis") {
		t.Errorf("unknown master: exit %d, stderr %q", res.code, res.stderr)
	}
}
