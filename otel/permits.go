package otel

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/ratelimit"
)

var _ ratelimit.PermitBackend = (*Backend)(nil)

// DoPermit applies req with the next Backend's permits, in a span if the
// caller's context holds a recording one (or [WithRootSpans]), counts it
// and keeps the count of the permits this process holds; see "Permits"
// in the package doc. If the next Backend holds no permits, the call
// fails with an error wrapping [errors.ErrUnsupported].
func (b *Backend) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	tracing := b.cfg.rootSpans || trace.SpanFromContext(ctx).IsRecording()
	pi := b.inst.permits
	on := observing{
		counting: pi.decisions.Enabled(ctx),
		holding:  pi.inFlight.Enabled(ctx),
		timing:   pi.duration.Enabled(ctx),
	}
	if !tracing && on == (observing{}) {
		return ratelimit.Permits(b.next).DoPermit(ctx, key, lim, req)
	}
	return b.observedPermit(ctx, key, lim, req, tracing, on)
}

// observing is which of a permit call's instruments are enabled.
type observing struct{ counting, holding, timing bool }

// observedPermit applies req with whatever telemetry is on.
func (b *Backend) observedPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest, tracing bool, on observing) (ratelimit.PermitDecision, error) {
	class := b.classOf(key)
	var route string
	if tracing || on.counting {
		route = b.cfg.route(ctx)
	}
	var span trace.Span
	if tracing {
		ctx, span = b.startPermitSpan(ctx, key, class, route, lim, req)
	}
	// A panic in the next Backend goes on up, but the span is ended and
	// the call counted, as an error.
	var start time.Time
	done := false
	defer func() {
		if done {
			return
		}
		b.countPermit(ctx, start, class, route, req, ratelimit.PermitDecision{}, errPanicked, on)
		if span != nil {
			span.SetStatus(codes.Error, "sluice: the Backend panicked")
			span.SetAttributes(AttrResult.String(ResultError), AttrErrorType.String(errorTypePanic))
			span.End()
		}
	}()
	if on.timing {
		start = time.Now()
	}
	d, err := ratelimit.Permits(b.next).DoPermit(ctx, key, lim, req)
	done = true
	b.countPermit(ctx, start, class, route, req, d, err, on)
	if span != nil {
		endPermitSpan(span, d, err)
	}
	return d, err
}

// errPanicked stands, in countPermit, for a call whose Backend panicked.
var errPanicked = errors.New("otel: the Backend panicked")

