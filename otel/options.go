package otel

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// An Option configures [Wrap], [Layer] and the hooks ([FailPolicyHooks],
// [PlanHooks], [ShardingHooks]); each takes the options that concern it
// and ignores the others.
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	keyClass       func(key string) string
	route          func(ctx context.Context) string
	backendName    string
	rawKeys        bool
	rootSpans      bool
}

func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if c.tracerProvider == nil {
		c.tracerProvider = otel.GetTracerProvider()
	}
	if c.meterProvider == nil {
		c.meterProvider = otel.GetMeterProvider()
	}
	if c.route == nil {
		c.route = RouteFromContext
	}
	return c
}

// WithTracerProvider sets the provider of the tracer that makes the
// spans. A nil one is ignored. The default is the global provider.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) {
		if tp != nil {
			c.tracerProvider = tp
		}
	})
}

// WithMeterProvider sets the provider of the meter that makes the
// instruments. A nil one is ignored. The default is the global provider.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) {
		if mp != nil {
			c.meterProvider = mp
		}
	})
}

// WithKeyClass sets the function that gives a key's class, the
// [AttrKeyClass] of its spans and decision counts: a few values, such as
// "anonymous", "api_key" or a plan's name, never the key itself. It is
// called on every decision, so it must be fast and safe for concurrent
// use. Without it, decisions have no key class.
func WithKeyClass(class func(key string) string) Option {
	return optionFunc(func(c *config) { c.keyClass = class })
}

// WithRoute sets the function that gives a decision's route, its
// [AttrRoute], from the caller's context: an HTTP route template such as
// "/v1/search", never a path with IDs in it. It is called on every
// decision. The default is [RouteFromContext]; a nil one is ignored.
func WithRoute(route func(ctx context.Context) string) Option {
	return optionFunc(func(c *config) {
		if route != nil {
			c.route = route
		}
	})
}

// WithBackendName sets the [AttrBackend] of spans: "redis", say. The
// default is the Go type of the Backend wrapped.
func WithBackendName(name string) Option {
	return optionFunc(func(c *config) { c.backendName = name })
}

// WithRawKeys adds each decision's key to its span as [AttrKey]. Metrics
// never carry it. Keys are often personal data (an IP address, an
// account ID) or secrets (an API key): opt in only where traces may hold
// them.
func WithRawKeys() Option {
	return optionFunc(func(c *config) { c.rawKeys = true })
}

// WithRootSpans makes a span for a decision even when the caller's
// context holds no recording span: a root span, or a child the sampler
// may drop. By default such a decision makes no span; see the package
// doc.
func WithRootSpans() Option {
	return optionFunc(func(c *config) { c.rootSpans = true })
}

type routeKey struct{}

// ContextWithRoute returns a copy of ctx that carries route, for
// [RouteFromContext]: middleware that knows the route template of the
// request being limited sets it.
func ContextWithRoute(ctx context.Context, route string) context.Context {
	return context.WithValue(ctx, routeKey{}, route)
}

// RouteFromContext returns the route [ContextWithRoute] put in ctx, or "".
func RouteFromContext(ctx context.Context) string {
	r, _ := ctx.Value(routeKey{}).(string)
	return r
}
