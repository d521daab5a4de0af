package otel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/ratelimit"
)

// The attributes of spans and metrics. OpenTelemetry's semantic
// conventions have none for rate limiting in Go; these take the shape of
// ASP.NET Core's (aspnetcore.rate_limiting.requests with a result
// attribute) under sluice's own namespace. docs/observability.md says
// which span and metric carries which.
const (
	// AttrResult is a decision's outcome: one of [ResultAllowed],
	// [ResultRejected], [ResultDegraded] and [ResultError].
	AttrResult = attribute.Key("sluice.rate_limit.result")
	// AttrOperation is the request's [ratelimit.Op], or a permit
	// request's [ratelimit.PermitOp], as its String gives it ("Consume",
	// "Acquire").
	AttrOperation = attribute.Key("sluice.rate_limit.operation")
	// AttrAlgorithm is the config's [ratelimit.Algorithm] ("TokenBucket").
	AttrAlgorithm = attribute.Key("sluice.rate_limit.algorithm")
	// AttrKeyClass is what [WithKeyClass]'s function made of the key; it
	// is left out when that is empty.
	AttrKeyClass = attribute.Key("sluice.rate_limit.key_class")
	// AttrRoute is what [WithRoute]'s function, by default
	// [RouteFromContext], gave for the call; it is left out when empty.
	AttrRoute = attribute.Key("sluice.rate_limit.route")
	// AttrKey is the bucket's key, on spans only and only with
	// [WithRawKeys].
	AttrKey = attribute.Key("sluice.rate_limit.key")
	// AttrBackend names the Backend that decided ([WithBackendName]).
	AttrBackend = attribute.Key("sluice.rate_limit.backend")
	// AttrConfigVersion is the config's [ratelimit.Config.Version], when
	// not 0.
	AttrConfigVersion = attribute.Key("sluice.rate_limit.config_version")
	// AttrTokens is the request's Tokens.
	AttrTokens = attribute.Key("sluice.rate_limit.tokens")
	// AttrAllowed is the decision's Allowed.
	AttrAllowed = attribute.Key("sluice.rate_limit.allowed")
	// AttrDegraded is the decision's Degraded (a permit decision's too):
	// a fail policy decided.
	AttrDegraded = attribute.Key("sluice.rate_limit.degraded")
	// AttrLimit is the decision's Limit (a permit decision's too).
	AttrLimit = attribute.Key("sluice.rate_limit.limit")
	// AttrRemaining is the decision's Remaining.
	AttrRemaining = attribute.Key("sluice.rate_limit.remaining")
	// AttrConsumed is the decision's Consumed.
	AttrConsumed = attribute.Key("sluice.rate_limit.consumed")
	// AttrRetryAfter is the decision's RetryAfter, in seconds (a permit
	// decision's too).
	AttrRetryAfter = attribute.Key("sluice.rate_limit.retry_after")
	// AttrResetAfter is the decision's ResetAfter, in seconds.
	AttrResetAfter = attribute.Key("sluice.rate_limit.reset_after")
	// AttrBandwidth is the decision's binding Bandwidth.
	AttrBandwidth = attribute.Key("sluice.rate_limit.bandwidth")
	// AttrPermitWeight is a permit request's Weight.
	AttrPermitWeight = attribute.Key("sluice.rate_limit.permit.weight")
	// AttrPermitLease is a concurrency limit's Lease, in seconds.
	AttrPermitLease = attribute.Key("sluice.rate_limit.permit.lease")
	// AttrPermitGranted is a permit decision's Granted.
	AttrPermitGranted = attribute.Key("sluice.rate_limit.permit.granted")
	// AttrPermitInFlight is a permit decision's InFlight: the permits the
	// store holds for the key.
	AttrPermitInFlight = attribute.Key("sluice.rate_limit.permit.in_flight")
	// AttrFailMode is the fail policy's [failpolicy.Mode] ("Local").
	AttrFailMode = attribute.Key("sluice.rate_limit.fail_mode")
	// AttrBreakerState is a circuit breaker's state: "open" or
	// "half_open".
	AttrBreakerState = attribute.Key("sluice.rate_limit.breaker.state")
	// AttrPlanCacheResult is a plan cache lookup's or load's outcome.
	AttrPlanCacheResult = attribute.Key("sluice.plan_cache.result")
	// AttrRetryReason is why a sharded request moved to another
	// sub-bucket: "rejected", "failed" or "degraded".
	AttrRetryReason = attribute.Key("sluice.sharding.reason")
	// AttrErrorType is semconv's error.type: the sentinel an error wraps,
	// as [ErrorType] names it.
	AttrErrorType = semconv.ErrorTypeKey
	// AttrServerAddress is semconv's server.address: the store node a
	// circuit breaker is kept for.
	AttrServerAddress = semconv.ServerAddressKey
)

