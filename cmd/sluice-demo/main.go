// Command sluice-demo serves a web page that shows sluice limiting an API
// by plan, live: simulated clients (a free tenant, a pro tenant and two
// anonymous callers) send single requests or bursts, and the page shows
// every outcome (200 or 429, tokens remaining, Retry-After), a chart of each
// client's remaining tokens, the last response's headers as they came, and
// a form that revises a plan so that the next request is limited by it.
//
// From the repository root, with no setup:
//
//	go run ./cmd/sluice-demo                       # http://localhost:8080
//	go run ./cmd/sluice-demo --redis 127.0.0.1:6379
//	go run ./cmd/sluice-demo --redis 10.0.0.1:7000,10.0.0.2:7000 --cluster
//
// (or `go run .` in cmd/sluice-demo, a module of its own).
//
// # Flags
//
//	--listen ADDR   serve at ADDR, host:port (default ":8080")
//	--redis ADDR    keep buckets in the Redis server at ADDR instead of in
//	                memory; the client has MaxRetries -1 and
//	                ContextTimeoutEnabled, as the README advises, and a local
//	                fail policy decides while the server is away
//	--cluster       read --redis as a comma-separated list of Redis Cluster
//	                seed addresses
//	--replicas N    how many demo processes share the --redis buckets
//	                (default 1, at most 1000): while Redis is away each
//	                decides in 1/N of each limit (failpolicy.WithInstances),
//	                so that N replicas together stay within it
//
// In front of Redis the fail policy has a 2s deadline, not the default
// 50ms: a busy machine misses 50ms on healthy calls, which opens the
// breaker and sends every decision to the shares; with 2s only a Redis
// that is really down (or hung) does. Two replicas on one Redis:
//
//	go run ./cmd/sluice-demo --redis 127.0.0.1:6379 --replicas 2 --listen :8080
//	go run ./cmd/sluice-demo --redis 127.0.0.1:6379 --replicas 2 --listen :8081
//
// A flag that does not hold ends the program with status 2 and a message
// naming the flag. SIGINT or SIGTERM shuts the server down gracefully and
// closes the limiter and its store.
//
// # Endpoints
//
//	GET /                  the page (embedded; nothing loaded from elsewhere)
//	GET /api/hello         the rate-limited API, behind httplimit with plans
//	GET /api/plans         the plans as they are now
//	PUT /api/plans/{name}  revise a plan: {"algorithm":"GCRA","capacity":20,
//	                       "refill_tokens":5,"refill_period":"1s"}; a bad field
//	                       is a 400 naming it, and changes nothing
//	GET /metrics           Prometheus metrics: sluice_rate_limit_* and
//	                       sluice_plan_cache_*, through the OpenTelemetry
//	                       exporter
//
// # Callers
//
// A request with X-API-Key: demo-free is from tenant acme, on plan "free";
// demo-pro is tenant globex, on plan "pro"; no key is an anonymous caller,
// on plan "anonymous", with a bucket per client address. So that one
// browser can play several anonymous clients, the demo reads
// X-Forwarded-For from loopback peers, as if a proxy ran there. That is
// for the demo only: anything trusted as a proxy can choose the address it
// is limited by, so a real service names only its own proxies.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// shutdownTimeout is how long a shutdown waits for requests in flight.
const shutdownTimeout = 10 * time.Second

func main() {
	opts, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-demo:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(ctx, opts, log); err != nil {
		log.Error("sluice-demo failed", "err", err)
		stop()
		os.Exit(1)
	}
}

// run serves the demo at opts.listen until ctx ends.
func run(ctx context.Context, opts options, log *slog.Logger) error {
	ln, err := net.Listen("tcp", opts.listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", opts.listen, err)
	}
	return serve(ctx, ln, opts, log)
}

// serve serves the demo on ln until ctx ends, then shuts the server down,
// waiting up to shutdownTimeout for requests in flight, and closes the
// limiter and its store. It closes ln.
func serve(ctx context.Context, ln net.Listener, opts options, log *slog.Logger) error {
	d, err := newDemo(ctx, opts, log)
	if err != nil {
		_ = ln.Close()
		return err
	}
	srv := &http.Server{
		Handler:           d.handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("sluice demo serving", "url", pageURL(ln.Addr()), "store", d.storeKind)

	select {
	case err := <-served: // the listener failed
		return errors.Join(err, d.Close(context.WithoutCancel(ctx)))
	case <-ctx.Done():
	}
	log.Info("sluice demo shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	err = srv.Shutdown(shutdownCtx)
	if serveErr := <-served; !errors.Is(serveErr, http.ErrServerClosed) {
		err = errors.Join(err, serveErr)
	}
	return errors.Join(err, d.Close(shutdownCtx))
}

// pageURL is where a browser on this machine finds the page served at addr.
func pageURL(addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return "http://" + addr.String() + "/"
	}
	host := tcp.IP.String()
	if tcp.IP.IsUnspecified() {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, fmt.Sprint(tcp.Port)) + "/"
}
