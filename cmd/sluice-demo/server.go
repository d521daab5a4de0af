package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/httplimit"
	sluiceotel "github.com/sluicehq/sluice/otel"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/ratelimit"
)

// routeHello is the rate-limited endpoint's pattern, and its route in the
// bucket keys and the metrics.
const routeHello = "GET /api/hello"

// trustedProxies are the addresses whose X-Forwarded-For the middleware
// reads: loopback only, so that the page can play several anonymous
// clients from one browser on the same machine. This is for the demo
// alone: a real service names its own proxies, since any client that is
// trusted here can choose the address it is limited by.
var trustedProxies = []string{"127.0.0.1/32", "::1/128"}

// A demo is the demo's HTTP handler and what it holds.
type demo struct {
	handler http.Handler
	// storeKind says where the buckets live: "memory", "redis" or
	// "redis cluster".
	storeKind string
	closers   []func(context.Context) error
}

// newDemo builds the demo on the store opts names: the plans, the limiter
// with its telemetry, and the routes. Close releases it all.
func newDemo(ctx context.Context, opts options, log *slog.Logger) (_ *demo, err error) {
	d := new(demo)
	defer func() {
		if err != nil {
			_ = d.Close(context.WithoutCancel(ctx))
		}
	}()

	m, err := newMetrics()
	if err != nil {
		return nil, err
	}
	d.onClose(m.shutdown)
	telemetry := m.options()

	st, err := openStore(ctx, opts, log)
	if err != nil {
		return nil, err
	}
	d.onClose(func(context.Context) error { return st.close() })
	d.storeKind = st.kind
	backend, err := newBackend(st, opts.replicas, telemetry)
	if err != nil {
		return nil, err
	}
	d.onClose(func(context.Context) error { return backend.Close() })

	planStore, err := newPlanStore()
	if err != nil {
		return nil, err
	}
	// The plan store is in memory and never hangs: a lookup that waits for
	// a read (a new subject's, or the first after a plan change) waits for
	// it to end, rather than plans.DefaultReadWait at most, so that a
	// change applies on the next request however busy the machine is.
	cache, err := plans.NewCache(planStore, plans.WithReadWait(time.Minute), plans.WithHooks(sluiceotel.PlanHooks(telemetry...)))
	if err != nil {
		return nil, err
	}
	planStore.Notify(cache) // a PutPlan applies on the next request
	limit, err := httplimit.New(ratelimit.New(backend),
		httplimit.WithPlans(cache),
		httplimit.WithTrustedProxies(httplimit.XForwardedFor, trustedProxies...),
	)
	if err != nil {
		return nil, err
	}

	api := planAPI{store: planStore, storeKind: st.kind}
	mux := http.NewServeMux()
	mux.Handle(routeHello, authenticate(withRoute(routeHello, limit(hello{cache: cache, store: st.kind}))))
	mux.HandleFunc("GET /api/plans", api.list)
	mux.HandleFunc("PUT /api/plans/{name}", api.put)
	mux.Handle("GET /metrics", m.handler)
	mux.Handle("GET /", staticFiles())
	d.handler = mux
	return d, nil
}

// redisDeadline is the fail policy's per-decision deadline in front of
// Redis (failpolicy.WithTimeout). The default, 50ms, is met by a healthy
// Redis on a quiet machine, but a busy one misses it: the misses opened
// the breaker, and each replica then decided alone, in its share, while
// Redis was fine (issue 28, item 7: two replicas admitted 33 and 27
// against a bound of 14). Only a Redis that is really down should open
// the breaker. A stopped one refuses connections, which fails a decision
// within go-redis's dial retries (5, 100ms apart) whatever the deadline,
// so the deadline matters only for a hung one: 2s, far beyond any
// healthy call on a loaded machine, and below the client's own 5s read
// and write timeouts, so that the policy's deadline ends the call.
const redisDeadline = 2 * time.Second

// newBackend puts sluice's decorators around the store: the telemetry
// always, and in front of Redis a fail policy that decides locally while
// the server is away, rather than failing every request, each of the
// replicas in its share of each limit.
func newBackend(st store, replicas int, telemetry []sluiceotel.Option) (*ratelimit.Stacked, error) {
	layers := []ratelimit.Layer{sluiceotel.Layer(telemetry...)}
	if st.kind != "memory" {
		layers = append(layers, failpolicy.Layer(failpolicy.Local,
			failpolicy.WithInstances(max(1, replicas)),
			failpolicy.WithTimeout(redisDeadline),
			failpolicy.WithHooks(sluiceotel.FailPolicyHooks(telemetry...))))
	}
	return ratelimit.Stack(st.backend, layers...)
}

func (d *demo) onClose(f func(context.Context) error) { d.closers = append(d.closers, f) }

// Close releases what the demo holds, the last acquired first, and returns
// the errors joined.
func (d *demo) Close(ctx context.Context) error {
	var errs []error
	for i := len(d.closers) - 1; i >= 0; i-- {
		errs = append(errs, d.closers[i](ctx))
	}
	d.closers = nil
	return errors.Join(errs...)
}

// withRoute puts the route in the request's context for the metrics:
// httplimit keys buckets by r.Pattern, but the otel decorator below the
// limiter sees only the context.
func withRoute(route string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(sluiceotel.ContextWithRoute(r.Context(), route)))
	})
}

// authenticate is the demo's auth layer: it maps the X-API-Key header to
// the caller the key belongs to, as a real one would after checking the
// key, and hands it to the rate limiter. A request without a key is
// anonymous, limited by its address; an unknown key is refused.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secret := r.Header.Get("X-API-Key")
		if secret == "" {
			next.ServeHTTP(w, r)
			return
		}
		caller, ok := demoKeys[secret]
		if !ok {
			writeJSON(w, http.StatusUnauthorized, errorJSON{
				Error: "unknown API key: the demo's keys are demo-free and demo-pro",
				Field: "X-API-Key",
			})
			return
		}
		next.ServeHTTP(w, r.WithContext(httplimit.ContextWithCaller(r.Context(), caller)))
	})
}

// hello is the rate-limited endpoint: it says who called and on which plan.
type hello struct {
	cache *plans.Cache
	store string
}

// helloJSON is GET /api/hello's answer.
type helloJSON struct {
	Message     string `json:"message"`
	Subject     string `json:"subject"`
	Plan        string `json:"plan"`
	PlanVersion uint64 `json:"plan_version"`
	Store       string `json:"store"`
	Time        string `json:"time"`
}

func (h hello) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c, _ := httplimit.CallerFromContext(r.Context())
	subject := c.Subject() // the plan the middleware limited this request by
	a, err := h.cache.Lookup(r.Context(), subject)
	if err != nil { // only the request's own context ending
		return
	}
	writeJSON(w, http.StatusOK, helloJSON{
		Message:     fmt.Sprintf("hello, %s", subject),
		Subject:     subject,
		Plan:        a.Plan.Name,
		PlanVersion: a.Plan.Version,
		Store:       h.store,
		Time:        time.Now().UTC().Format(time.RFC3339Nano),
	})
}
