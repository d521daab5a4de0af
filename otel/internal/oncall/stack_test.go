package oncall

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	otelprometheus "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/failpolicy"
	sluiceotel "github.com/sluicehq/sluice/otel"
	"github.com/sluicehq/sluice/ratelimit"
)

// service is what a rate-limited service runs: a limiter over Redis,
// the fail policy next to the store and the otel decorator outermost,
// counting into a meter provider whose reader is the Prometheus
// exporter, and /metrics serving what it gathers. It mirrors
// otel/examples/prometheus, so that the names the figures query are
// those a user of that wiring gets.
type service struct {
	limiter *ratelimit.Limiter
	// metricsURL is the /metrics Prometheus scrapes.
	metricsURL string
}

// startService wires the service to the Redis server at addr and serves
// /metrics on a free loopback port until the test ends.
func startService(t testing.TB, addr string) *service {
	t.Helper()
	registry := prometheus.NewRegistry()
	exporter, err := otelprometheus.New(otelprometheus.WithRegisterer(registry))
	if err != nil {
		t.Fatalf("oncall: Prometheus exporter: %v", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	telemetry := []sluiceotel.Option{
		sluiceotel.WithMeterProvider(mp),
		sluiceotel.WithKeyClass(keyClass),
	}

	opts := &redis.Options{Addr: addr}
	redisbackend.LowLatency(opts)
	client := redis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	store, err := redisbackend.New(client)
	if err != nil {
		t.Fatalf("oncall: Redis backend: %v", err)
	}
	backend, err := ratelimit.Stack(store,
		sluiceotel.Layer(telemetry...),
		failpolicy.Layer(failpolicy.Local, failpolicy.WithHooks(sluiceotel.FailPolicyHooks(telemetry...))),
	)
	if err != nil {
		t.Fatalf("oncall: Stack: %v", err)
	}
	t.Cleanup(func() { _ = backend.Close() })

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("oncall: listen for /metrics: %v", err)
	}
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return &service{limiter: ratelimit.New(backend), metricsURL: "http://" + ln.Addr().String() + "/metrics"}
}

// keyClass is the key class of the metrics: "customer" for a paying
// customer's API key, "anonymous" for a caller known by its address.
// Never the key itself.
func keyClass(key string) string {
	if strings.HasPrefix(key, "cust:") {
		return "customer"
	}
	return "anonymous"
}
