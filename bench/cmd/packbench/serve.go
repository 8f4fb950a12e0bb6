package main

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/httpbench"
)

// ---------------------------------------------------------------- serve

// The serve suite measures Cache.Serve, the HTTP edge, against the handler
// an application writes without it: Get, then json.NewEncoder(w).Encode.
// 16 keep-alive clients (one http.Transport, compression handled by the
// suite: a client reads the body as sent, without decoding it) fetch one
// hot channel as fast as they can from an httptest server on loopback, in
// this process; clients and server share the machine's cores.

// serveClients is the number of concurrent keep-alive clients.
const serveClients = 16

// The clients, by the Accept-Encoding they send.
var serveAccepts = []struct{ name, header string }{
	{"zstd", "gzip, deflate, br, zstd"}, // Chromium's
	{"gzip", "gzip"},                    // Go's http.Transport
	{"identity", ""},                    // curl without --compressed
}

// A serveSubject is one handler of the hot key, over one cache.
type serveSubject struct {
	name    string
	near    bool
	codec   codec.Codec
	serve   bool // Cache.Serve; else Get and json.Encoder
	loadAll bool // every request loads (DoNotCache): a value just loaded
	// deltas: Policy.Deltas, and the key holds v2, the channel plus one
	// message, after a Serve of v1 kept v1 in Redis; its clients are
	// deltaAccepts.
	deltas bool
}

// The clients of the deltas subject: one that takes zstd alone, which
// gets the stored frame, and Chromium holding v1 (Available-Dictionary
// names it).
var deltaAccepts = []struct{ name, header string }{
	{"zstd only", "zstd"},
	{"Chromium holding v1", "gzip, deflate, br, zstd, dcb, dcz"},
}

// A serveRow is one subject and client measured.
type serveRow struct {
	subject, client string
	near            bool
	rps             spread // requests per second
	wire            int64  // bytes the server wrote per response, headers included
	body            int64  // body bytes per response
	coding          string // the Content-Encoding the client got
	redisGets       int64  // Redis GETs per 1,000 requests
}

