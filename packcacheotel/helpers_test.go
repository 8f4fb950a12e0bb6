package packcacheotel_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/packcacheotel"
)

func TestMain(m *testing.M) {
	// go-redis logs dial failures through its own global logger; the tests
	// that stop servers make plenty.
	redis.SetLogger(quietLogger{})
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// newObserver returns an Observer recording into a meter provider of its
// own, and the reader to collect what it recorded.
func newObserver(t testing.TB, opts ...packcacheotel.Option) (packcache.Observer, *sdkmetric.ManualReader) {
	t.Helper()
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() {
		if err := mp.Shutdown(context.Background()); err != nil {
			t.Errorf("shutting the meter provider down: %v", err)
		}
	})
	o, err := packcacheotel.NewObserver(append([]packcacheotel.Option{packcacheotel.WithMeterProvider(mp)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return o, r
}

// snapshot is what a reader collected, with lookups by instrument name
// and attributes.
type snapshot struct {
	t  testing.TB
	rm metricdata.ResourceMetrics
}

func collect(t testing.TB, r *sdkmetric.ManualReader) *snapshot {
	t.Helper()
	s := &snapshot{t: t}
	if err := r.Collect(context.Background(), &s.rm); err != nil {
		t.Fatal(err)
	}
	return s
}

// metric returns the instrument named name, or false if nothing was
// recorded with it.
func (s *snapshot) metric(name string) (metricdata.Metrics, bool) {
	for _, sm := range s.rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// matches reports whether set has every attribute of want. A want whose
// value is the empty string also matches a set without that key.
func matches(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		v, ok := set.Value(kv.Key)
		if !ok && kv.Value.Type() == attribute.STRING && kv.Value.AsString() == "" {
			continue
		}
		if !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// sum adds up the counter name's data points that have the attributes want.
func (s *snapshot) sum(name string, want ...attribute.KeyValue) int64 {
	s.t.Helper()
	m, ok := s.metric(name)
	if !ok {
		return 0
	}
	d, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		s.t.Fatalf("%s is a %T, want an int64 sum", name, m.Data)
	}
	var n int64
	for _, p := range d.DataPoints {
		if matches(p.Attributes, want) {
			n += p.Value
		}
	}
	return n
}

// hist returns the count and the sum of the histogram name's data points
// that have the attributes want.
func (s *snapshot) hist(name string, want ...attribute.KeyValue) (count uint64, sum float64) {
	s.t.Helper()
	m, ok := s.metric(name)
	if !ok {
		return 0, 0
	}
	d, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		s.t.Fatalf("%s is a %T, want a float64 histogram", name, m.Data)
	}
	for _, p := range d.DataPoints {
		if matches(p.Attributes, want) {
			count += p.Count
			sum += p.Sum
		}
	}
	return count, sum
}

// gauge returns the data points of the gauge name that have the attributes
// want.
func (s *snapshot) gauge(name string, want ...attribute.KeyValue) []metricdata.DataPoint[int64] {
	s.t.Helper()
	m, ok := s.metric(name)
	if !ok {
		return nil
	}
	d, ok := m.Data.(metricdata.Gauge[int64])
	if !ok {
		s.t.Fatalf("%s is a %T, want an int64 gauge", name, m.Data)
	}
	var pts []metricdata.DataPoint[int64]
	for _, p := range d.DataPoints {
		if matches(p.Attributes, want) {
			pts = append(pts, p)
		}
	}
	return pts
}

// The attributes, as the package documents them.
func prefix(p string) attribute.KeyValue  { return attribute.String("packcache.prefix", p) }
func outcome(o string) attribute.KeyValue { return attribute.String("packcache.outcome", o) }
func shared(b bool) attribute.KeyValue    { return attribute.Bool("packcache.shared", b) }
func codecName(c string) attribute.KeyValue {
	return attribute.String("packcache.codec.name", c)
}
func direction(d string) attribute.KeyValue { return attribute.String("packcache.codec.direction", d) }
func form(f string) attribute.KeyValue      { return attribute.String("packcache.codec.form", f) }
func errorType(e string) attribute.KeyValue { return attribute.String("error.type", e) }
func address(a string) attribute.KeyValue   { return attribute.String("server.address", a) }
func port(p int) attribute.KeyValue         { return attribute.Int("server.port", p) }
