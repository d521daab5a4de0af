package main

import (
	"context"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprometheus "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	sluiceotel "github.com/sluicehq/sluice/otel"
)

// metrics gathers what sluice's otel instrumentation counts and serves it
// to Prometheus: the instruments count through a meter provider whose
// reader is the OpenTelemetry Prometheus exporter, registered with a
// registry of the demo's own (not the global one, so that two demos in one
// test binary do not collide).
type metrics struct {
	provider *sdkmetric.MeterProvider
	handler  http.Handler
}

func newMetrics() (*metrics, error) {
	registry := prometheus.NewRegistry()
	exporter, err := otelprometheus.New(otelprometheus.WithRegisterer(registry))
	if err != nil {
		return nil, err
	}
	return &metrics{
		provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter)),
		handler:  promhttp.HandlerFor(registry, promhttp.HandlerOpts{}),
	}, nil
}

// options are the otel options of the decorator and the hooks: this
// provider, and the plan a key belongs to as its class.
func (m *metrics) options() []sluiceotel.Option {
	return []sluiceotel.Option{
		sluiceotel.WithMeterProvider(m.provider),
		sluiceotel.WithKeyClass(planOfKey),
	}
}

func (m *metrics) shutdown(ctx context.Context) error { return m.provider.Shutdown(ctx) }

// planOfKey is a bucket key's class for the metrics: the plan segment of
// httplimit's key layout, rl:{tenant}:{plan}:{route}:{kind}:{id}. The demo's
// plans are a handful, so the class has few values, and it never carries
// the caller's key or address.
func planOfKey(key string) string {
	parts := strings.SplitN(key, ":", 4)
	if len(parts) < 4 {
		return "other"
	}
	if _, ok := findPlan(parts[2]); !ok {
		return "other"
	}
	return parts[2]
}
