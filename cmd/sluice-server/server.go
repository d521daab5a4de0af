package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprometheus "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/sluicehq/sluice/backend/memory"
	redisbackend "github.com/sluicehq/sluice/backend/redis"
	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/cmd/sluice-server/internal/rls"
	"github.com/sluicehq/sluice/cmd/sluice-server/internal/rlsconfig"
	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/internal/redisconn"
	sluiceotel "github.com/sluicehq/sluice/otel"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/plans/postgres"
	"github.com/sluicehq/sluice/ratelimit"
)

// exampleConfig is the config served without --config: a domain of each
// form (envoyproxy/ratelimit's, sluice's bandwidths), which docs/server.md
// walks through.
//
//go:embed example.yaml
var exampleConfig []byte

// exampleName names the example config in logs and errors.
const exampleName = "example.yaml (built in)"

// ratelimitService is the RLS's full name, whose health grpc.health.v1
// reports.
const ratelimitService = "envoy.service.ratelimit.v3.RateLimitService"

// checkTimeout bounds the Redis check at start-up.
const checkTimeout = 5 * time.Second

// server is sluice-server's parts, which serve releases in the reverse of
// the order it acquired them.
type server struct {
	rls     *rls.Server
	grpc    *grpc.Server
	health  *health.Server
	http    *http.Server
	stopped atomic.Bool // set when shutting down: /healthcheck fails
	closers []func(context.Context) error
}

func (s *server) onClose(f func(context.Context) error) { s.closers = append(s.closers, f) }

// close releases what the server holds, the last acquired first.
func (s *server) close(ctx context.Context) error {
	var errs []error
	for _, f := range slices.Backward(s.closers) {
		errs = append(errs, f(ctx))
	}
	s.closers = nil
	return errors.Join(errs...)
}

// serve serves gRPC on grpcLn and HTTP on httpLn until ctx ends, then
// stops gracefully and releases everything. It closes both listeners.
// reloaded, if not nil, hears the outcome of each config reload.
func serve(ctx context.Context, grpcLn, httpLn net.Listener, opts options, log *slog.Logger, reloaded func(error)) error {
	s, err := newServer(ctx, opts, log, reloaded)
	if err != nil {
		_, _ = grpcLn.Close(), httpLn.Close()
		return err
	}
	served := make(chan error, 2)
	go func() { served <- s.grpc.Serve(grpcLn) }()
	go func() { served <- s.http.Serve(httpLn) }()
	log.Info("sluice-server serving", "grpc", grpcLn.Addr().String(), "http", httpLn.Addr().String(),
		"config", s.rls.Config().Files, "domains", s.rls.Config().Domains())

	var failed error
	select {
	case failed = <-served: // a listener failed
	case <-ctx.Done():
	}
	log.Info("sluice-server shutting down")
	s.stopped.Store(true)
	s.health.Shutdown()
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	graceful := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(graceful) }()
	select {
	case <-graceful:
	case <-stopCtx.Done():
		s.grpc.Stop()
		<-graceful
	}
	err = s.http.Shutdown(stopCtx)
	return errors.Join(failed, err, s.close(stopCtx))
}

// newServer builds the server of opts: its config, store, layers, plan
// store and handlers. What it acquired is released if it fails.
func newServer(ctx context.Context, opts options, log *slog.Logger, reloaded func(error)) (_ *server, err error) {
	s := new(server)
	defer func() {
		if err != nil {
			_ = s.close(context.WithoutCancel(ctx))
		}
	}()
	cfg, err := loadConfig(opts.config)
	if err != nil {
		return nil, err
	}
	// The gRPC TLS files are read before any store is dialled, so that a
	// bad one fails the start at once.
	var serverOpts []grpc.ServerOption
	if opts.grpcTLS.on() {
		tlsCfg, err := opts.grpcTLS.config(log)
		if err != nil {
			return nil, err
		}
		serverOpts = append(serverOpts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	registry := prometheus.NewRegistry()
	exporter, err := otelprometheus.New(otelprometheus.WithRegisterer(registry))
	if err != nil {
		return nil, err
	}
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	s.onClose(meters.Shutdown)

	store, remote, err := openStore(ctx, opts, log)
	if err != nil {
		return nil, err
	}
	s.onClose(store.close)
	telemetry := []sluiceotel.Option{
		sluiceotel.WithMeterProvider(meters),
		sluiceotel.WithBackendName(store.kind),
		// A bucket's class is its limit's place in the config (the
		// domain and descriptor keys), not the caller's values.
		sluiceotel.WithKeyClass(func(key string) string { return s.rls.Config().ClassOf(key) }),
	}
	st := &stacks{
		store:     store.backend,
		remote:    remote,
		telemetry: telemetry,
		policy: []failpolicy.Option{
			failpolicy.WithTimeout(opts.timeout),
			failpolicy.WithInstances(opts.replicas),
			failpolicy.WithHooks(sluiceotel.FailPolicyHooks(telemetry...)),
		},
	}
	s.onClose(func(context.Context) error { return st.Close() })

	var planSource rls.PlanSource
	if opts.postgres != "" {
		cache, err := s.openPlans(ctx, opts.postgres, telemetry, log)
		if err != nil {
			return nil, err
		}
		planSource = cache
	}
	s.rls, err = rls.New(cfg, rls.Options{
		Backend:         st.backend,
		FailModes:       rlsconfig.FailModes,
		DefaultFailMode: opts.failMode,
		Plans:           planSource,
		ShadowMode:      opts.shadow,
		QuotaMode:       opts.quota,
		DynamicMetadata: opts.metadata,
		Headers:         opts.headers,
		Meter:           meters.Meter("github.com/sluicehq/sluice/cmd/sluice-server"),
	})
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	if opts.config != "" {
		w, err := newWatcher(opts.config, s.rls, log, reloaded)
		if err != nil {
			return nil, err
		}
		s.onClose(func(context.Context) error { return w.Close() })
	}

	s.grpc = grpc.NewServer(serverOpts...)
	rlspb.RegisterRateLimitServiceServer(s.grpc, s.rls)
	s.health = health.NewServer()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(ratelimitService, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthcheck", func(w http.ResponseWriter, _ *http.Request) {
		if s.stopped.Load() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("OK\n"))
	})
	s.http = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return s, nil
}

