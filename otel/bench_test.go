package otel_test

import (
	"context"
	"testing"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/sluicehq/sluice/backend/memory"
	sluiceotel "github.com/sluicehq/sluice/otel"
	"github.com/sluicehq/sluice/ratelimit"
)

// BenchmarkDecision is one allowed Consume on the memory backend, bare and
// wrapped: in the least a decorator can be (passthrough), then in this
// one with the no-op providers, the global ones (unset), and the SDK
// with metrics read by a reader and spans exported in batches to nowhere,
// under a caller's span the sampler dropped or kept. "event" is the
// design not taken: an event on the caller's span instead of a span of
// its own.
func BenchmarkDecision(b *testing.B) {
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1_000_000).WithBurst(1_000_000_000)}}
	req := ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}
	class := sluiceotel.WithKeyClass(func(string) string { return "customer" })

	sdk := func(b *testing.B, sampler sdktrace.Sampler) []sluiceotel.Option {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithBatcher(discard{}))
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		b.Cleanup(func() {
			_ = tp.Shutdown(context.Background())
			_ = mp.Shutdown(context.Background())
		})
		return []sluiceotel.Option{sluiceotel.WithTracerProvider(tp), sluiceotel.WithMeterProvider(mp), class}
	}
	// request is a caller's context under a span from tp's sampler.
	request := func(b *testing.B, sampled bool) context.Context {
		sampler := sdktrace.NeverSample()
		if sampled {
			sampler = sdktrace.AlwaysSample()
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithBatcher(discard{}))
		b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		ctx, span := tp.Tracer("bench").Start(context.Background(), "GET /v1/search")
		b.Cleanup(func() { span.End() })
		return sluiceotel.ContextWithRoute(ctx, "/v1/search")
	}

	for _, c := range []struct {
		name string
		wrap func(b *testing.B, next ratelimit.Backend) (ratelimit.Backend, context.Context)
	}{
		{"wrap=bare", func(b *testing.B, next ratelimit.Backend) (ratelimit.Backend, context.Context) {
			return next, context.Background()
		}},
		{"wrap=passthrough", func(b *testing.B, next ratelimit.Backend) (ratelimit.Backend, context.Context) {
			return passThrough{next}, context.Background()
		}},
		{"wrap=noop", func(b *testing.B, next ratelimit.Backend) (ratelimit.Backend, context.Context) {
			return sluiceotel.Wrap(next, sluiceotel.WithTracerProvider(tracenoop.NewTracerProvider()),
				sluiceotel.WithMeterProvider(metricnoop.NewMeterProvider()), class), context.Background()
		}},
		{"wrap=global-unset", func(b *testing.B, next ratelimit.Backend) (ratelimit.Backend, context.Context) {
			return sluiceotel.Wrap(next, class), context.Background()
		}},
		{"wrap=sdk-sampled-out", func(b *testing.B, next ratelimit.Backend) (ratelimit.Backend, context.Context) {
			opts := sdk(b, sdktrace.ParentBased(sdktrace.AlwaysSample()))
			return sluiceotel.Wrap(next, opts...), request(b, false)
		}},
		{"wrap=sdk-sampled-in", func(b *testing.B, next ratelimit.Backend) (ratelimit.Backend, context.Context) {
			opts := sdk(b, sdktrace.ParentBased(sdktrace.AlwaysSample()))
			return sluiceotel.Wrap(next, opts...), request(b, true)
		}},
		{"wrap=sdk-sampled-in-event", func(b *testing.B, next ratelimit.Backend) (ratelimit.Backend, context.Context) {
			opts := sdk(b, sdktrace.ParentBased(sdktrace.AlwaysSample()))
			// Metrics as the span design has them; the span replaced by
			// an event on the caller's.
			metricsOnly := sluiceotel.Wrap(next, append(opts, sluiceotel.WithTracerProvider(tracenoop.NewTracerProvider()))...)
			return eventOnCaller{metricsOnly}, request(b, true)
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			store := memory.New(memory.WithSweepInterval(0))
			defer store.Close()
			backend, ctx := c.wrap(b, store)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := backend.Do(ctx, "customer-42", cfg, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// eventOnCaller adds a decision's attributes to the caller's span as an
// event, as the package would if it made no span of its own.
type eventOnCaller struct{ next ratelimit.Backend }

func (e eventOnCaller) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	d, err := e.next.Do(ctx, key, cfg, req)
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent("sluice "+req.Op.String(), trace.WithAttributes(
			sluiceotel.AttrOperation.String(req.Op.String()),
			sluiceotel.AttrTokens.Int64(req.Tokens),
			sluiceotel.AttrAlgorithm.String(cfg.Algorithm.String()),
			sluiceotel.AttrKeyClass.String("customer"),
			sluiceotel.AttrRoute.String(sluiceotel.RouteFromContext(ctx)),
			sluiceotel.AttrBackend.String("memory.Backend"),
			sluiceotel.AttrResult.String("allowed"),
			sluiceotel.AttrAllowed.Bool(d.Allowed),
			sluiceotel.AttrDegraded.Bool(d.Degraded),
			sluiceotel.AttrLimit.Int64(d.Limit),
			sluiceotel.AttrRemaining.Int64(d.Remaining),
			sluiceotel.AttrConsumed.Int64(d.Consumed),
			sluiceotel.AttrRetryAfter.Float64(d.RetryAfter.Seconds()),
			sluiceotel.AttrResetAfter.Float64(d.ResetAfter.Seconds()),
			sluiceotel.AttrBandwidth.String(d.Bandwidth),
		))
	}
	return d, err
}

// discard is a span exporter that drops what it is given.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// BenchmarkOverhead is the decorator's own cost with no provider
// enabled: around a Backend that answers at once, so that the difference
// from "bare" is what wrapping adds, in nanoseconds.
func BenchmarkOverhead(b *testing.B) {
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10)}}
	req := ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}
	var answer ratelimit.Backend = instant{}
	for _, c := range []struct {
		name    string
		backend ratelimit.Backend
	}{
		{"wrap=bare", answer},
		{"wrap=passthrough", passThrough{answer}},
		{"wrap=noop", sluiceotel.Wrap(answer, sluiceotel.WithTracerProvider(tracenoop.NewTracerProvider()), sluiceotel.WithMeterProvider(metricnoop.NewMeterProvider()))},
		{"wrap=global-unset", sluiceotel.Wrap(answer)},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.backend.Do(ctx, "customer-42", cfg, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// instant allows every request at once.
type instant struct{}

func (instant) Do(context.Context, string, ratelimit.Config, ratelimit.Request) (ratelimit.Decision, error) {
	return ratelimit.Decision{Allowed: true, Limit: 10, Remaining: 9, Consumed: 1}, nil
}

// passThrough is the least a decorator can be, the floor of
// BenchmarkOverhead: one more interface call, its arguments and results
// copied once more.
type passThrough struct{ next ratelimit.Backend }

func (p passThrough) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	return p.next.Do(ctx, key, cfg, req)
}
