package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/httpbench"
)

// The HTTP rounds: the students fetch their channels from an HTTP server
// on loopback, over HTTPClients keep-alive connections, through
// Cache.Serve and, for comparison, through the handler an application
// writes without it (Get, then json.NewEncoder(w).Encode(v)).

// The HTTP rounds, by handler and the Accept-Encoding the students send.
var httpModes = []struct{ handler, client, accept string }{
	{"Get + json.Encoder", "any", "gzip, deflate, br, zstd"},
	{"Serve", "zstd (passthrough)", "zstd"}, // a zstd-only client: one that also takes gzip gets the smaller of the two (Serve)
	{"Serve", "gzip (no zstd)", "gzip"},
	{"Serve", "identity", ""},
}

type httpResult struct {
	Handler, Client   string
	Coding            string // the Content-Encoding the students got
	Requests, Errors  int64
	FirstErr          error
	Wall              time.Duration
	WirePerRequest    int64 // bytes the server wrote per response, headers included
	Gets, LoaderCalls int64
}

// httpRounds runs the HTTP rounds over one cache, warm (with the near
// cache when this Redis can keep one fresh).
func httpRounds(ctx context.Context, rdb *redis.Client, cd codec.Codec, db *database, gets *getCounter, keys []string, cfg config, near bool) ([]httpResult, error) {
	opts := []packcache.Option{packcache.WithLoader[Channel](db), packcache.WithCodec(cd), packcache.WithRedisTimeout(time.Minute)}
	if near {
		opts = append(opts, packcache.WithLocalCache(nearCache))
	}
	c, err := packcache.New[Channel](rdb, opts...)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	mux := http.NewServeMux()
	channel := func(r *http.Request) string {
		i, _ := strconv.Atoi(r.PathValue("i"))
		return keys[max(i, 0)%len(keys)]
	}
	mux.HandleFunc("GET /serve/{i}", func(w http.ResponseWriter, r *http.Request) {
		c.Serve(w, r, channel(r))
	})
	mux.Handle("GET /encode/{i}", httpbench.GetAndEncode(c, channel))
	srv := httptest.NewUnstartedServer(mux)
	wire := httpbench.Wrap(srv.Listener)
	srv.Listener = wire
	srv.Start()
	defer srv.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: cfg.HTTPClients, DisableCompression: true}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}

	var out []httpResult
	for _, m := range httpModes {
		path := "/serve/"
		if m.handler != "Serve" {
			path = "/encode/"
		}
		// Warm: every channel stored, and in the near cache, whose first
		// Serve replaces the entry with one keeping the stored frame.
		for i := range keys {
			for range 3 {
				if _, _, err := fetchChannel(ctx, hc, srv.URL+path+strconv.Itoa(i), m.accept, i); err != nil {
					return nil, err
				}
			}
		}
		if near {
			if err := awaitNearAll(ctx, c, keys); err != nil {
				return nil, err
			}
		}
		hr := httpResult{Handler: m.handler, Client: m.client}
		calls0, gets0, wire0 := db.calls.Load(), gets.n.Load(), wire.Written()
		var (
			next, errs atomic.Int64
			once       sync.Once
			coding     atomic.Value
			wg         sync.WaitGroup
		)
		start := time.Now()
		for range cfg.HTTPClients {
			wg.Go(func() {
				for {
					i := int(next.Add(1) - 1)
					if i >= cfg.HTTPRequests {
						return
					}
					_, ce, err := fetchChannel(ctx, hc, srv.URL+path+strconv.Itoa(i), m.accept, -1)
					if err != nil {
						errs.Add(1)
						once.Do(func() { hr.FirstErr = err })
						continue
					}
					coding.Store(ce)
				}
			})
		}
		wg.Wait()
		hr.Wall = time.Since(start)
		hr.Requests, hr.Errors = int64(cfg.HTTPRequests), errs.Load()
		hr.Coding, _ = coding.Load().(string)
		hr.WirePerRequest = (wire.Written() - wire0) / hr.Requests
		hr.Gets, hr.LoaderCalls = gets.n.Load()-gets0, db.calls.Load()-calls0
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		out = append(out, hr)
	}
	return out, nil
}