// loadConfig loads the config at path, or the example config for "".
func loadConfig(path string) (*rlsconfig.Config, error) {
	if path == "" {
		return rlsconfig.Parse(rlsconfig.Source{Name: exampleName, Data: exampleConfig})
	}
	cfg, err := rlsconfig.Load(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	return cfg, nil
}

// store is where buckets live, with what to call to let it go.
type store struct {
	backend ratelimit.Backend
	kind    string // "memory", "redis (go-redis)", "redis (rueidis)"
	close   func(context.Context) error
}

// openStore returns the memory backend, or with a Redis deployment the
// backend of opts.client on a client built as the backends' docs advise
// (no retries: a retried decision would be charged twice; the context's
// deadline on the socket). It checks the servers first, so that a wrong
// address fails at start-up, and logs what the check finds unsafe.
// remote reports whether the store is Redis.
func openStore(ctx context.Context, opts options, log *slog.Logger) (st store, remote bool, err error) {
	if len(opts.redis.Addrs) == 0 {
		var mopts []memory.Option
		if opts.maxKeys > 0 {
			mopts = append(mopts, memory.WithMaxKeys(opts.maxKeys))
		}
		m := memory.New(mopts...)
		return store{backend: m, kind: "memory", close: func(context.Context) error { return m.Close() }}, false, nil
	}
	type checker interface {
		ratelimit.Backend
		Check(context.Context) (redisbackend.Report, error)
	}
	var (
		b        checker
		closeFn  func()
		settings []string
	)
	switch opts.client {
	case "rueidis":
		c, s, err := redisconn.Rueidis(opts.redis)
		if err != nil {
			return store{}, false, fmt.Errorf("redis: %w", err)
		}
		closeFn, settings = c.Close, s
		if b, err = rueidisbackend.New(c, rueidisbackend.WithPrefix(opts.prefix)); err != nil {
			c.Close()
			return store{}, false, err
		}
	default:
		c, s, err := redisconn.GoRedis(opts.redis)
		if err != nil {
			return store{}, false, fmt.Errorf("redis: %w", err)
		}
		closeFn, settings = func() { _ = c.Close() }, s
		if b, err = redisbackend.New(c, redisbackend.WithPrefix(opts.prefix)); err != nil {
			closeFn()
			return store{}, false, err
		}
	}
	checkCtx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	report, err := b.Check(checkCtx)
	switch {
	case errors.Is(err, redisbackend.ErrUnsafeServer):
		for _, p := range report.Problems {
			log.Warn("redis setting can break the limits", "problem", p)
		}
	case err != nil:
		closeFn()
		return store{}, false, fmt.Errorf("redis %v: %w", opts.redis.Addrs, err)
	}
	log.Info("redis client", "settings", settings)
	return store{
		backend: b,
		kind:    "redis (" + opts.client + ")",
		close:   func(context.Context) error { closeFn(); return nil },
	}, true, nil
}

// openPlans connects to the plan store at url and returns a cache of its
// plans that hears every change (LISTEN/NOTIFY) until the server closes.
func (s *server) openPlans(ctx context.Context, url string, telemetry []sluiceotel.Option, log *slog.Logger) (*plans.Cache, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("--postgres: %w", err)
	}
	s.onClose(func(context.Context) error { pool.Close(); return nil })
	pg, err := postgres.New(pool)
	if err != nil {
		return nil, fmt.Errorf("--postgres: %w", err)
	}
	cache, err := plans.NewCache(pg, plans.WithHooks(sluiceotel.PlanHooks(telemetry...)))
	if err != nil {
		return nil, err
	}
	listenCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := pg.Listen(listenCtx, cache); err != nil && listenCtx.Err() == nil {
			log.Error("plan store: listening stopped", "err", err)
		}
	}()
	s.onClose(func(context.Context) error { cancel(); <-done; return nil })
	return cache, nil
}