// The values of [AttrResult].
const (
	// ResultAllowed: the store allowed the request (for a permit call:
	// granted it).
	ResultAllowed = "allowed"
	// ResultRejected: the store rejected it (for a permit call: did not
	// grant it).
	ResultRejected = "rejected"
	// ResultDegraded: a fail policy decided instead of the store, either
	// way ([AttrAllowed] on the span says which).
	ResultDegraded = "degraded"
	// ResultError: the call returned an error ([AttrErrorType] says which).
	ResultError = "error"
)

// errorTypes names the sentinels, in the order they are looked for: a
// store's own errors before the context's, since a store's timeout may
// wrap context.DeadlineExceeded while a caller's deadline never wraps
// ratelimit.ErrTimeout.
var errorTypes = []struct {
	err  error
	name string
}{
	{ratelimit.ErrInvalidConfig, "invalid_config"},
	{plans.ErrInvalidPlan, "invalid_plan"},
	{ratelimit.ErrInvalidKey, "invalid_key"},
	{ratelimit.ErrInvalidRequest, "invalid_request"},
	{ratelimit.ErrKeyRejected, "key_rejected"},
	{ratelimit.ErrWaitExceedsDeadline, "wait_exceeds_deadline"},
	{errors.ErrUnsupported, "unsupported"},
	{failpolicy.ErrBreakerOpen, "breaker_open"},
	{ratelimit.ErrTimeout, "timeout"},
	{ratelimit.ErrBackendUnavailable, "backend_unavailable"},
	{context.Canceled, "canceled"},
	{context.DeadlineExceeded, "deadline_exceeded"},
}

// ErrorTypeOther is what [ErrorType] gives an error that wraps none of
// the sentinels it knows, as semconv's error.type asks.
const ErrorTypeOther = "_OTHER"

// errorTypePanic is the error.type of a decision whose Backend panicked:
// what [ErrorType] gives a failpolicy.PanicError, and what a panic below
// the decorator is counted as.
const errorTypePanic = "panic"

// ErrorType names the sentinel err wraps, for [AttrErrorType]:
// "invalid_config", "invalid_plan", "invalid_key", "invalid_request", "key_rejected",
// "wait_exceeds_deadline", "unsupported" (errors.ErrUnsupported: a
// Backend that holds no permits), "breaker_open", "timeout",
// "backend_unavailable", "canceled", "deadline_exceeded", or
// [ErrorTypeOther]; "" for nil. A failpolicy.PanicError is "panic".
func ErrorType(err error) string {
	if err == nil {
		return ""
	}
	var p *failpolicy.PanicError
	if errors.As(err, &p) {
		return errorTypePanic
	}
	for _, t := range errorTypes {
		if errors.Is(err, t.err) {
			return t.name
		}
	}
	return ErrorTypeOther
}

// errorDescription is a span's status description for err: the text of
// the sentinel it wraps, never err's own message, which may hold the key.
func errorDescription(err error) string {
	for _, t := range errorTypes {
		if errors.Is(err, t.err) {
			return t.err.Error()
		}
	}
	return "sluice: the decision failed"
}
