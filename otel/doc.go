// Package otel reports sluice's rate-limit decisions to OpenTelemetry: a
// [ratelimit.Backend] decorator that makes a span for each decision and
// counts decisions by outcome, and hooks that report what the fail
// policy, the plan cache and sharding do.
//
// Its name is that of the OpenTelemetry API's package, so import it
// under another:
//
//	import sluiceotel "github.com/sluicehq/sluice/otel"
//
//	backend := sluiceotel.Wrap(redisBackend, sluiceotel.WithKeyClass(classOf))
//	limiter := ratelimit.New(backend)
//
// or, with other decorators, let [ratelimit.Stack] put it outermost, where
// it sees each decision as the caller gets it:
//
//	backend, err := ratelimit.Stack(redisBackend,
//		sluiceotel.Layer(sluiceotel.WithKeyClass(classOf)),
//		failpolicy.Layer(failpolicy.Local, failpolicy.WithHooks(sluiceotel.FailPolicyHooks())),
//	)
//
// It follows the OpenTelemetry Go contrib instrumentation conventions:
// [WithTracerProvider] and [WithMeterProvider] choose the providers. By
// default they are the global ones, and a decorator made before the
// program sets them (with go.opentelemetry.io/otel's SetTracerProvider
// and SetMeterProvider) reports to them once it does. The tracer and
// meter are named [ScopeName], at [Version]. An instrument that cannot be
// created is reported to otel.Handle and left out; the rest still work.
//
// It is a module of its own, so that a service that does not use
// OpenTelemetry does not build it: the OpenTelemetry release it pins,
// v1.47.0, needs Go 1.26.
//
// # Spans
//
// A decision made while the caller's context holds a recording span (an
// HTTP server span that its sampler kept, say) gets a child span, named
// "sluice " and the op ("sluice Consume"), of kind internal. A decision
// under no span or under one that is not recording makes none, unless
// [WithRootSpans]: a parent-based sampler, the SDK's default, would not
// keep it, and making it is most of what tracing costs. Its attributes
// are listed in docs/observability.md: the op, tokens, key class, route,
// algorithm, backend and config version at the start, then the
// decision's result, allowed, degraded, limit, remaining, consumed,
// retry-after, reset-after and binding bandwidth. A decision that ends in
// an error gets status Error, with the error's sentinel as description,
// and an [AttrErrorType] attribute naming it.
//
// # Metrics
//
//   - sluice.rate_limit.decisions, a counter of decisions by result
//     (allowed, rejected, degraded, error), op, algorithm, key class and
//     route;
//   - sluice.rate_limit.decision.duration, a histogram in seconds of the
//     time each decision took below the decorator, by op and result, with
//     buckets from 10µs ([DurationBuckets]);
//   - sluice.rate_limit.rejected_keys, a gauge of the distinct keys
//     rejected in the last whole minute, by key class and route
//     ([MetricRejectedKeys]): few keys is abuse, many a limit set too low;
//
// for concurrency permits (see Permits below):
//
//   - sluice.rate_limit.permit.decisions, a counter of permit calls by
//     result, op, key class and route ([MetricPermitDecisions]): a
//     denied acquire is an Acquire of result rejected;
//   - sluice.rate_limit.permit.in_flight, an up-down counter of the
//     permits this process holds, by key class ([MetricPermitsInFlight]);
//   - sluice.rate_limit.permit.duration, a histogram of how long permit
//     calls took, by op and result ([MetricPermitDuration]);
//
// and through the hooks: sluice.rate_limit.degraded and
// sluice.rate_limit.breakers ([FailPolicyHooks]),
// sluice.plan_cache.lookups and sluice.plan_cache.loads ([PlanHooks]),
// and sluice.sharding.retries ([ShardingHooks]); and a lease.Backend's
// counts, sluice.lease.decisions, .refills, .tokens and .keys
// ([LeaseMetrics]).
//
// # Permits
//
// A permit call ([Backend.DoPermit]: what a Limiter's TryAcquire and
// Acquire, and a Permit's Release and Renew, make) gets a span as a
// decision does, named "sluice " and its op ("sluice Acquire", "sluice
// Release", "sluice Renew", "sluice InspectPermits"), with the op,
// weight, lease, key class, route and backend at the start, and the
// result, granted, degraded, limit, in-flight and retry-after at the end;
// an error is recorded as a decision's is. It is counted in
// sluice.rate_limit.permit.decisions: result allowed when granted,
// rejected when not (an acquire denied, or a release or renewal of a
// permit the store no longer held), degraded when a fail policy decided.
//
// sluice.rate_limit.permit.in_flight goes up by a granted Acquire's
// Weight and down by every Release's Weight, whatever the store answered:
// a Permit is released once, and once released it is not this process's,
// whether the store still held it or had reclaimed it when its lease
// ended ([ratelimit.ErrPermitLost]), or could not be asked. Only a call
// turned away before any store (bad input, a Backend that holds no
// permits) leaves it as it is. It is kept by key class alone, not by
// route: a permit may be released under a context other than its
// acquire's. A permit never released stays counted, which is what a leak
// looks like. The count is of the calls this decorator sees: an acquire
// sent again by the holder that holds it, which a Permit never does,
// would count twice.
//
// # Raw keys
//
// A bucket's key is a customer's ID, an IP address or an API key: too
// many values for a metric's attribute, and not for telemetry to carry.
// Spans and metrics carry a key class instead, what [WithKeyClass]'s
// function makes of the key ("anonymous", "api_key", a plan's name), and
// never the key or an error message that may hold it. [WithRawKeys] adds
// the key to spans, and to spans only.
package otel
