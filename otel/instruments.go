package otel

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/sluicehq/sluice/ratelimit"
)

// The instruments' names.
const (
	// MetricDecisions counts decisions, by [AttrResult], [AttrOperation],
	// [AttrAlgorithm], [AttrKeyClass], [AttrRoute] and, for errors,
	// [AttrErrorType].
	MetricDecisions = "sluice.rate_limit.decisions"
	// MetricDecisionDuration is a histogram of how long decisions took
	// below the decorator, in seconds, by [AttrOperation] and [AttrResult],
	// in [DurationBuckets]. For a decision the store made, that is the
	// store's round trip (one per sub-bucket tried, for a sharded key).
	MetricDecisionDuration = "sluice.rate_limit.decision.duration"
	// MetricDegraded counts the decisions a fail policy made instead of
	// the store, by [AttrFailMode] and [AttrErrorType] (the cause:
	// "breaker_open", "timeout", "backend_unavailable"...).
	MetricDegraded = "sluice.rate_limit.degraded"
	// MetricBreakers is the number of circuit breakers in each state but
	// closed, by [AttrBreakerState] and [AttrServerAddress] (the node the
	// breaker is kept for; left out for the shared breaker): 1 while that
	// node's breaker is in that state, 0 once it is not.
	MetricBreakers = "sluice.rate_limit.breakers"
	// MetricPlanLookups counts plan cache lookups, by [AttrPlanCacheResult]
	// "hit" or "miss".
	MetricPlanLookups = "sluice.plan_cache.lookups"
	// MetricPlanLoads counts the plan cache's reads of its store, by
	// [AttrPlanCacheResult]: "loaded", "stale_served" (the read failed and
	// the last good plan is served) or "failed" (the read failed and the
	// default plan is served), with [AttrErrorType] for the last two.
	MetricPlanLoads = "sluice.plan_cache.loads"
	// MetricShardRetries counts the times a sharded request moved on to
	// another sub-bucket, by [AttrRetryReason].
	MetricShardRetries = "sluice.sharding.retries"
	// MetricPermitDecisions counts permit calls, by [AttrResult],
	// [AttrOperation] (the [ratelimit.PermitOp]), [AttrKeyClass],
	// [AttrRoute] and, for errors, [AttrErrorType]: a denied acquire is
	// an Acquire of result "rejected".
	MetricPermitDecisions = "sluice.rate_limit.permit.decisions"
	// MetricPermitsInFlight is the permits this process holds, weights
	// summed, by [AttrKeyClass] alone: it goes up by a granted Acquire's
	// Weight and down by each Release's (see the package doc).
	MetricPermitsInFlight = "sluice.rate_limit.permit.in_flight"
	// MetricPermitDuration is a histogram of how long permit calls took
	// below the decorator, in seconds, by [AttrOperation] (the
	// [ratelimit.PermitOp]) and [AttrResult], in [DurationBuckets]: for a
	// call the store decided, the store's round trip. A Release's is what
	// a request held by a permit waits for after its work.
	MetricPermitDuration = "sluice.rate_limit.permit.duration"
)

// DurationBuckets are the bucket boundaries, in seconds, of
// [MetricDecisionDuration] and [MetricPermitDuration]: from 10µs, where an
// in-memory decision is, to 1s, in steps that tell a healthy Redis round
// trip (tens to hundreds of microseconds) from a slow one and from a fail
// policy's deadline.
var DurationBuckets = []float64{
	0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005,
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
}

// numOps is how many ops there are; opIndex gives any other op numOps.
const numOps = int(ratelimit.Inspect) + 1

func opIndex(op ratelimit.Op) int {
	if int(op) < numOps {
		return int(op)
	}
	return numOps
}

// The results, as indexes.
const (
	resAllowed = iota
	resRejected
	resDegraded
	resError
	numResults
)

var resultNames = [numResults]string{ResultAllowed, ResultRejected, ResultDegraded, ResultError}

func resultIndex(d ratelimit.Decision, err error) int {
	switch {
	case err != nil:
		return resError
	case d.Degraded:
		return resDegraded
	case d.Allowed:
		return resAllowed
	}
	return resRejected
}

