package otel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/sharding"
)

// The hooks count what the decorators and the plan cache report through
// their own Hooks, so that those packages need not import OpenTelemetry.
// Each call makes its instruments from the meter provider of opts (the
// global one by default); an SDK gives calls with the same provider the
// same instruments.

// FailPolicyHooks returns hooks for failpolicy.WithHooks that count the
// decisions the fail policy made instead of the store
// ([MetricDegraded]) and keep the state of its circuit breakers
// ([MetricBreakers]).
func FailPolicyHooks(opts ...Option) failpolicy.Hooks {
	m := meter(newConfig(opts))
	degraded, err := m.Int64Counter(MetricDegraded,
		metric.WithDescription("Rate-limit decisions a fail policy made instead of the store, by cause."),
		metric.WithUnit("{decision}"))
	degradedC := handled[metric.Int64Counter](degraded, err, noop.Int64Counter{})
	breakers, err := m.Int64UpDownCounter(MetricBreakers,
		metric.WithDescription("Circuit breakers that are not closed, by state and node."),
		metric.WithUnit("{breaker}"))
	breakersC := handled[metric.Int64UpDownCounter](breakers, err, noop.Int64UpDownCounter{})

	type cause struct {
		mode    failpolicy.Mode
		errType string
	}
	causes := map[cause][]metric.AddOption{}
	for _, mode := range []failpolicy.Mode{failpolicy.Open, failpolicy.Closed, failpolicy.Local} {
		for _, t := range allErrorTypes() {
			set := attribute.NewSet(AttrFailMode.String(mode.String()), AttrErrorType.String(t))
			causes[cause{mode, t}] = []metric.AddOption{metric.WithAttributeSet(set)}
		}
	}
	return failpolicy.Hooks{
		Degraded: func(ctx context.Context, _ string, mode failpolicy.Mode, why error) {
			if opts, ok := causes[cause{mode, ErrorType(why)}]; ok {
				degradedC.Add(ctx, 1, opts...)
				return
			}
			degradedC.Add(ctx, 1, metric.WithAttributes(AttrFailMode.String(mode.String()), AttrErrorType.String(ErrorType(why))))
		},
		BreakerChanged: func(node string, from, to failpolicy.BreakerState) {
			ctx := context.Background()
			if from != failpolicy.BreakerClosed {
				breakersC.Add(ctx, -1, breakerAttrs(node, from))
			}
			if to != failpolicy.BreakerClosed {
				breakersC.Add(ctx, 1, breakerAttrs(node, to))
			}
		},
	}
}

// breakerAttrs are the attributes of node's breaker in state s.
func breakerAttrs(node string, s failpolicy.BreakerState) metric.AddOption {
	state := "open"
	if s == failpolicy.BreakerHalfOpen {
		state = "half_open"
	}
	if node == "" {
		return metric.WithAttributes(AttrBreakerState.String(state))
	}
	return metric.WithAttributes(AttrBreakerState.String(state), AttrServerAddress.String(node))
}

// The values of [AttrPlanCacheResult].
const (
	// PlanHit: a lookup the cache answered without its store.
	PlanHit = "hit"
	// PlanMiss: a lookup that found its subject due for a read of its
	// store, whether it waited for the read or was served meanwhile.
	PlanMiss = "miss"
	// PlanLoaded: a read of the store that succeeded.
	PlanLoaded = "loaded"
	// PlanStaleServed: a read that failed, for a subject whose last good
	// plan is served meanwhile.
	PlanStaleServed = "stale_served"
	// PlanFailed: a read that failed, for a subject with no good plan
	// yet, served the default plan meanwhile.
	PlanFailed = "failed"
)

// PlanHooks returns hooks for plans.WithHooks that count the plan cache's
// lookups ([MetricPlanLookups]) and its reads of the store
// ([MetricPlanLoads]). The subject, a customer's ID, is not recorded.
func PlanHooks(opts ...Option) plans.Hooks {
	m := meter(newConfig(opts))
	lookups, err := m.Int64Counter(MetricPlanLookups,
		metric.WithDescription("Plan cache lookups, by hit or miss."),
		metric.WithUnit("{lookup}"))
	lookupsC := handled[metric.Int64Counter](lookups, err, noop.Int64Counter{})
	loads, err := m.Int64Counter(MetricPlanLoads,
		metric.WithDescription("Plan cache reads of the plan store, by result."),
		metric.WithUnit("{load}"))
	loadsC := handled[metric.Int64Counter](loads, err, noop.Int64Counter{})

	only := func(kvs ...attribute.KeyValue) []metric.AddOption {
		return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(kvs...))}
	}
	hit, miss, loaded := only(AttrPlanCacheResult.String(PlanHit)), only(AttrPlanCacheResult.String(PlanMiss)), only(AttrPlanCacheResult.String(PlanLoaded))
	failure := func(res string, err error) metric.AddOption {
		return metric.WithAttributes(AttrPlanCacheResult.String(res), AttrErrorType.String(ErrorType(err)))
	}
	ctx := context.Background()
	return plans.Hooks{
		Hit:         func(string) { lookupsC.Add(ctx, 1, hit...) },
		Miss:        func(string) { lookupsC.Add(ctx, 1, miss...) },
		Loaded:      func(string, plans.Assignment) { loadsC.Add(ctx, 1, loaded...) },
		StaleServed: func(_ string, err error) { loadsC.Add(ctx, 1, failure(PlanStaleServed, err)) },
		LoadFailed:  func(_ string, err error) { loadsC.Add(ctx, 1, failure(PlanFailed, err)) },
	}
}

// ShardingHooks returns hooks for sharding.WithHooks that count the times
// a sharded request moved on to another sub-bucket
// ([MetricShardRetries]), by why.
func ShardingHooks(opts ...Option) sharding.Hooks {
	m := meter(newConfig(opts))
	retries, err := m.Int64Counter(MetricShardRetries,
		metric.WithDescription("Times a sharded request moved on to another sub-bucket, by reason."),
		metric.WithUnit("{retry}"))
	retriesC := handled[metric.Int64Counter](retries, err, noop.Int64Counter{})
	reasons := map[sharding.RetryReason][]metric.AddOption{}
	for _, r := range []sharding.RetryReason{sharding.RetryRejected, sharding.RetryFailed, sharding.RetryDegraded} {
		reasons[r] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(AttrRetryReason.String(r.String())))}
	}
	return sharding.Hooks{
		Retried: func(ctx context.Context, _ string, r sharding.RetryReason) {
			if opts, ok := reasons[r]; ok {
				retriesC.Add(ctx, 1, opts...)
				return
			}
			retriesC.Add(ctx, 1, metric.WithAttributes(AttrRetryReason.String(r.String())))
		},
	}
}

func meter(c config) metric.Meter {
	return c.meterProvider.Meter(ScopeName, metric.WithInstrumentationVersion(version))
}

// allErrorTypes lists every value [ErrorType] gives.
func allErrorTypes() []string {
	names := []string{ErrorTypeOther, errorTypePanic}
	for _, t := range errorTypes {
		names = append(names, t.name)
	}
	return names
}
