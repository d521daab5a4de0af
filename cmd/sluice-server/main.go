// Command sluice-server is Envoy's global rate limit service (the RLS v3
// gRPC API, envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit)
// on sluice's algorithms and stores. Envoy, Istio and Envoy Gateway call it
// to ask whether a request may pass; any language behind them gets
// sluice's limits.
//
// It reads envoyproxy/ratelimit's YAML config, with sluice's own fields
// (any of the six algorithms, several bandwidths, burst, plans from
// PostgreSQL, sub-buckets for hot keys and a fail mode per domain), and
// reloads it when the files change: a bad file is refused whole, naming
// the line and field, and the config before it keeps serving.
//
// Usage:
//
//	sluice-server [--config PATH] [--redis ADDR | --cluster ADDRS | --sentinel ADDRS --master NAME] [flags]
//
// With no --config it serves the example config built in (example.yaml
// beside this file); with no Redis flag the buckets live in memory. gRPC
// (the RLS API, grpc.health.v1 and server reflection) is served at --grpc
// (default :8081), Prometheus metrics at /metrics and a health check at
// /healthcheck on --http (default :8080). --grpc-tls-cert and
// --grpc-tls-key serve gRPC over TLS, --grpc-tls-client-ca with client
// certificates required. Flag errors exit with status 2
// and a message naming the flag; SIGINT or SIGTERM stops the server
// gracefully. docs/server.md is the guide: deploying it beside Envoy, the
// config reference, fail modes, metrics and migrating from
// envoyproxy/ratelimit.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// shutdownTimeout bounds the graceful stop: calls in flight get this long
// to finish.
const shutdownTimeout = 10 * time.Second

func main() {
	opts, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-server:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var handler slog.Handler = slog.NewTextHandler(os.Stderr, nil)
	if opts.logFormat == "json" {
		handler = slog.NewJSONHandler(os.Stderr, nil)
	}
	log := slog.New(handler)
	if err := run(ctx, opts, log); err != nil {
		log.Error("sluice-server failed", "err", err)
		stop()
		os.Exit(1)
	}
}

// run serves at opts' addresses until ctx ends.
func run(ctx context.Context, opts options, log *slog.Logger) error {
	grpcLn, err := net.Listen("tcp", opts.grpcAddr)
	if err != nil {
		return fmt.Errorf("--grpc %s: %w", opts.grpcAddr, err)
	}
	httpLn, err := net.Listen("tcp", opts.httpAddr)
	if err != nil {
		_ = grpcLn.Close()
		return fmt.Errorf("--http %s: %w", opts.httpAddr, err)
	}
	return serve(ctx, grpcLn, httpLn, opts, log, nil)
}
