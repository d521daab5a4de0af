package otel

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/ratelimit"
)

// ScopeName is the instrumentation scope of the tracer and the meter: this
// package's import path.
const ScopeName = "github.com/sluicehq/sluice/otel"

// version is what Version returns.
const version = "0.1.0"

// Version returns the version of this instrumentation, the scope's
// version.
func Version() string { return version }

// Backend is a [ratelimit.Backend] that reports each decision of the one
// it wraps to OpenTelemetry; see the package doc. It is safe for
// concurrent use. Make one with [Wrap].
type Backend struct {
	next   ratelimit.Backend
	cfg    config
	tracer trace.Tracer
	inst   *instruments

	// next's optional capabilities, nil where it lacks them.
	slots    ratelimit.SlotMapper
	nodes    ratelimit.NodeLocator
	topology ratelimit.TopologyReporter
}

var _ ratelimit.Backend = (*Backend)(nil)

// Wrap returns a Backend that decides with next and reports each
// decision. It cannot fail: an instrument that cannot be created is
// reported to otel.Handle and left out. With a nil next, every decision
// fails with [ratelimit.ErrBackendUnavailable].
func Wrap(next ratelimit.Backend, opts ...Option) *Backend {
	if next == nil {
		next = noBackend{}
	}
	c := newConfig(opts)
	if c.backendName == "" {
		c.backendName = storeName(next)
	}
	b := &Backend{
		next:   next,
		cfg:    c,
		tracer: c.tracerProvider.Tracer(ScopeName, trace.WithInstrumentationVersion(version)),
		inst:   newInstruments(meter(c)),
	}
	b.slots, _ = next.(ratelimit.SlotMapper)
	b.nodes, _ = next.(ratelimit.NodeLocator)
	b.topology, _ = next.(ratelimit.TopologyReporter)
	return b
}

// Unwrap returns the Backend that b decides with.
func (b *Backend) Unwrap() ratelimit.Backend { return b.next }

// unwrapper is a decorator that tells the Backend it wraps, as sluice's
// do.
type unwrapper interface {
	Unwrap() ratelimit.Backend
}

// maxUnwrap bounds the decorators storeName looks through, should one
// unwrap to itself.
const maxUnwrap = 16

// storeName names the store below next's decorators: the package name of
// its Go type ("memory", "redis", "rueidis").
func storeName(next ratelimit.Backend) string {
	for range maxUnwrap {
		u, ok := next.(unwrapper)
		if !ok || u.Unwrap() == nil {
			break
		}
		next = u.Unwrap()
	}
	name := strings.TrimLeft(fmt.Sprintf("%T", next), "*")
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		name = name[:i]
	}
	return name
}

// Layer returns the [ratelimit.Layer] that [ratelimit.Stack] puts
// outermost, at [ratelimit.PlaceTelemetry], and that wraps with opts.
func Layer(opts ...Option) ratelimit.Layer {
	return layer(opts)
}

type layer []Option

func (layer) Place() ratelimit.Place { return ratelimit.PlaceTelemetry }

func (l layer) Wrap(next ratelimit.Backend) (ratelimit.Backend, error) {
	return Wrap(next, l...), nil
}

// Do decides req with the next Backend, in a span if the caller's context
// holds a recording one (or [WithRootSpans]), and counts the decision.
func (b *Backend) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	tracing := b.cfg.rootSpans || trace.SpanFromContext(ctx).IsRecording()
	counting := b.inst.decisions.Enabled(ctx)
	timing := b.inst.duration.Enabled(ctx)
	if !tracing && !counting && !timing {
		return b.next.Do(ctx, key, cfg, req)
	}
	return b.observed(ctx, key, cfg, req, tracing, counting, timing)
}

// observed decides req with whatever telemetry is on. It is apart from
// Do so that a decision with none pays for none of its frame.
func (b *Backend) observed(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request, tracing, counting, timing bool) (ratelimit.Decision, error) {
	var class, route string
	if tracing || counting {
		class, route = b.classOf(key), b.cfg.route(ctx)
	}
	if tracing {
		return b.traced(ctx, key, class, route, cfg, req, counting, timing)
	}
	return b.measured(ctx, key, class, route, cfg, req, counting, timing)
}

func (b *Backend) classOf(key string) string {
	if b.cfg.keyClass == nil {
		return ""
	}
	return b.cfg.keyClass(key)
}

// measured decides and counts, without a span.
func (b *Backend) measured(ctx context.Context, key, class, route string, cfg ratelimit.Config, req ratelimit.Request, counting, timing bool) (ratelimit.Decision, error) {
	var start time.Time
	if timing {
		start = time.Now()
	}
	// A panic in the next Backend goes on up, counted as an error.
	done := false
	defer func() {
		if !done {
			b.count(ctx, start, key, class, route, cfg, req, resError, errorTypePanic, counting, timing)
		}
	}()
	d, err := b.next.Do(ctx, key, cfg, req)
	done = true
	b.count(ctx, start, key, class, route, cfg, req, resultIndex(d, err), ErrorType(err), counting, timing)
	return d, err
}