// startPermitSpan starts a permit call's span, as traced does a
// decision's.
func (b *Backend) startPermitSpan(ctx context.Context, key, class, route string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (context.Context, trace.Span) {
	attrs := make([]attribute.KeyValue, 0, 7)
	attrs = append(attrs,
		AttrOperation.String(req.Op.String()),
		AttrPermitWeight.Int64(req.Weight),
		AttrPermitLease.Float64(lim.Lease.Seconds()),
		AttrBackend.String(b.cfg.backendName),
	)
	if class != "" {
		attrs = append(attrs, AttrKeyClass.String(class))
	}
	if route != "" {
		attrs = append(attrs, AttrRoute.String(route))
	}
	if b.cfg.rawKeys {
		attrs = append(attrs, AttrKey.String(key))
	}
	return b.tracer.Start(ctx, permitSpanNames[permitOpIndex(req.Op)],
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
}

// endPermitSpan records a permit call's outcome on its span and ends it.
func endPermitSpan(span trace.Span, d ratelimit.PermitDecision, err error) {
	if err != nil {
		span.SetStatus(codes.Error, errorDescription(err))
		span.SetAttributes(AttrResult.String(ResultError), AttrErrorType.String(ErrorType(err)))
	} else {
		span.SetAttributes(
			AttrResult.String(resultNames[permitResult(d, nil)]),
			AttrPermitGranted.Bool(d.Granted),
			AttrDegraded.Bool(d.Degraded),
			AttrLimit.Int64(d.Limit),
			AttrPermitInFlight.Int64(d.InFlight),
			AttrRetryAfter.Float64(d.RetryAfter.Seconds()),
		)
	}
	span.End()
}

// countPermit counts a permit call that returned d and err (errPanicked
// for a panic) on the instruments that are enabled.
func (b *Backend) countPermit(ctx context.Context, start time.Time, class, route string, req ratelimit.PermitRequest, d ratelimit.PermitDecision, err error, on observing) {
	pi := b.inst.permits
	if n := heldChange(req, d, err); on.holding && n != 0 {
		pi.inFlight.Add(ctx, n, pi.inFlightAttrs(class)...)
	}
	res := permitResult(d, err)
	if on.timing {
		pi.duration.since(ctx, start, permitOpIndex(req.Op), res)
	}
	if !on.counting {
		return
	}
	errType := ErrorType(err)
	if err == errPanicked {
		errType = errorTypePanic
	}
	pi.decisions.Add(ctx, 1, pi.decisionAttrs(permitKey{
		class: class, route: route, op: req.Op, result: res, errType: errType,
	})...)
}

// heldChange is how a permit call changes the permits this process
// holds: up by a granted Acquire's Weight; down by a Release's, whatever
// the store answered (a permit it no longer held is not this process's
// either, and a Permit is released once, whether the call failed or not),
// unless the call was refused before it could reach a store. A Release
// carries the Weight it was acquired with for this.
func heldChange(req ratelimit.PermitRequest, d ratelimit.PermitDecision, err error) int64 {
	switch {
	case req.Op == ratelimit.PermitAcquire && err == nil && d.Granted:
		return req.Weight
	case req.Op == ratelimit.PermitRelease && !refused(err):
		return -max(req.Weight, 0)
	}
	return 0
}

// refused reports whether err says a call was turned away before it could
// reach a store: bad input, or a Backend that holds no permits.
func refused(err error) bool {
	return err != nil && (errors.Is(err, ratelimit.ErrInvalidKey) || errors.Is(err, ratelimit.ErrInvalidConfig) ||
		errors.Is(err, ratelimit.ErrInvalidRequest) || errors.Is(err, errors.ErrUnsupported))
}

// permitResult is a permit call's result: allowed when granted, rejected
// when not, degraded when a fail policy decided, error on an error.
func permitResult(d ratelimit.PermitDecision, err error) int {
	switch {
	case err != nil:
		return resError
	case d.Degraded:
		return resDegraded
	case d.Granted:
		return resAllowed
	}
	return resRejected
}

// numPermitOps is how many permit ops there are; permitOpIndex gives any
// other op numPermitOps.
const numPermitOps = int(ratelimit.PermitInspect) + 1

func permitOpIndex(op ratelimit.PermitOp) int {
	if int(op) < numPermitOps {
		return int(op)
	}
	return numPermitOps
}

// permitSpanNames are the permit calls' spans' names by op ("sluice
// Acquire"), and the last for an op out of range.
var permitSpanNames = func() []string {
	names := make([]string, numPermitOps+1)
	for i := range numPermitOps {
		names[i] = "sluice " + ratelimit.PermitOp(i).String()
	}
	names[numPermitOps] = "sluice"
	return names
}()

// permitInstruments are a Backend's instruments of permit calls, and the
// attribute sets of their measurements, made once.
type permitInstruments struct {
	decisions metric.Int64Counter
	inFlight  metric.Int64UpDownCounter
	duration  durationHistogram

	// decisionOpts maps a call's attributes to the counter's options;
	// inFlightOpts a key class to the up-down counter's.
	decisionOpts *boundedMap[permitKey, []metric.AddOption]
	inFlightOpts *boundedMap[classKey, []metric.AddOption]
}

// permitKey is what a permit call's attributes are made of.
type permitKey struct {
	class, route string
	op           ratelimit.PermitOp
	result       int
	errType      string
}

func newPermitInstruments(m metric.Meter) *permitInstruments {
	pi := &permitInstruments{
		decisionOpts: newBoundedMap[permitKey, []metric.AddOption](maxCachedAttrs),
		inFlightOpts: newBoundedMap[classKey, []metric.AddOption](maxCachedAttrs),
	}
	decisions, err := m.Int64Counter(MetricPermitDecisions,
		metric.WithDescription("Concurrency permit calls, by op and result."),
		metric.WithUnit("{decision}"))
	pi.decisions = handled[metric.Int64Counter](decisions, err, noop.Int64Counter{})
	inFlight, err := m.Int64UpDownCounter(MetricPermitsInFlight,
		metric.WithDescription("Concurrency permits this process holds, weights summed."),
		metric.WithUnit("{permit}"))
	pi.inFlight = handled[metric.Int64UpDownCounter](inFlight, err, noop.Int64UpDownCounter{})
	pi.duration = newDurationHistogram(m, MetricPermitDuration,
		"The time concurrency permit calls took, store round trips included.", numPermitOps+1,
		func(op int) attribute.KeyValue { return permitOpAttr(ratelimit.PermitOp(op)) })
	return pi
}

// decisionAttrs returns the counter's options for a call of key k.
func (pi *permitInstruments) decisionAttrs(k permitKey) []metric.AddOption {
	if opts, ok := pi.decisionOpts.load(k, k.options); ok {
		return opts
	}
	return k.options()
}

func (k permitKey) options() []metric.AddOption {
	kvs := make([]attribute.KeyValue, 0, 5)
	kvs = append(kvs, AttrResult.String(resultNames[k.result]), permitOpAttr(k.op))
	if k.class != "" {
		kvs = append(kvs, AttrKeyClass.String(k.class))
	}
	if k.route != "" {
		kvs = append(kvs, AttrRoute.String(k.route))
	}
	if k.errType != "" {
		kvs = append(kvs, AttrErrorType.String(k.errType))
	}
	return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(kvs...))}
}

func permitOpAttr(op ratelimit.PermitOp) attribute.KeyValue {
	if permitOpIndex(op) == numPermitOps {
		return AttrOperation.String("unknown")
	}
	return AttrOperation.String(op.String())
}

// inFlightAttrs returns the up-down counter's options for class.
func (pi *permitInstruments) inFlightAttrs(class string) []metric.AddOption {
	k := classKey(class)
	if opts, ok := pi.inFlightOpts.load(k, k.options); ok {
		return opts
	}
	return k.options()
}

// classKey is a key class, the in-flight count's one attribute.
type classKey string

func (k classKey) options() []metric.AddOption {
	var kvs []attribute.KeyValue
	if k != "" {
		kvs = append(kvs, AttrKeyClass.String(string(k)))
	}
	return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(kvs...))}
}
