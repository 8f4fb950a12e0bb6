package packcache_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// TestStatsBreakers: Stats names the node's breaker, closed from the
// start, open once a refused connection opens it and since then, and
// closed again after Redis answers (issue 24, item 2).
func TestStatsBreakers(t *testing.T) {
	t.Parallel()
	s, _ := single(t)
	redistest.RequireReal(t, s, "stops the server")
	rdb := s.Client(t, func(o *redis.Options) { o.MaxRetries, o.DialTimeout = -1, 200*time.Millisecond })
	ctx := ctxT(t)
	const cooldown = 50 * time.Millisecond
	made := time.Now()
	c := mustNew[Channel](t, rdb, packcache.WithCircuitBreaker(2, cooldown))
	one := func() packcache.BreakerState {
		t.Helper()
		b := c.Stats().Breakers
		if len(b) != 1 || b[0].Addr != s.Addr() {
			t.Fatalf("Stats.Breakers = %+v, want the one node, %s", b, s.Addr())
		}
		return b[0]
	}
	if b := one(); b.Open || b.Since.Before(made.Add(-time.Second)) {
		t.Fatalf("at start: %+v, want closed since the cache was made (%v)", b, made)
	}
	if err := c.Set(ctx, "k", makeChannel(1, 100)); err != nil {
		t.Fatal(err)
	}
	s.Stop(t)
	stopped := time.Now()
	if _, err := c.Get(ctx, "k"); err == nil {
		t.Fatal("Get with Redis stopped: no error")
	}
	opened := one()
	if !opened.Open || opened.Since.Before(stopped) {
		t.Errorf("after a refused connection: %+v, want open since then (after %v)", opened, stopped)
	}
	s.Restart(t)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(cooldown) { // polling, with a deadline
		if _, err := c.Get(ctx, "k"); err == nil || errors.Is(err, packcache.ErrMiss) { // the restart lost k
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no Get succeeded within 30 s of the restart")
		}
	}
	if b := one(); b.Open || !b.Since.After(opened.Since) {
		t.Errorf("after a Get succeeded: %+v, want closed since after it opened (%v)", b, opened.Since)
	}
}

// TestStatsServed: Stats counts Serve's responses by status and coding,
// with the body bytes sent (issue 24, item 2).
func TestStatsServed(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	c := mustNew[Channel](t, rdb, packcache.WithCodec(codec.ZstdDefault))
	if err := c.Set(ctxT(t), "ch", makeChannel(9, 32<<10)); err != nil {
		t.Fatal(err)
	}
	want := map[packcache.ServeResponse]packcache.ServeCount{}
	count := func(method string, header ...string) {
		t.Helper()
		rec := serveOnce(c, "ch", method, header...)
		coding := rec.Header().Get("Content-Encoding") // a 304 or 412 has none: zstd was asked for
		switch {
		case rec.Code == 304 || rec.Code == 412:
			coding = "zstd"
		case rec.Code != 200:
			coding = ""
		case coding == "":
			coding = "identity"
		}
		k := packcache.ServeResponse{Status: rec.Code, Coding: coding}
		n := want[k]
		n.Responses++
		if rec.Code == 200 && method == "GET" {
			n.Bytes += uint64(rec.Body.Len())
		}
		want[k] = n
	}
	zstdTag := serveOnce(c, "ch", "GET", "Accept-Encoding", "zstd").Header().Get("Etag")
	c2 := c.Stats().Served // the one above
	for range 3 {
		count("GET", "Accept-Encoding", "zstd")
	}
	count("GET", "Accept-Encoding", "gzip")
	count("GET")
	count("HEAD", "Accept-Encoding", "gzip")
	count("GET", "Accept-Encoding", "zstd", "If-None-Match", zstdTag)
	count("GET", "Accept-Encoding", "zstd", "If-Match", `"other"`)
	count("GET", "Accept-Encoding", "identity;q=0")
	count("POST")
	rec := serveOnce(c, "absent", "GET")
	want[packcache.ServeResponse{Status: rec.Code}] = packcache.ServeCount{Responses: 1}
	for k, v := range c2 {
		n := want[k]
		n.Responses += v.Responses
		n.Bytes += v.Bytes
		want[k] = n
	}
	if got := c.Stats().Served; !reflect.DeepEqual(got, want) {
		t.Errorf("Stats.Served = %v,\nwant %v", got, want)
	}
	for _, k := range []packcache.ServeResponse{{200, "zstd"}, {200, "gzip"}, {200, "identity"}, {304, "zstd"}, {412, "zstd"}, {406, ""}, {405, ""}, {404, ""}} {
		if want[k].Responses == 0 {
			t.Errorf("no %v among the responses: the test does not make one", k)
		}
	}
}

// TestStatsJSON: Stats after Serve responses of several kinds marshals to
// JSON, with Served's keys as "200 zstd" and "404", and reads back equal.
func TestStatsJSON(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[Channel](t, rdb)
	if err := c.Set(ctx, "ch", makeChannel(1, 8<<10)); err != nil {
		t.Fatal(err)
	}
	for _, ae := range []string{"zstd", "gzip", ""} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("Accept-Encoding", ae)
		c.Serve(httptest.NewRecorder(), r, "ch")
	}
	c.Serve(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil), "absent")
	st := c.Stats()
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatalf("json.Marshal(Stats()): %v", err)
	}
	for _, k := range []string{`"200 zstd":`, `"200 gzip":`, `"200 identity":`, `"404":`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("Stats as JSON lacks %s: %s", k, b)
		}
	}
	var back packcache.Stats
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("json.Unmarshal: %v", err)
	}
	if !reflect.DeepEqual(back.Served, st.Served) || back.Gets != st.Gets {
		t.Errorf("read back %+v, want %+v", back.Served, st.Served)
	}
	var bad packcache.ServeResponse
	for _, s := range []string{"", "zstd", "200 a b", "20"} {
		if err := bad.UnmarshalText([]byte(s)); err == nil {
			t.Errorf("UnmarshalText(%q) = nil, want an error", s)
		}
	}
}