func (e *env) suiteServe(ctx context.Context) error {
	size := 128 << 10
	d := 500 * time.Millisecond
	if e.cfg.quick {
		size, d = 16<<10, 50*time.Millisecond
	}
	ch := makeChannel(16, size)
	raw, _ := json.Marshal(ch)
	e.header("serve", fmt.Sprintf("Cache.Serve against a handler doing Get and json.NewEncoder(w).Encode(v), both over packcache.Cache[Channel] (zstd in Redis unless the row says otherwise), "+
		"one hot %d-byte channel, %d concurrent keep-alive clients for %v per rep (median, min-max of %d reps), server and clients in this process on loopback. "+
		"Clients by Accept-Encoding: zstd = %q (Chromium), gzip = %q (Go), identity = none (curl). Clients read each body without decoding it. "+
		"Wire bytes: all the server wrote per response, headers included. Redis GETs: INFO commandstats delta per 1,000 requests. "+
		"Near cache: WithLocalCache(LocalCache{MaxBytes: %d << 20}).",
		len(raw), serveClients, d, e.surgeReps(), serveAccepts[0].header, serveAccepts[1].header, nearLocal.MaxBytes>>20))
	subjects := []serveSubject{
		{name: "Get + json.Encoder", near: true},
		{name: "Serve", near: true, serve: true},
		{name: "Get + json.Encoder"},
		{name: "Serve", serve: true},
		{name: "Serve, LZ4 value", near: true, serve: true, codec: codec.LZ4},
		{name: "Serve, value just loaded (DoNotCache)", serve: true, loadAll: true},
		{name: "Serve with Deltas, v1 + one message (ZstdDefault)", near: true, serve: true, codec: codec.ZstdDefault, deltas: true},
	}
	// Every subject and client is set up first, and the reps go round
	// them all in turn, so that a slow moment of the machine's spreads
	// over every row rather than sinking one.
	var runs []*serveRunner
	defer func() {
		for _, r := range runs {
			r.close()
		}
	}()
	for _, s := range subjects {
		accepts := serveAccepts
		switch {
		case s.deltas:
			accepts = deltaAccepts
		case !s.serve:
			accepts = accepts[2:] // it sends identity whatever the client says
		}
		for _, a := range accepts {
			r, err := e.newServeRunner(ctx, s, a.name, a.header, ch)
			if err != nil {
				return fmt.Errorf("%s, %s client: %w", s.name, a.name, err)
			}
			runs = append(runs, r)
		}
	}
	for range e.surgeReps() {
		for _, r := range runs {
			if err := r.measure(ctx, d); err != nil {
				return fmt.Errorf("%s, %s client: %w", r.row.subject, r.row.client, err)
			}
		}
	}
	var rows []serveRow
	for _, r := range runs {
		row, err := r.result()
		if err != nil {
			return fmt.Errorf("%s, %s client: %w", r.row.subject, r.row.client, err)
		}
		rows = append(rows, row)
	}
	fmt.Fprintln(e.out, "\n| handler | near cache | client | Content-Encoding | requests/s | wire bytes/response | body bytes/response | Redis GETs per 1,000 |")
	fmt.Fprintln(e.out, "|---|---|---|---|--:|--:|--:|--:|")
	for _, r := range rows {
		nearCol := "no"
		if r.near {
			nearCol = "yes"
		}
		coding := r.coding
		if coding == "" {
			coding = "identity"
		}
		fmt.Fprintf(e.out, "| %s | %s | %s | %s | %s | %d | %d | %d |\n", r.subject, nearCol, r.client, coding,
			fmt.Sprintf("%.0f (%.0f–%.0f)", r.rps.med, r.rps.min, r.rps.max), r.wire, r.body, r.redisGets)
	}
	find := func(subject string, near bool, client string) serveRow {
		for _, r := range rows {
			if r.subject == subject && r.client == client && r.near == near {
				return r
			}
		}
		return serveRow{}
	}
	base, z := find("Get + json.Encoder", true, "identity"), find("Serve", true, "zstd")
	speed, share := z.rps.med/base.rps.med, float64(z.wire)/float64(base.wire)
	full, delta := find(subjects[len(subjects)-1].name, true, deltaAccepts[0].name), find(subjects[len(subjects)-1].name, true, deltaAccepts[1].name)
	dspeed, dshare := delta.rps.med/full.rps.med, float64(delta.body)/float64(full.body)
	e.printTargets("serve: targets", []target{
		{"with the near cache, Serve to 16 zstd clients ≥ 3× the requests/s of Get + json.Encoder",
			fmt.Sprintf("%.0f vs %.0f requests/s = %.1f×", z.rps.med, base.rps.med, speed), speed >= 3},
		{"…and ≤ 0.35× its bytes per response",
			fmt.Sprintf("%d vs %d bytes = %.2f×", z.wire, base.wire, share), share <= 0.35},
		{"with the near cache, Serve to zstd clients: 0 Redis GETs",
			fmt.Sprintf("%d per 1,000 requests", z.redisGets), z.redisGets == 0 && z.coding == "zstd"},
		{"Deltas: a client holding v1 gets v2 (one message more) as dcz in ≤ 0.05× the stored zstd frame",
			fmt.Sprintf("%d vs %d body bytes = %.4f×", delta.body, full.body, dshare), dshare <= 0.05 && delta.coding == "dcz"},
		{"Deltas: 16 clients holding v1 get dcz at ≥ 0.5× the requests/s of the zstd passthrough",
			fmt.Sprintf("%.0f vs %.0f requests/s = %.2f×", delta.rps.med, full.rps.med, dspeed), dspeed >= 0.5},
	})
	return nil
}

// A serveRunner is one subject with one kind of client: its cache, its
// server, and what its reps measured.
type serveRunner struct {
	e      *env
	row    serveRow
	accept string
	fetch  func(ctx context.Context) (n int64, coding string, err error)
	cl     *httpbench.Listener
	close  func()

	rates                          []float64
	requests, body, wire, redisGET int64
}