// maxCachedAttrs bounds how many attribute sets of decisions are kept
// made, so that key classes or routes of many values cannot grow memory:
// past it, each decision makes its own.
const maxCachedAttrs = 1024

// instruments are a Backend's metric instruments, and the attribute sets
// of their measurements, made once.
type instruments struct {
	decisions metric.Int64Counter
	duration  durationHistogram
	rejected  *rejectedKeys
	permits   *permitInstruments

	// decisionOpts maps a decision's attributes to the counter's options.
	decisionOpts *boundedMap[decisionKey, []metric.AddOption]
}

// decisionKey is what a decision's attributes are made of.
type decisionKey struct {
	class, route string
	algorithm    ratelimit.Algorithm
	op           ratelimit.Op
	result       int
	errType      string
}

func newInstruments(m metric.Meter) *instruments {
	in := &instruments{}
	decisions, err := m.Int64Counter(MetricDecisions,
		metric.WithDescription("Rate-limit decisions, by result."),
		metric.WithUnit("{decision}"))
	in.decisions = handled[metric.Int64Counter](decisions, err, noop.Int64Counter{})
	in.duration = newDurationHistogram(m, MetricDecisionDuration,
		"The time rate-limit decisions took, store round trips included.", numOps+1, opAttr)
	in.rejected = newRejectedKeys(m)
	in.permits = newPermitInstruments(m)
	in.decisionOpts = newBoundedMap[decisionKey, []metric.AddOption](maxCachedAttrs)
	return in
}

// handled returns the instrument made, or, if it could not be made,
// reports why to otel.Handle and returns fallback, a no-op one.
func handled[I any](made I, err error, fallback I) I {
	if err != nil {
		otel.Handle(err)
		return fallback
	}
	return made
}

func opAttr(op int) attribute.KeyValue {
	if op == numOps {
		return AttrOperation.String("unknown")
	}
	return AttrOperation.String(ratelimit.Op(op).String())
}

// durationHistogram is a histogram of how long calls took below the
// decorator, in seconds in [DurationBuckets], with the options of its
// measurements made once: by op index and result.
type durationHistogram struct {
	metric.Float64Histogram
	opts [][numResults][]metric.RecordOption
}

// newDurationHistogram makes the histogram name for ops op indexes, op
// index i measured with the attribute opAttr(i).
func newDurationHistogram(m metric.Meter, name, description string, ops int, opAttr func(int) attribute.KeyValue) durationHistogram {
	h, err := m.Float64Histogram(name,
		metric.WithDescription(description),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(DurationBuckets...))
	d := durationHistogram{Float64Histogram: handled[metric.Float64Histogram](h, err, noop.Float64Histogram{})}
	d.opts = make([][numResults][]metric.RecordOption, ops)
	for op := range ops {
		for res := range numResults {
			set := attribute.NewSet(opAttr(op), AttrResult.String(resultNames[res]))
			d.opts[op][res] = []metric.RecordOption{metric.WithAttributeSet(set)}
		}
	}
	return d
}

// since records the time since start of a call of op index op that ended
// in result res.
func (d durationHistogram) since(ctx context.Context, start time.Time, op, res int) {
	d.Record(ctx, time.Since(start).Seconds(), d.opts[op][res]...)
}

// decisionAttrs returns the counter's options for a decision of key k.
func (in *instruments) decisionAttrs(k decisionKey) []metric.AddOption {
	if opts, ok := in.decisionOpts.load(k, k.options); ok {
		return opts
	}
	return k.options()
}

func (k decisionKey) options() []metric.AddOption {
	return []metric.AddOption{metric.WithAttributeSet(k.set())}
}

func (k decisionKey) set() attribute.Set {
	kvs := make([]attribute.KeyValue, 0, 6)
	kvs = append(kvs,
		AttrResult.String(resultNames[k.result]),
		opAttr(opIndex(k.op)),
		AttrAlgorithm.String(k.algorithm.String()),
	)
	if k.class != "" {
		kvs = append(kvs, AttrKeyClass.String(k.class))
	}
	if k.route != "" {
		kvs = append(kvs, AttrRoute.String(k.route))
	}
	if k.errType != "" {
		kvs = append(kvs, AttrErrorType.String(k.errType))
	}
	return attribute.NewSet(kvs...)
}
