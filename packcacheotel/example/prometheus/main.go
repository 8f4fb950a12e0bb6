// Command prometheus serves a packcache.Cache's metrics to Prometheus
// through OpenTelemetry: packcacheotel records them, the OpenTelemetry
// Prometheus exporter turns them into Prometheus series, and promhttp
// serves them on /metrics.
//
// It caches product pages (about 8 KB of JSON each) read through from a
// pretend database, with some writes and some products that do not
// exist, so that hits, misses, loads, not-found answers and both codecs'
// bytes show up. Run it and scrape it:
//
//	go run ./example/prometheus                 # embedded miniredis
//	REDIS_ADDR=localhost:6379 go run ./example/prometheus -listen :2112
//	curl -s localhost:2112/metrics | grep ^packcache_
//
// With REDIS_ADDR it uses only keys under "packcache-example:prometheus:"
// and deletes them when it stops (on Ctrl-C).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/packcacheotel"
)

// Product is the cached document.
type Product struct {
	ID          int      `json:"id"`
	Name        string   `json:"name"`
	Description string   `json:"description"`
	Reviews     []string `json:"reviews"`
}

// namespace holds every key the program writes.
const namespace = "packcache-example:prometheus:"

type config struct {
	RedisAddr string        // empty: an embedded miniredis
	Listen    string        // the address to serve /metrics on
	Interval  time.Duration // between rounds of traffic
}

func main() {
	cfg := config{RedisAddr: os.Getenv("REDIS_ADDR")}
	flag.StringVar(&cfg.Listen, "listen", ":2112", "address to serve /metrics on")
	flag.DurationVar(&cfg.Interval, "interval", 100*time.Millisecond, "time between rounds of cache traffic")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout, nil); err != nil {
		log.Fatal(err)
	}
}

// run serves the metrics and makes cache traffic until ctx ends. ready, if
// not nil, is called with the address of the metrics server once it
// listens.
func run(ctx context.Context, cfg config, w io.Writer, ready func(addr string)) (err error) {
	// The metrics pipeline: packcacheotel -> OpenTelemetry SDK ->
	// Prometheus exporter -> a registry of our own -> promhttp.
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { err = errors.Join(err, mp.Shutdown(context.WithoutCancel(ctx))) }()
	obs, err := packcacheotel.NewObserver(packcacheotel.WithMeterProvider(mp),
		packcacheotel.WithAttributes(attribute.String("packcache.cache", "products")))
	if err != nil {
		return err
	}

	addr := cfg.RedisAddr
	if addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return err
		}
		defer mr.Close()
		addr = mr.Addr()
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	// Never flush a Redis we did not start: delete our own keys only.
	defer func() { err = errors.Join(err, deleteOwnKeys(context.WithoutCancel(ctx), rdb)) }()

	c, err := packcache.New[Product](rdb, packcache.WithObserver(obs), packcache.WithPrefix("", packcache.Policy{NegativeTTL: time.Minute}),
		packcache.WithPrefix(namespace+"product:", packcache.Policy{Codec: codec.Zstd, TTL: 10 * time.Second}),
		packcache.WithPrefix(namespace+"draft:", packcache.Policy{Codec: codec.LZ4}),
		packcache.WithLoader(packcache.LoaderFunc[Product](load)))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, c.Close()) }()

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(w, "redis at %s; metrics on http://%s/metrics\n", addr, ln.Addr())
	if ready != nil {
		ready(ln.Addr().String())
	}

	interval := cfg.Interval
	if interval <= 0 {
		interval = 100 * time.Millisecond
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for round := 0; ctx.Err() == nil; round++ {
		traffic(ctx, c, round)
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}

	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// traffic is one round of what an application does with the cache:
// product pages read through (ids 90 and up do not exist), and a draft
// written and read back.
func traffic(ctx context.Context, c *packcache.Cache[Product], round int) {
	id := round % 100
	if _, err := c.Get(ctx, fmt.Sprintf("%sproduct:%d", namespace, id)); err != nil && !errors.Is(err, packcache.ErrNotFound) && ctx.Err() == nil {
		log.Printf("get product %d: %v", id, err)
	}
	if round%5 == 0 {
		key := fmt.Sprintf("%sdraft:%d", namespace, round%10)
		if err := c.Set(ctx, key, product(round%10)); err != nil && ctx.Err() == nil {
			log.Printf("set %s: %v", key, err)
		}
		_, _ = c.Get(ctx, key)
	}
}

// load is the pretend database.
func load(ctx context.Context, key string) (Product, error) {
	var id int
	if _, err := fmt.Sscanf(strings.TrimPrefix(key, namespace), "product:%d", &id); err != nil || id >= 90 {
		return Product{}, packcache.ErrNotFound
	}
	select {
	case <-time.After(2 * time.Millisecond): // a query
	case <-ctx.Done():
		return Product{}, ctx.Err()
	}
	return product(id), nil
}

func product(id int) Product {
	p := Product{ID: id, Name: fmt.Sprintf("Product %d", id),
		Description: strings.Repeat("A sturdy, well made thing that does what it says. ", 20)}
	for i := range 40 {
		p.Reviews = append(p.Reviews, fmt.Sprintf("Review %d of product %d: five stars, would buy again, arrived on time.", i, id))
	}
	return p
}

// deleteOwnKeys deletes the keys under namespace.
func deleteOwnKeys(ctx context.Context, rdb *redis.Client) error {
	var keys []string
	iter := rdb.Scan(ctx, 0, namespace+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}
	return rdb.Del(ctx, keys...).Err()
}