// newServeRunner sets up subject s for clients sending accept, on a
// fresh cache and server, warmed: with the near cache, until it answers
// (past the first Serve, which replaces the entry with one that keeps
// the stored frame).
func (e *env) newServeRunner(ctx context.Context, s serveSubject, client, accept string, ch Channel) (_ *serveRunner, err error) {
	r := &serveRunner{e: e, row: serveRow{subject: s.name, client: client, near: s.near}, accept: accept}
	key := e.key("serve", s.name, client)
	opts := []packcache.Option{}
	if s.codec != nil {
		opts = append(opts, packcache.WithCodec(s.codec))
	}
	if s.near {
		opts = append(opts, packcache.WithLocalCache(nearLocal))
	}
	if s.deltas {
		opts = append(opts, packcache.WithPrefix("", packcache.Policy{Deltas: 10 * time.Minute}))
	}
	if s.loadAll {
		opts = append(opts, packcache.WithLoader(packcache.LoaderFunc[Channel](func(context.Context, string) (Channel, error) {
			return ch, packcache.DoNotCache
		})))
	}
	c, err := packcache.New[Channel](e.rdb, opts...)
	if err != nil {
		return nil, err
	}
	if s.loadAll {
		err = e.rdb.Del(ctx, key).Err()
	} else {
		err = c.Set(ctx, key, ch)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	var handler http.Handler
	if s.serve {
		handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { c.Serve(w, r, key) })
	} else {
		handler = httpbench.GetAndEncode(c, func(*http.Request) string { return key })
	}
	srv := httptest.NewUnstartedServer(handler)
	r.cl = httpbench.Wrap(srv.Listener)
	srv.Listener = r.cl
	srv.Start()
	tr := &http.Transport{MaxIdleConnsPerHost: serveClients, DisableCompression: true}
	hc := &http.Client{Transport: tr}
	r.close = func() {
		tr.CloseIdleConnections()
		srv.Close()
		c.Close()
		if s.deltas {
			e.rdb.Del(context.Background(), versionsKey(key)) // not under the benchmark's prefix
		}
	}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	r.fetch = func(ctx context.Context) (int64, string, error) {
		return httpbench.Fetch(ctx, hc, srv.URL, accept, io.Discard)
	}
	if s.deltas {
		if r.fetch, err = e.deltaFetch(ctx, c, key, ch, hc, srv.URL, accept); err != nil {
			return nil, err
		}
	}
	for range 2 {
		if _, _, err := r.fetch(ctx); err != nil {
			return nil, err
		}
	}
	if s.near {
		if err := awaitNear(func() error { _, _, err := r.fetch(ctx); return err }, func() uint64 { return c.Stats().NearHits }); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// measure runs the clients for d once.
func (r *serveRunner) measure(ctx context.Context, d time.Duration) error {
	runtime.GC() // the rows before leave their garbage to themselves
	calls0, err := r.e.cmdCalls(ctx)
	if err != nil {
		return err
	}
	wire0 := r.cl.Written()
	var n, b atomic.Int64
	var firstErr error
	var once sync.Once
	var coding atomic.Value
	start := time.Now()
	stop := start.Add(d)
	var wg sync.WaitGroup
	for range serveClients {
		wg.Go(func() {
			for time.Now().Before(stop) {
				m, ce, err := r.fetch(ctx)
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				n.Add(1)
				b.Add(m)
				coding.Store(ce)
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	if firstErr != nil {
		return firstErr
	}
	calls1, err := r.e.cmdCalls(ctx)
	if err != nil {
		return err
	}
	r.row.coding, _ = coding.Load().(string)
	r.rates = append(r.rates, float64(n.Load())/took.Seconds())
	r.requests += n.Load()
	r.body += b.Load()
	r.wire += r.cl.Written() - wire0
	r.redisGET += calls1["get"] - calls0["get"]
	return nil
}

// result is the row of the reps measured.
func (r *serveRunner) result() (serveRow, error) {
	row := r.row
	if r.requests == 0 {
		return row, errors.New("no request completed")
	}
	row.rps = spreadOf(r.rates)
	row.body, row.wire = r.body/r.requests, r.wire/r.requests
	row.redisGets = r.redisGET * 1000 / r.requests
	return row, nil
}

// versionsKey is the key of the versions Serve keeps of key with
// Policy.Deltas (FORMAT.md section 10), for a key without '}'.
func versionsKey(key string) string { return "packcache:dcz:{" + key + "}" }

// deltaFetch readies key, which holds ch, for the deltas subject: a Serve
// of ch (v1) to a Chromium client, which keeps v1 in Redis, then ch plus
// one message (v2) stored. It returns the fetch of the clients sending
// accept, holding v1 if accept names dcz.
func (e *env) deltaFetch(ctx context.Context, c *packcache.Cache[Channel], key string, ch Channel, hc *http.Client, url, accept string) (func(context.Context) (int64, string, error), error) {
	if _, _, err := httpbench.Fetch(ctx, hc, url, deltaAccepts[1].header, io.Discard); err != nil {
		return nil, err
	}
	stored, err := e.rdb.Get(ctx, key).Bytes()
	if err != nil {
		return nil, err
	}
	v1, err := codec.DecodeValue(nil, stored, 64<<20)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(v1)
	for deadline := time.Now().Add(nearWait); !e.rdb.HExists(ctx, versionsKey(key), hex.EncodeToString(sum[:])).Val(); {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("v1 of %s not kept in Redis within %v", key, nearWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
	last := ch.Messages[len(ch.Messages)-1]
	v2 := ch
	v2.Messages = append(append([]Message(nil), ch.Messages...), Message{ID: last.ID + 1, Author: "student0001",
		Text: "the exam room is 204, not 201", Sent: last.Sent.Add(time.Minute)})
	if err := c.Set(ctx, key, v2); err != nil {
		return nil, err
	}
	available := ":" + base64.StdEncoding.EncodeToString(sum[:]) + ":"
	return func(ctx context.Context) (int64, string, error) {
		req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("Accept-Encoding", accept)
		if strings.Contains(accept, "dcz") {
			req.Header.Set("Available-Dictionary", available)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		n, err := io.Copy(io.Discard, resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("%s: status %d", url, resp.StatusCode)
		}
		return n, resp.Header.Get("Content-Encoding"), err
	}, nil
}
