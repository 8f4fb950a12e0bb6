// Command shutdown is a net/http service over a packcache that shuts down
// in the order that loses no request.
//
// README: a small profile service (GET reads through the cache, POST
// updates the "database" and then invalidates the cache: cache-aside) runs
// under a steady stream of requests; then it shuts down:
//
//  1. http.Server.Shutdown, with a deadline: the listener closes, so no
//     request is accepted any more, and it waits for the requests in
//     flight, which still use the cache;
//  2. cache.Close: nothing uses the cache any more; Close tries pending
//     invalidations (see packcache.ErrPending) once more, and its error
//     names those it could not apply;
//  3. the go-redis client's Close, last: the cache needed it until then.
//
// It prints how many requests were served and how many failed. With
// -cache-first it closes the cache before the server, the mistake this
// example is about: requests that reach the cache after Close fail with
// packcache.ErrClosed (here 503s), and updates committed to the database
// are not invalidated. With -redis-gone the embedded Redis stops a moment
// before the shutdown: the updates meanwhile get ErrPending, and
// cache.Close reports the invalidations it could not apply.
//
// Run: go run ./examples/shutdown [-for 1s -clients 16 -cache-first -redis-gone]
// (embedded miniredis), or REDIS_ADDR=localhost:6379 go run
// ./examples/shutdown (real Redis; only keys under
// "packcache-example:<pid>:" are used, and they are deleted at the end). It
// shuts down after -for, or on SIGINT or SIGTERM.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
)

// Profile is what the service serves.
type Profile struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Version int    `json:"version"`
}

// database stands for the source of truth: a slow one.
type database struct {
	mu    sync.Mutex
	rows  map[string]Profile
	delay time.Duration
}

