package otel_test

import (
	"context"
	"fmt"
	"log"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprometheus "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/lease"
	sluiceotel "github.com/sluicehq/sluice/otel"
	"github.com/sluicehq/sluice/ratelimit"
)

// Wrap a backend, and count its decisions by result and key class.
func ExampleWrap() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	store := memory.New()
	defer store.Close()
	backend := sluiceotel.Wrap(store,
		sluiceotel.WithMeterProvider(mp),
		sluiceotel.WithKeyClass(func(key string) string { return strings.SplitN(key, ":", 2)[0] }),
	)
	limiter := ratelimit.New(backend)

	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(2)}}
	ctx := sluiceotel.ContextWithRoute(context.Background(), "/v1/search")
	for range 3 {
		if _, err := limiter.Allow(ctx, "user:42", cfg); err != nil {
			log.Fatal(err)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name != sluiceotel.MetricDecisions {
			continue
		}
		for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
			result, _ := dp.Attributes.Value(sluiceotel.AttrResult)
			class, _ := dp.Attributes.Value(sluiceotel.AttrKeyClass)
			route, _ := dp.Attributes.Value(sluiceotel.AttrRoute)
			fmt.Printf("%s %s %s: %d\n", route.AsString(), class.AsString(), result.AsString(), dp.Value)
		}
	}
	// Unordered output:
	// /v1/search user allowed: 2
	// /v1/search user rejected: 1
}

// Serve the metrics to Prometheus: the exporter is the meter provider's
// reader, and promhttp serves its registry. The fail policy's hooks count
// through the same provider.
func ExampleLayer_prometheus() {
	registry := prometheus.NewRegistry()
	exporter, err := otelprometheus.New(otelprometheus.WithRegisterer(registry))
	if err != nil {
		log.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	telemetry := []sluiceotel.Option{sluiceotel.WithMeterProvider(mp)}

	store := memory.New()
	defer store.Close()
	backend, err := ratelimit.Stack(store,
		sluiceotel.Layer(telemetry...),
		failpolicy.Layer(failpolicy.Local, failpolicy.WithHooks(sluiceotel.FailPolicyHooks(telemetry...))),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	limiter := ratelimit.New(backend)
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(1)}}
	for range 2 {
		if _, err := limiter.Allow(context.Background(), "user:42", cfg); err != nil {
			log.Fatal(err)
		}
	}

	// What GET /metrics answers, a server's mux.Handle("/metrics", ...).
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(registry, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for line := range strings.Lines(rec.Body.String()) {
		if strings.HasPrefix(line, "sluice_rate_limit_decisions_total") {
			fmt.Print(line)
		}
	}
	// Unordered output:
	// sluice_rate_limit_decisions_total{otel_scope_name="github.com/sluicehq/sluice/otel",otel_scope_schema_url="",otel_scope_version="0.1.0",sluice_rate_limit_algorithm="TokenBucket",sluice_rate_limit_operation="Consume",sluice_rate_limit_result="allowed"} 1
	// sluice_rate_limit_decisions_total{otel_scope_name="github.com/sluicehq/sluice/otel",otel_scope_schema_url="",otel_scope_version="0.1.0",sluice_rate_limit_algorithm="TokenBucket",sluice_rate_limit_operation="Consume",sluice_rate_limit_result="rejected"} 1
}

// Report a lease.Backend's counts: the store calls its leases take, and
// the decisions they serve in process.
func ExampleLeaseMetrics() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	store := memory.New()
	defer store.Close()
	leased, err := lease.New(store, lease.Keys("global"), lease.WithRefillTimeout(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer leased.Close()
	stop := sluiceotel.LeaseMetrics(leased, sluiceotel.WithMeterProvider(mp))
	defer stop()

	limiter := ratelimit.New(leased)
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1000).WithBurst(1000)}}
	for range 100 {
		if _, err := limiter.Allow(context.Background(), "global", cfg); err != nil {
			log.Fatal(err)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	values := map[string]int64{}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			for _, dp := range d.DataPoints {
				values[m.Name] += dp.Value
			}
		case metricdata.Gauge[int64]:
			values[m.Name] = d.DataPoints[0].Value
		}
	}
	fmt.Println("decided in process:", values[sluiceotel.MetricLeaseDecisions])
	fmt.Println("fewer store calls:", values[sluiceotel.MetricLeaseRefills] < values[sluiceotel.MetricLeaseDecisions])
	fmt.Println("keys leased:", values[sluiceotel.MetricLeaseKeys])
	// Output:
	// decided in process: 100
	// fewer store calls: true
	// keys leased: 1
}
