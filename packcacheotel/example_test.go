package packcacheotel_test

import (
	"context"
	"fmt"
	"log"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/packcacheotel"
)

// A cache whose reads and loads are recorded by OpenTelemetry. A real
// program passes its MeterProvider (or none, for the global one) and an
// exporter reads the metrics; here a ManualReader shows what was recorded.
func ExampleNewObserver() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	obs, err := packcacheotel.NewObserver(
		packcacheotel.WithMeterProvider(mp),
		packcacheotel.WithAttributes(attribute.String("packcache.cache", "users")))
	if err != nil {
		log.Fatal(err)
	}

	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	type User struct{ Name string }
	c, err := packcache.New[User](rdb, packcache.WithObserver(obs), packcache.WithShareWindow(packcache.Off),
		packcache.WithPrefix("user:", packcache.Policy{}),
		packcache.WithLoader(packcache.LoaderFunc[User](func(ctx context.Context, key string) (User, error) {
			return User{Name: "Ada"}, nil
		})))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx := context.Background()
	for range 3 {
		c.Get(ctx, "user:1") // a miss, loaded; then two hits
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			if m.Name != "packcache.reads" {
				continue
			}
			for _, p := range d.DataPoints {
				outcome, _ := p.Attributes.Value("packcache.outcome")
				prefix, _ := p.Attributes.Value("packcache.prefix")
				fmt.Printf("%s{prefix=%q, outcome=%s}: %d\n", m.Name, prefix.AsString(), outcome.AsString(), p.Value)
			}
		case metricdata.Histogram[float64]:
			if m.Name != "packcache.load.duration" {
				continue
			}
			for _, p := range d.DataPoints {
				fmt.Printf("%s: %d load\n", m.Name, p.Count)
			}
		}
	}
	// Unordered output:
	// packcache.reads{prefix="user:", outcome=miss}: 1
	// packcache.reads{prefix="user:", outcome=hit}: 2
	// packcache.load.duration: 1 load
}