func (db *database) Load(ctx context.Context, key string) (Profile, error) {
	id := key[strings.LastIndexByte(key, ':')+1:]
	select {
	case <-time.After(db.delay):
	case <-ctx.Done():
		return Profile{}, ctx.Err()
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	p, ok := db.rows[id]
	if !ok {
		return Profile{}, packcache.ErrNotFound
	}
	return p, nil
}

func (db *database) update(id string) {
	db.mu.Lock()
	defer db.mu.Unlock()
	p := db.rows[id]
	p.Version++
	db.rows[id] = p
}

type config struct {
	RedisAddr  string        // empty: embedded miniredis
	For        time.Duration // traffic before the shutdown begins
	Clients    int           // concurrent clients
	CacheFirst bool          // close the cache before the server: the wrong order
	RedisGone  bool          // stop the embedded Redis a moment before the shutdown
}

type report struct {
	Redis    string
	Served   int64 // 2xx responses
	Closed   int64 // requests whose cache call failed with ErrClosed
	Failed   int64 // other non-2xx responses
	Refused  int64 // requests not accepted: the server had stopped listening
	Pending  int64 // updates whose invalidation was left to the cache (ErrPending)
	Lost     int64 // updates committed to the database and not invalidated
	CloseErr error // cache.Close's error
	Order    string
}

func main() {
	cfg := config{RedisAddr: os.Getenv("REDIS_ADDR")}
	flag.DurationVar(&cfg.For, "for", time.Second, "how long the traffic runs before the shutdown begins")
	flag.IntVar(&cfg.Clients, "clients", 16, "concurrent clients")
	flag.BoolVar(&cfg.CacheFirst, "cache-first", false, "close the cache before the server (the wrong order)")
	flag.BoolVar(&cfg.RedisGone, "redis-gone", false, "stop the embedded Redis a moment before the shutdown: updates meanwhile are left pending, and cache.Close reports them")
	flag.Parse()
	// A real service runs until it is told to stop; this one also stops
	// by itself after -for.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, cfg.For)
	defer cancel()
	rep, err := run(ctx, cfg, os.Stdout)
	if err != nil {
		log.Fatal(err)
	}
	if !cfg.CacheFirst && rep.Failed > 0 {
		log.Fatalf("%d requests failed although the server was shut down first", rep.Failed)
	}
}

// run serves until ctx ends, with cfg.Clients clients sending requests,
// then shuts down and reports what the clients saw.
func run(ctx context.Context, cfg config, w io.Writer) (rep report, err error) {
	addr := cfg.RedisAddr
	rep.Redis = "REDIS_ADDR " + addr
	var mr *miniredis.Miniredis
	if addr == "" {
		if mr, err = miniredis.Run(); err != nil {
			return rep, err
		}
		defer mr.Close()
		addr, rep.Redis = mr.Addr(), "embedded miniredis at "+mr.Addr()
	} else if cfg.RedisGone {
		return rep, errors.New("-redis-gone stops the embedded Redis: not with REDIS_ADDR")
	}
	fmt.Fprintf(w, "redis: %s\n", rep.Redis)
	prefix := fmt.Sprintf("packcache-example:%d:", os.Getpid())
	if mr == nil {
		defer cleanUp(addr, prefix)
	}

	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true,
		MaxRetries: -1, DialerRetries: 1, MinIdleConns: 8}) // the README's recommended settings
	db := &database{rows: map[string]Profile{}, delay: 10 * time.Millisecond}
	for i := range 20 {
		id := fmt.Sprint(i)
		db.rows[id] = Profile{ID: id, Name: "user " + id, Version: 1}
	}
	cache, err := packcache.New[Profile](rdb, packcache.WithTTL(time.Minute), packcache.WithLoader[Profile](db))
	if err != nil {
		rdb.Close()
		return rep, err
	}

	var closed, pending, lost atomic.Int64
	mux := http.NewServeMux()
	// A profile page: the profile, some other work (a call to another
	// service, say), then the profile suggested next to it. A request in
	// flight uses the cache more than once.
	mux.HandleFunc("GET /profiles/{id}", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.PathValue("id"))
		if err != nil {
			http.NotFound(w, r)
			return
		}
		p, err := cache.Get(r.Context(), prefix+"profile:"+strconv.Itoa(n))
		if err != nil {
			fail(w, err, &closed)
			return
		}
		time.Sleep(5 * time.Millisecond)
		next, err := cache.Get(r.Context(), prefix+"profile:"+strconv.Itoa((n+1)%20))
		if err != nil {
			fail(w, err, &closed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode([]Profile{p, next})
	})
	mux.HandleFunc("POST /profiles/{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		db.update(id) // the database first, then the cache
		// The database has committed: a client hanging up must not stop
		// the invalidation. The cache bounds the call by its Redis budget.
		err := cache.Delete(context.WithoutCancel(r.Context()), prefix+"profile:"+id)
		switch {
		case errors.Is(err, packcache.ErrPending):
			// Redis failed, and the cache will invalidate the key
			// once it answers: nothing to retry.
			pending.Add(1)
		case err != nil:
			// Not invalidated (ErrClosed, or the request's context
			// ended): Redis may serve the old profile until its TTL.
			lost.Add(1)
			fail(w, err, &closed)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cache.Close()
		rdb.Close()
		return rep, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Clients}}
	defer client.CloseIdleConnections()
	var shuttingDown atomic.Bool
	var wg sync.WaitGroup
	var ok, failed, refused atomic.Int64
	url := "http://" + ln.Addr().String() + "/profiles/"
	for c := range cfg.Clients {
		wg.Go(func() {
			for n := 0; ; n++ {
				id := fmt.Sprint((c*7 + n) % 20)
				var resp *http.Response
				var err error
				if n%10 == 9 {
					resp, err = client.Post(url+id, "text/plain", nil)
				} else {
					resp, err = client.Get(url + id)
				}
				if err != nil {
					if shuttingDown.Load() {
						refused.Add(1) // not accepted: the listener is closed
						return
					}
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode/100 == 2 {
					ok.Add(1)
				} else {
					failed.Add(1)
				}
			}
		})
	}

	<-ctx.Done()
	if cfg.RedisGone {
		// Updates meanwhile fail with ErrPending; reads are answered by
		// the loader. Five updates at least, besides the clients'.
		mr.Close()
		for id := range 5 {
			resp, err := client.Post(url+strconv.Itoa(id), "text/plain", nil)
			if err != nil {
				failed.Add(1)
				continue
			}
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				ok.Add(1)
			} else {
				failed.Add(1)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	shuttingDown.Store(true)
	if cfg.CacheFirst {
		rep.Order = "cache.Close, then srv.Shutdown (wrong)"
		rep.CloseErr = cache.Close()
		err = shutdownServer(srv)
		rdb.Close()
	} else {
		rep.Order = "srv.Shutdown, then cache.Close, then rdb.Close"
		rep.CloseErr, err = shutdown(srv, cache, rdb, log.New(w, "", 0))
	}
	wg.Wait()
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	rep.Served, rep.Failed, rep.Refused = ok.Load(), failed.Load(), refused.Load()
	rep.Closed, rep.Pending, rep.Lost = closed.Load(), pending.Load(), lost.Load()
	closeErr := "nil"
	if rep.CloseErr != nil {
		closeErr = "an error (above)"
		if cfg.CacheFirst {
			closeErr = rep.CloseErr.Error()
		}
	}
	fmt.Fprintf(w, "shutdown: %s\n", rep.Order)
	fmt.Fprintf(w, "requests: %d served, %d failed (%d of them with ErrClosed), %d not accepted once the server stopped listening\n",
		rep.Served, rep.Failed, rep.Closed, rep.Refused)
	fmt.Fprintf(w, "updates left to the cache to invalidate (ErrPending): %d; updates not invalidated: %d; cache.Close: %s\n",
		rep.Pending, rep.Lost, closeErr)
	return rep, err
}

// shutdown stops the service in the order that loses no request: the
// server first (it stops accepting and waits, within its deadline, for the
// requests in flight, which use the cache), then the cache (its error names
// the invalidations it could not apply), then the go-redis client, which
// the cache used until its Close returned.
func shutdown(srv *http.Server, cache *packcache.Cache[Profile], rdb *redis.Client, logger *log.Logger) (closeErr, err error) {
	err = shutdownServer(srv)
	if closeErr = cache.Close(); closeErr != nil {
		logger.Printf("cache: %v", closeErr) // e.g. "3 pending invalidations not applied"
	}
	return closeErr, errors.Join(err, rdb.Close())
}

// shutdownServer stops srv accepting and waits for its requests in flight,
// for at most 10 seconds; past that it closes their connections.
func shutdownServer(srv *http.Server) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		return errors.Join(err, srv.Close())
	}
	return nil
}

// fail answers a request whose cache call failed.
func fail(w http.ResponseWriter, err error, closed *atomic.Int64) {
	if errors.Is(err, packcache.ErrClosed) {
		closed.Add(1)
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	http.Error(w, err.Error(), http.StatusBadGateway)
}

// cleanUp deletes the example's keys, with a client of its own: never
// flush a Redis we did not start.
func cleanUp(addr, prefix string) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	keys, _ := rdb.Keys(ctx, prefix+"*").Result()
	if len(keys) > 0 {
		rdb.Del(ctx, keys...)
	}
}