// count adds a decision that ended in result res (an error of errType
// for resError) to the instruments that are enabled.
func (b *Backend) count(ctx context.Context, start time.Time, key, class, route string, cfg ratelimit.Config, req ratelimit.Request, res int, errType string, counting, timing bool) {
	if timing {
		b.inst.duration.since(ctx, start, opIndex(req.Op), res)
	}
	if !counting {
		return
	}
	if res == resRejected {
		b.inst.rejected.add(class, route, key, time.Now())
	}
	b.inst.decisions.Add(ctx, 1, b.inst.decisionAttrs(decisionKey{
		class: class, route: route, algorithm: cfg.Algorithm, op: req.Op, result: res, errType: errType,
	})...)
}

// traced decides in a span of its own, and counts.
func (b *Backend) traced(ctx context.Context, key, class, route string, cfg ratelimit.Config, req ratelimit.Request, counting, timing bool) (ratelimit.Decision, error) {
	attrs := make([]attribute.KeyValue, 0, 8)
	attrs = append(attrs,
		AttrOperation.String(req.Op.String()),
		AttrTokens.Int64(req.Tokens),
		AttrAlgorithm.String(cfg.Algorithm.String()),
		AttrBackend.String(b.cfg.backendName),
	)
	if class != "" {
		attrs = append(attrs, AttrKeyClass.String(class))
	}
	if route != "" {
		attrs = append(attrs, AttrRoute.String(route))
	}
	if cfg.Version != 0 {
		attrs = append(attrs, AttrConfigVersion.Int64(int64(cfg.Version)))
	}
	if b.cfg.rawKeys {
		attrs = append(attrs, AttrKey.String(key))
	}
	ctx, span := b.tracer.Start(ctx, spanNames[opIndex(req.Op)],
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	// A panic in the next Backend goes on up, but the span is ended and
	// the decision counted, as an error.
	done := false
	start := time.Now()
	defer func() {
		if !done {
			b.count(ctx, start, key, class, route, cfg, req, resError, errorTypePanic, counting, timing)
			span.SetStatus(codes.Error, "sluice: the Backend panicked")
			span.SetAttributes(AttrResult.String(ResultError), AttrErrorType.String(errorTypePanic))
			span.End()
		}
	}()
	d, err := b.next.Do(ctx, key, cfg, req)
	done = true
	b.count(ctx, start, key, class, route, cfg, req, resultIndex(d, err), ErrorType(err), counting, timing)
	if err != nil {
		span.SetStatus(codes.Error, errorDescription(err))
		span.SetAttributes(AttrResult.String(ResultError), AttrErrorType.String(ErrorType(err)))
	} else {
		span.SetAttributes(
			AttrResult.String(resultNames[resultIndex(d, nil)]),
			AttrAllowed.Bool(d.Allowed),
			AttrDegraded.Bool(d.Degraded),
			AttrLimit.Int64(d.Limit),
			AttrRemaining.Int64(d.Remaining),
			AttrConsumed.Int64(d.Consumed),
			AttrRetryAfter.Float64(d.RetryAfter.Seconds()),
			AttrResetAfter.Float64(d.ResetAfter.Seconds()),
			AttrBandwidth.String(d.Bandwidth),
		)
	}
	span.End()
	return d, err
}

// spanNames are the spans' names by op, and the last for an op out of
// range.
var spanNames = func() []string {
	names := make([]string, numOps+1)
	for i := range numOps {
		names[i] = "sluice " + ratelimit.Op(i).String()
	}
	names[numOps] = "sluice"
	return names
}()

// Slot returns the next Backend's Slot for key if it is a
// [ratelimit.SlotMapper], and (0, false) if not.
func (b *Backend) Slot(key string) (slot int, ok bool) {
	if b.slots == nil {
		return 0, false
	}
	return b.slots.Slot(key)
}

// Node returns the next Backend's Node for key if it is a
// [ratelimit.NodeLocator], and "" if not.
func (b *Backend) Node(key string) string {
	if b.nodes == nil {
		return ""
	}
	return b.nodes.Node(key)
}

// Masters returns the next Backend's Masters if it is a
// [ratelimit.TopologyReporter], and otherwise an error wrapping
// [errors.ErrUnsupported].
func (b *Backend) Masters(ctx context.Context) ([]ratelimit.Master, error) {
	if b.topology == nil {
		return nil, fmt.Errorf("otel: Masters: the next Backend, a %T, cannot report its masters: %w", b.next, errors.ErrUnsupported)
	}
	return b.topology.Masters(ctx)
}

// noBackend stands in for a nil Backend given to Wrap.
type noBackend struct{}

func (noBackend) Do(context.Context, string, ratelimit.Config, ratelimit.Request) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, fmt.Errorf("%w: otel: the wrapped Backend is nil", ratelimit.ErrBackendUnavailable)
}
