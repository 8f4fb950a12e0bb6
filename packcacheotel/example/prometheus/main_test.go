package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// start runs the program and returns the address of its metrics server
// and a function that stops it and returns what run returned.
func start(t *testing.T, cfg config) (addr string, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, io.Discard, func(a string) { ready <- a }) }()
	stopped := false
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
	t.Cleanup(func() { _ = stop() })
	select {
	case a := <-ready:
		return a, stop
	case err := <-done:
		stopped = true
		t.Fatalf("run returned before serving: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the metrics server did not start within 30s")
	}
	return "", nil
}

func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s, %v", resp.Status, err)
	}
	return string(b)
}

// TestServesMetrics runs the program briefly and scrapes it: the packcache
// series are there, with Prometheus names and the cache's label.
func TestServesMetrics(t *testing.T) {
	addr, stop := start(t, config{Listen: "127.0.0.1:0", Interval: time.Millisecond})
	// Series that need a round of traffic each: a product hit (the second
	// time round the ids), a product that does not exist (id 90 and up),
	// a draft encoded with LZ4.
	want := []*regexp.Regexp{
		regexp.MustCompile(`(?m)^packcache_reads_total\{[^}]*packcache_outcome="miss"`),
		regexp.MustCompile(`(?m)^packcache_reads_total\{[^}]*packcache_outcome="hit"`),
		regexp.MustCompile(`(?m)^packcache_reads_total\{[^}]*packcache_outcome="not_found"`),
		regexp.MustCompile(`(?m)^packcache_load_duration_seconds_bucket\{[^}]*packcache_outcome="ok"`),
		regexp.MustCompile(`(?m)^packcache_load_duration_seconds_count\{[^}]*packcache_outcome="not_found"`),
		regexp.MustCompile(`(?m)^packcache_load_keys_total\{`),
		regexp.MustCompile(`(?m)^packcache_codec_bytes_total\{[^}]*packcache_codec_direction="encode",packcache_codec_form="stored",packcache_codec_name="zstd"`),
		regexp.MustCompile(`(?m)^packcache_codec_bytes_total\{[^}]*packcache_codec_direction="decode",packcache_codec_form="plain",packcache_codec_name="lz4"`),
		regexp.MustCompile(`(?m)^packcache_codec_duration_seconds_bucket\{`),
		regexp.MustCompile(`(?m)^packcache_breaker_open\{[^}]*packcache_cache="products"[^}]*\} 0$`),
		regexp.MustCompile(`(?m)^# TYPE packcache_reads_total counter$`),
		regexp.MustCompile(`(?m)^# TYPE packcache_load_duration_seconds histogram$`),
		regexp.MustCompile(`(?m)^# TYPE packcache_breaker_open gauge$`),
		regexp.MustCompile(`(?m)^packcache_reads_total\{[^}]*packcache_cache="products",packcache_near="false",packcache_outcome="hit",packcache_prefix="packcache-example:prometheus:product:",packcache_shared="false"\} \d`),
	}
	var body string
	var missing []string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		body = scrape(t, addr)
		missing = missing[:0]
		for _, re := range want {
			if !re.MatchString(body) {
				missing = append(missing, re.String())
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60s, /metrics lacks:\n%s\n\n%s", strings.Join(missing, "\n"), packcacheLines(body))
		}
	}
	if testing.Verbose() {
		fmt.Println(packcacheLines(body))
	}
	// The Redis error counter has no series until an error happens.
	if strings.Contains(body, "packcache_redis_errors_total{") {
		t.Errorf("Redis errors reported against a healthy miniredis:\n%s", packcacheLines(body))
	}
	if err := stop(); err != nil {
		t.Errorf("run: %v", err)
	}
}

func packcacheLines(body string) string {
	var lines []string
	for _, l := range strings.Split(body, "\n") {
		if strings.Contains(l, "packcache_") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// With REDIS_ADDR, the program leaves a Redis it did not start as it found
// it: its own keys deleted, everyone else's untouched.
func TestExternalRedisCleanedUp(t *testing.T) {
	mr := miniredis.RunT(t)
	if err := mr.Set("someone-else", "keep me"); err != nil {
		t.Fatal(err)
	}
	_, stop := start(t, config{RedisAddr: mr.Addr(), Listen: "127.0.0.1:0", Interval: time.Millisecond})
	for deadline := time.Now().Add(30 * time.Second); len(mr.Keys()) < 5; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("keys after 30s: %q", mr.Keys())
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
	if keys := mr.Keys(); len(keys) != 1 || keys[0] != "someone-else" {
		t.Errorf("keys left behind: %q", keys)
	}
}