// awaitNearAll Gets each key until the near cache answers it.
func awaitNearAll(ctx context.Context, c *packcache.Cache[Channel], keys []string) error {
	deadline := time.Now().Add(nearWait)
	for _, k := range keys {
		for {
			before := c.Stats().NearHits
			if _, err := c.Get(ctx, k); err != nil {
				return err
			}
			if c.Stats().NearHits > before {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the near cache did not serve %s within %v", k, nearWait)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	return nil
}

// zstdDecoder decodes what the students check.
var zstdDecoder, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0))

// fetchChannel GETs url sending accept, reads the body as sent, and
// returns its length and Content-Encoding. With check ≥ 0 it also
// decodes the body and checks it is channel check.
func fetchChannel(ctx context.Context, hc *http.Client, url, accept string, check int) (int64, string, error) {
	if check < 0 {
		return httpbench.Fetch(ctx, hc, url, accept, io.Discard)
	}
	var buf bytes.Buffer
	n, ce, err := httpbench.Fetch(ctx, hc, url, accept, &buf)
	if err != nil {
		return n, ce, err
	}
	js := buf.Bytes()
	switch ce {
	case "zstd":
		js, err = zstdDecoder.DecodeAll(buf.Bytes(), nil)
	case "gzip":
		var zr *gzip.Reader
		if zr, err = gzip.NewReader(&buf); err == nil {
			js, err = io.ReadAll(zr)
		}
	}
	if err != nil {
		return n, ce, fmt.Errorf("%s: %s body: %w", url, ce, err)
	}
	var ch Channel
	if err := json.Unmarshal(js, &ch); err != nil {
		return n, ce, fmt.Errorf("%s: %w", url, err)
	}
	if want := fmt.Sprintf("ch-%04d", check); ch.ID != want {
		return n, ce, fmt.Errorf("%s: channel %q, want %q", url, ch.ID, want)
	}
	return n, ce, nil
}

// printHTTP prints the HTTP rounds' table and what it shows.
func printHTTP(w io.Writer, cfg config, rep report) {
	if len(rep.HTTP) == 0 {
		return
	}
	where := "without the near cache (this Redis cannot keep one fresh)"
	if rep.HTTPNear {
		where = "with the near cache"
	}
	fmt.Fprintf(w, "\nOver HTTP, %s: %d requests, %d keep-alive clients, loopback.\n\n", where, cfg.HTTPRequests, cfg.HTTPClients)
	fmt.Fprintln(w, "| handler | client | Content-Encoding | requests | errors | requests/s | bytes on the wire per request | Redis GETs | loader calls |")
	fmt.Fprintln(w, "|---|---|---|--:|--:|--:|--:|--:|--:|")
	for _, r := range rep.HTTP {
		ce := r.Coding
		if ce == "" {
			ce = "identity"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %d | %d | %.0f | %d | %d | %d |\n", r.Handler, r.Client, ce, r.Requests, r.Errors,
			float64(r.Requests)/r.Wall.Seconds(), r.WirePerRequest, r.Gets, r.LoaderCalls)
	}
	for _, r := range rep.HTTP {
		if r.FirstErr != nil {
			fmt.Fprintf(w, "\n%s, %s: %d requests failed, first: %v\n", r.Handler, r.Client, r.Errors, r.FirstErr)
		}
	}
	enc, z := rep.HTTP[0], rep.HTTP[1]
	fmt.Fprintf(w, "\nServe sent zstd clients the stored frames as they are: %d bytes per request against %d for Get + json.Encoder (%.2f×), at %.1f× its requests/s.\n",
		z.WirePerRequest, enc.WirePerRequest, float64(z.WirePerRequest)/float64(enc.WirePerRequest),
		(float64(z.Requests)/z.Wall.Seconds())/(float64(enc.Requests)/enc.Wall.Seconds()))
}
