// Command prometheus serves sluice's decision metrics to Prometheus: the
// otel decorator and the fail policy's hooks count through an
// OpenTelemetry meter provider whose reader is the Prometheus exporter,
// and /metrics serves what it gathers. A small API, /v1/search, is rate
// limited per caller, and the command sends itself a little traffic at
// start so that /metrics has something to show.
//
//	cd otel/examples/prometheus && go run .
//	curl -s localhost:9464/metrics | grep sluice
//	curl -si -H 'X-API-Key: k1' localhost:9464/v1/search
//
// With -redis ADDR the buckets live in that Redis server.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	otelprometheus "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicehq/sluice/backend/memory"
	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/failpolicy"
	sluiceotel "github.com/sluicehq/sluice/otel"
	"github.com/sluicehq/sluice/ratelimit"
)

func main() {
	addr := flag.String("addr", "localhost:9464", "serve /metrics and /v1/search at this address")
	redisAddr := flag.String("redis", "", "keep buckets in the Redis server at this address instead of in memory")
	flag.Parse()
	if err := run(*addr, *redisAddr); err != nil {
		log.Fatal(err)
	}
}

func run(addr, redisAddr string) error {
	// The exporter is a metric reader that registers with a Prometheus
	// registry; the meter provider feeds it.
	registry := prometheus.NewRegistry()
	exporter, err := otelprometheus.New(otelprometheus.WithRegisterer(registry))
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer mp.Shutdown(context.Background())
	telemetry := []sluiceotel.Option{
		sluiceotel.WithMeterProvider(mp),
		sluiceotel.WithKeyClass(keyClass),
	}

	store, closeStore, err := newStore(redisAddr)
	if err != nil {
		return err
	}
	defer closeStore()
	backend, err := ratelimit.Stack(store,
		sluiceotel.Layer(telemetry...),
		failpolicy.Layer(failpolicy.Local, failpolicy.WithHooks(sluiceotel.FailPolicyHooks(telemetry...))),
	)
	if err != nil {
		return err
	}
	defer backend.Close()
	limiter := ratelimit.New(backend)

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	mux.Handle("GET /v1/search", limited(limiter, "/v1/search", search))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	log.Printf("serving http://%s/metrics and http://%s/v1/search", ln.Addr(), ln.Addr())
	go selfTraffic("http://" + ln.Addr().String())
	err = http.Serve(ln, mux)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// newStore returns the memory backend, or with addr sluice's go-redis
// backend on a client with low-latency settings.
func newStore(addr string) (ratelimit.Backend, func(), error) {
	if addr == "" {
		m := memory.New()
		return m, func() { _ = m.Close() }, nil
	}
	opts := &redis.Options{Addr: addr}
	redisbackend.LowLatency(opts)
	client := redis.NewClient(opts)
	b, err := redisbackend.New(client)
	if err != nil {
		_ = client.Close()
		return nil, nil, err
	}
	return b, func() { _ = client.Close() }, nil
}

// keyClass puts keys in classes for the metrics: never the key itself.
func keyClass(key string) string {
	if len(key) > 4 && key[:4] == "key:" {
		return "api_key"
	}
	return "anonymous"
}

// searchLimit is ten requests a second per caller, in bursts of up to 20.
var searchLimit = ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10).WithBurst(20)}}

// limited rate limits h per caller, by API key, else by client address,
// and puts the route in the context for the metrics.
func limited(l *ratelimit.Limiter, route string, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := "ip:" + clientIP(r)
		if k := r.Header.Get("X-API-Key"); k != "" {
			key = "key:" + k
		}
		ctx := sluiceotel.ContextWithRoute(r.Context(), route)
		d, err := l.Allow(ctx, key, searchLimit)
		if err != nil {
			http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
			return
		}
		if !d.Allowed {
			w.Header().Set("Retry-After", strconv.FormatInt(int64((d.RetryAfter+time.Second-1)/time.Second), 10))
			http.Error(w, "too many requests", http.StatusTooManyRequests)
			return
		}
		h(w, r.WithContext(ctx))
	})
}

func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func search(w http.ResponseWriter, _ *http.Request) {
	fmt.Fprintln(w, `{"results":[]}`)
}

// selfTraffic sends a burst from three API keys and one anonymous
// caller, some past their limit, so that /metrics shows each result.
func selfTraffic(base string) {
	client := &http.Client{Timeout: 5 * time.Second}
	for i := range 100 {
		req, err := http.NewRequest(http.MethodGet, base+"/v1/search", nil)
		if err != nil {
			log.Print(err)
			return
		}
		if k := i % 4; k > 0 {
			req.Header.Set("X-API-Key", "k"+strconv.Itoa(k))
		}
		resp, err := client.Do(req)
		if err != nil {
			log.Print(err)
			return
		}
		_ = resp.Body.Close()
	}
}
