package otel_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/failpolicy"
	sluiceotel "github.com/sluicehq/sluice/otel"
	"github.com/sluicehq/sluice/ratelimit"
)

// secretKey is a bucket key that must appear in no telemetry by default.
const secretKey = "cust-4711-secret"

// telemetry is an SDK tracer and meter provider whose spans and metrics a
// test reads back.
type telemetry struct {
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	tp     *sdktrace.TracerProvider
	mp     *sdkmetric.MeterProvider
}

func newTelemetry(t *testing.T) *telemetry {
	t.Helper()
	tel := &telemetry{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tel.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tel.spans))
	tel.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(tel.reader))
	t.Cleanup(func() {
		_ = tel.tp.Shutdown(context.Background())
		_ = tel.mp.Shutdown(context.Background())
	})
	return tel
}

// options are the providers, and those of the test's key class and route.
func (tel *telemetry) options(more ...sluiceotel.Option) []sluiceotel.Option {
	return append([]sluiceotel.Option{
		sluiceotel.WithTracerProvider(tel.tp),
		sluiceotel.WithMeterProvider(tel.mp),
		sluiceotel.WithKeyClass(func(key string) string {
			if strings.HasPrefix(key, "cust-") {
				return "customer"
			}
			return "anonymous"
		}),
	}, more...)
}

// request returns a context under a sampled span, as an HTTP server's
// instrumentation gives a handler, on route /v1/search.
func (tel *telemetry) request(t *testing.T) context.Context {
	t.Helper()
	ctx, span := tel.tp.Tracer("test").Start(context.Background(), "GET /v1/search")
	t.Cleanup(func() { span.End() })
	return sluiceotel.ContextWithRoute(ctx, "/v1/search")
}

// decisionSpans returns the ended spans the decorator made.
func (tel *telemetry) decisionSpans() []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tel.spans.Ended() {
		if strings.HasPrefix(s.Name(), "sluice") {
			out = append(out, s)
		}
	}
	return out
}

// collect returns the metrics recorded so far.
func (tel *telemetry) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tel.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("Collect: %v", err)
	}
	return rm
}

// data returns the data of the metric named name, if rm has it.
func data[A metricdata.Aggregation](t *testing.T, rm metricdata.ResourceMetrics, name string) (A, bool) {
	t.Helper()
	var zero A
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			a, ok := m.Data.(A)
			if !ok {
				t.Fatalf("%s is a %T, not a %T", name, m.Data, zero)
			}
			return a, true
		}
	}
	return zero, false
}

// sums returns each data point of the sum named name, by its attributes.
func sums(t *testing.T, rm metricdata.ResourceMetrics, name string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	sum, _ := data[metricdata.Sum[int64]](t, rm, name)
	for _, dp := range sum.DataPoints {
		out[encode(dp.Attributes)] += dp.Value
	}
	return out
}

// histogramCounts returns each data point's count of the histogram named
// name, by its attributes.
func histogramCounts(t *testing.T, rm metricdata.ResourceMetrics, name string) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	h, _ := data[metricdata.Histogram[float64]](t, rm, name)
	for _, dp := range h.DataPoints {
		out[encode(dp.Attributes)] += dp.Count
	}
	return out
}

// encode writes a set of attributes as k=v pairs, sorted.
func encode(s attribute.Set) string {
	var kv []string
	for _, a := range s.ToSlice() {
		kv = append(kv, string(a.Key)+"="+a.Value.String())
	}
	slices.Sort(kv)
	return strings.Join(kv, ",")
}

func attrs(kvs ...attribute.KeyValue) string { return encode(attribute.NewSet(kvs...)) }

// fixedClock is a clock that does not move.
type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

// down is a store that is away; its errors name the key, as a client's
// may.
type down struct{}

func (down) Do(_ context.Context, key string, _ ratelimit.Config, _ ratelimit.Request) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, fmt.Errorf("%w: dial tcp 10.0.0.7:6379 for key %q: connection refused", ratelimit.ErrBackendUnavailable, key)
}

// hourly is 2 tokens an hour, a bandwidth named "hourly".
func hourly() ratelimit.Config {
	bw := ratelimit.PerHour(2)
	bw.ID = "hourly"
	return ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{bw}, Version: 7}
}

func newMemory(t *testing.T) *memory.Backend {
	t.Helper()
	m := memory.New(memory.WithClock(fixedClock{time.Unix(1_700_000_000, 0)}), memory.WithSweepInterval(0))
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// The four outcomes, each once: exact spans, attributes and counts.
func TestDecisionOutcomes(t *testing.T) {
	tel := newTelemetry(t)
	ctx := tel.request(t)
	cfg := hourly()

	store := sluiceotel.Wrap(newMemory(t), tel.options(sluiceotel.WithBackendName("memory"))...)
	policy, err := failpolicy.Wrap(down{}, failpolicy.Open)
	if err != nil {
		t.Fatal(err)
	}
	degraded := sluiceotel.Wrap(policy, tel.options(sluiceotel.WithBackendName("redis"))...)
	broken := sluiceotel.Wrap(down{}, tel.options(sluiceotel.WithBackendName("redis"))...)

	if d, err := store.Do(ctx, secretKey, cfg, ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}); err != nil || !d.Allowed {
		t.Fatalf("first Consume = %+v, %v; want allowed", d, err)
	}
	if d, err := store.Do(ctx, secretKey, cfg, ratelimit.Request{Op: ratelimit.Consume, Tokens: 2}); err != nil || d.Allowed {
		t.Fatalf("second Consume = %+v, %v; want rejected", d, err)
	}
	if d, err := degraded.Do(ctx, secretKey, cfg, ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}); err != nil || !d.Degraded || !d.Allowed {
		t.Fatalf("Consume through the Open policy = %+v, %v; want degraded and allowed", d, err)
	}
	if _, err := broken.Do(ctx, secretKey, cfg, ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}); !errors.Is(err, ratelimit.ErrBackendUnavailable) {
		t.Fatalf("Consume on a store that is down: err = %v; want ErrBackendUnavailable", err)
	}

	start := []attribute.KeyValue{
		sluiceotel.AttrOperation.String("Consume"),
		sluiceotel.AttrAlgorithm.String("TokenBucket"),
		sluiceotel.AttrKeyClass.String("customer"),
		sluiceotel.AttrRoute.String("/v1/search"),
		sluiceotel.AttrConfigVersion.Int64(7),
	}
	decided := func(backend string, tokens int64, result string, allowed, degraded bool, limit, remaining, consumed int64, retryAfter, resetAfter float64, bandwidth string) string {
		return attrs(append(slices.Clone(start),
			sluiceotel.AttrBackend.String(backend),
			sluiceotel.AttrTokens.Int64(tokens),
			sluiceotel.AttrResult.String(result),
			sluiceotel.AttrAllowed.Bool(allowed),
			sluiceotel.AttrDegraded.Bool(degraded),
			sluiceotel.AttrLimit.Int64(limit),
			sluiceotel.AttrRemaining.Int64(remaining),
			sluiceotel.AttrConsumed.Int64(consumed),
			sluiceotel.AttrRetryAfter.Float64(retryAfter),
			sluiceotel.AttrResetAfter.Float64(resetAfter),
			sluiceotel.AttrBandwidth.String(bandwidth),
		)...)
	}
	degradedD, _ := policy.Do(ctx, secretKey, cfg, ratelimit.Request{Op: ratelimit.Estimate, Tokens: 1})
	want := []struct {
		attrs  string
		status sdktrace.Status
	}{
		{decided("memory", 1, "allowed", true, false, 2, 1, 1, 0, 1800, "hourly"), sdktrace.Status{Code: codes.Unset}},
		{decided("memory", 2, "rejected", false, false, 2, 1, 0, 1800, 1800, "hourly"), sdktrace.Status{Code: codes.Unset}},
		{decided("redis", 1, "degraded", true, true, degradedD.Limit, degradedD.Remaining, 1, 0, degradedD.ResetAfter.Seconds(), degradedD.Bandwidth), sdktrace.Status{Code: codes.Unset}},
		{attrs(append(slices.Clone(start),
			sluiceotel.AttrBackend.String("redis"),
			sluiceotel.AttrTokens.Int64(1),
			sluiceotel.AttrResult.String("error"),
			sluiceotel.AttrErrorType.String("backend_unavailable"),
		)...), sdktrace.Status{Code: codes.Error, Description: ratelimit.ErrBackendUnavailable.Error()}},
	}
	spans := tel.decisionSpans()
	if len(spans) != len(want) {
		t.Fatalf("%d decision spans; want %d", len(spans), len(want))
	}
	for i, s := range spans {
		if s.Name() != "sluice Consume" || s.SpanKind() != trace.SpanKindInternal {
			t.Errorf("span %d: name %q, kind %v; want \"sluice Consume\", internal", i, s.Name(), s.SpanKind())
		}
		if got := attrs(s.Attributes()...); got != want[i].attrs {
			t.Errorf("span %d attributes:\n got %s\nwant %s", i, got, want[i].attrs)
		}
		if s.Status() != want[i].status {
			t.Errorf("span %d status = %+v; want %+v", i, s.Status(), want[i].status)
		}
		if !s.Parent().IsValid() || s.Parent().SpanID() != trace.SpanContextFromContext(ctx).SpanID() {
			t.Errorf("span %d is not a child of the request's span", i)
		}
	}

	rm := tel.collect(t)
	class := []attribute.KeyValue{
		sluiceotel.AttrOperation.String("Consume"),
		sluiceotel.AttrAlgorithm.String("TokenBucket"),
		sluiceotel.AttrKeyClass.String("customer"),
		sluiceotel.AttrRoute.String("/v1/search"),
	}
	wantCounts := map[string]int64{
		attrs(append(slices.Clone(class), sluiceotel.AttrResult.String("allowed"))...):                                                       1,
		attrs(append(slices.Clone(class), sluiceotel.AttrResult.String("rejected"))...):                                                      1,
		attrs(append(slices.Clone(class), sluiceotel.AttrResult.String("degraded"))...):                                                      1,
		attrs(append(slices.Clone(class), sluiceotel.AttrResult.String("error"), sluiceotel.AttrErrorType.String("backend_unavailable"))...): 1,
	}
	if got := sums(t, rm, sluiceotel.MetricDecisions); !maps(got, wantCounts) {
		t.Errorf("%s = %v; want %v", sluiceotel.MetricDecisions, got, wantCounts)
	}
	wantDurations := map[string]uint64{}
	for _, r := range []string{"allowed", "rejected", "degraded", "error"} {
		wantDurations[attrs(sluiceotel.AttrOperation.String("Consume"), sluiceotel.AttrResult.String(r))] = 1
	}
	if got := histogramCounts(t, rm, sluiceotel.MetricDecisionDuration); !maps(got, wantDurations) {
		t.Errorf("%s counts = %v; want %v", sluiceotel.MetricDecisionDuration, got, wantDurations)
	}
	noRawKey(t, tel, rm, secretKey)
}

func maps[V comparable](a, b map[string]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// noRawKey fails if key appears anywhere in the spans or metrics.
func noRawKey(t *testing.T, tel *telemetry, rm metricdata.ResourceMetrics, key string) {
	t.Helper()
	for _, s := range tel.spans.Ended() {
		if text := fmt.Sprintf("%s %v %v %v %v", s.Name(), s.Attributes(), s.Status(), s.Events(), s.Links()); strings.Contains(text, key) {
			t.Errorf("span %q holds the raw key: %s", s.Name(), text)
		}
	}
	if text := fmt.Sprintf("%+v", rm); strings.Contains(text, key) {
		t.Errorf("the metrics hold the raw key: %s", text)
	}
}

// WithRawKeys puts the key on spans, and nowhere else.
func TestRawKeysOnSpansOnly(t *testing.T) {
	tel := newTelemetry(t)
	b := sluiceotel.Wrap(newMemory(t), tel.options(sluiceotel.WithRawKeys())...)
	if _, err := b.Do(tel.request(t), secretKey, hourly(), ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}); err != nil {
		t.Fatal(err)
	}
	spans := tel.decisionSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans; want 1", len(spans))
	}
	if !slices.Contains(spans[0].Attributes(), sluiceotel.AttrKey.String(secretKey)) {
		t.Errorf("span attributes %v lack %s", spans[0].Attributes(), sluiceotel.AttrKey)
	}
	if text := fmt.Sprintf("%+v", tel.collect(t)); strings.Contains(text, secretKey) {
		t.Errorf("the metrics hold the raw key: %s", text)
	}
}

// A decision under no recording span makes no span but is counted;
// WithRootSpans makes one.
func TestSpansNeedARecordingParent(t *testing.T) {
	tel := newTelemetry(t)
	cfg := hourly()
	req := ratelimit.Request{Op: ratelimit.Estimate, Tokens: 1}
	b := sluiceotel.Wrap(newMemory(t), tel.options()...)
	unsampled := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	t.Cleanup(func() { _ = unsampled.Shutdown(context.Background()) })
	dropped, span := unsampled.Tracer("test").Start(context.Background(), "request")
	defer span.End()
	for _, ctx := range []context.Context{context.Background(), dropped} {
		if _, err := b.Do(ctx, "k", cfg, req); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(tel.decisionSpans()); n != 0 {
		t.Errorf("%d spans without a recording parent; want 0", n)
	}
	root := sluiceotel.Wrap(newMemory(t), tel.options(sluiceotel.WithRootSpans())...)
	if _, err := root.Do(context.Background(), "k", cfg, req); err != nil {
		t.Fatal(err)
	}
	spans := tel.decisionSpans()
	if len(spans) != 1 || spans[0].Parent().IsValid() || spans[0].Name() != "sluice Estimate" {
		t.Errorf("WithRootSpans: spans %v; want one root span \"sluice Estimate\"", spans)
	}
	want := map[string]int64{attrs(
		sluiceotel.AttrResult.String("allowed"),
		sluiceotel.AttrOperation.String("Estimate"),
		sluiceotel.AttrAlgorithm.String("TokenBucket"),
		sluiceotel.AttrKeyClass.String("anonymous"),
	): 3}
	if got := sums(t, tel.collect(t), sluiceotel.MetricDecisions); !maps(got, want) {
		t.Errorf("%s = %v; want %v", sluiceotel.MetricDecisions, got, want)
	}
}

// An error's status names its sentinel, never its message, and every
// sentinel has its error.type.
func TestErrorTypes(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{fmt.Errorf("%w: key %q", ratelimit.ErrInvalidKey, secretKey), "invalid_key"},
		{fmt.Errorf("x: %w", ratelimit.ErrInvalidConfig), "invalid_config"},
		{ratelimit.ErrInvalidRequest, "invalid_request"},
		{ratelimit.ErrKeyRejected, "key_rejected"},
		{ratelimit.ErrWaitExceedsDeadline, "wait_exceeds_deadline"},
		{fmt.Errorf("otel: %w", errors.ErrUnsupported), "unsupported"},
		{failpolicy.ErrBreakerOpen, "breaker_open"},
		{fmt.Errorf("%w: %w", ratelimit.ErrTimeout, context.DeadlineExceeded), "timeout"},
		{ratelimit.ErrBackendUnavailable, "backend_unavailable"},
		{fmt.Errorf("failpolicy: %w", context.Canceled), "canceled"},
		{context.DeadlineExceeded, "deadline_exceeded"},
		{&failpolicy.PanicError{Value: "boom"}, "panic"},
		{errors.New("something else"), sluiceotel.ErrorTypeOther},
	} {
		if got := sluiceotel.ErrorType(c.err); got != c.want {
			t.Errorf("ErrorType(%v) = %q; want %q", c.err, got, c.want)
		}
	}
}

// Invalid input fails as the wrapped Backend fails it, with the error
// counted and on the span, and the key in neither.
func TestInvalidKeyIsAnError(t *testing.T) {
	tel := newTelemetry(t)
	b := sluiceotel.Wrap(newMemory(t), tel.options()...)
	long := secretKey + strings.Repeat("x", ratelimit.MaxKeyLen)
	_, err := b.Do(tel.request(t), long, hourly(), ratelimit.Request{Op: ratelimit.Consume, Tokens: 1})
	if !errors.Is(err, ratelimit.ErrInvalidKey) {
		t.Fatalf("err = %v; want ErrInvalidKey", err)
	}
	spans := tel.decisionSpans()
	if len(spans) != 1 || spans[0].Status().Code != codes.Error || !slices.Contains(spans[0].Attributes(), sluiceotel.AttrErrorType.String("invalid_key")) {
		t.Fatalf("spans %v; want one with status Error and error.type invalid_key", spans)
	}
	noRawKey(t, tel, tel.collect(t), secretKey)
}

// A panic in the wrapped Backend goes on up; its span is ended, and the
// decision is counted and timed as an error of type panic, with a span or
// without one.
func TestPanicIsCounted(t *testing.T) {
	for _, traced := range []bool{true, false} {
		t.Run(fmt.Sprintf("traced=%v", traced), func(t *testing.T) {
			tel := newTelemetry(t)
			b := sluiceotel.Wrap(panicking{}, tel.options()...)
			ctx := sluiceotel.ContextWithRoute(context.Background(), "/v1/search")
			if traced {
				ctx = tel.request(t)
			}
			func() {
				defer func() {
					if r := recover(); r != "boom" {
						t.Errorf("recovered %v; want boom", r)
					}
				}()
				_, _ = b.Do(ctx, "cust-1", hourly(), ratelimit.Request{Op: ratelimit.Consume, Tokens: 1})
			}()
			spans := tel.decisionSpans()
			if traced {
				if len(spans) != 1 || spans[0].Status().Code != codes.Error ||
					!slices.Contains(spans[0].Attributes(), sluiceotel.AttrErrorType.String("panic")) ||
					!slices.Contains(spans[0].Attributes(), sluiceotel.AttrResult.String("error")) {
					t.Fatalf("spans %v; want one ended with status Error, result error and error.type panic", spans)
				}
			} else if len(spans) != 0 {
				t.Fatalf("spans %v; want none without a recording parent", spans)
			}
			rm := tel.collect(t)
			wantCounts := map[string]int64{attrs(
				sluiceotel.AttrOperation.String("Consume"),
				sluiceotel.AttrAlgorithm.String("TokenBucket"),
				sluiceotel.AttrKeyClass.String("customer"),
				sluiceotel.AttrRoute.String("/v1/search"),
				sluiceotel.AttrResult.String("error"),
				sluiceotel.AttrErrorType.String("panic"),
			): 1}
			if got := sums(t, rm, sluiceotel.MetricDecisions); !maps(got, wantCounts) {
				t.Errorf("%s = %v; want %v", sluiceotel.MetricDecisions, got, wantCounts)
			}
			wantDurations := map[string]uint64{attrs(sluiceotel.AttrOperation.String("Consume"), sluiceotel.AttrResult.String("error")): 1}
			if got := histogramCounts(t, rm, sluiceotel.MetricDecisionDuration); !maps(got, wantDurations) {
				t.Errorf("%s counts = %v; want %v", sluiceotel.MetricDecisionDuration, got, wantDurations)
			}
		})
	}
}

type panicking struct{}

func (panicking) Do(context.Context, string, ratelimit.Config, ratelimit.Request) (ratelimit.Decision, error) {
	panic("boom")
}

// The caller's context, span included, reaches the wrapped Backend.
func TestContextReachesTheStore(t *testing.T) {
	tel := newTelemetry(t)
	var seen trace.SpanContext
	var route string
	next := backendFunc(func(ctx context.Context) {
		seen = trace.SpanContextFromContext(ctx)
		route = sluiceotel.RouteFromContext(ctx)
	})
	b := sluiceotel.Wrap(next, tel.options()...)
	if _, err := b.Do(tel.request(t), "k", hourly(), ratelimit.Request{Op: ratelimit.Inspect}); err != nil {
		t.Fatal(err)
	}
	spans := tel.decisionSpans()
	if len(spans) != 1 || seen.SpanID() != spans[0].SpanContext().SpanID() {
		t.Errorf("the store saw span %v; want the decision's span", seen.SpanID())
	}
	if route != "/v1/search" {
		t.Errorf("the store saw route %q", route)
	}
}

type backendFunc func(ctx context.Context)

func (f backendFunc) Do(ctx context.Context, _ string, _ ratelimit.Config, _ ratelimit.Request) (ratelimit.Decision, error) {
	f(ctx)
	return ratelimit.Decision{Allowed: true}, nil
}

// Wrap(nil) fails every decision with ErrBackendUnavailable.
func TestNilBackend(t *testing.T) {
	_, err := sluiceotel.Wrap(nil).Do(context.Background(), "k", hourly(), ratelimit.Request{Op: ratelimit.Consume, Tokens: 1})
	if !errors.Is(err, ratelimit.ErrBackendUnavailable) {
		t.Fatalf("err = %v; want ErrBackendUnavailable", err)
	}
}

// Version and ScopeName are the tracer's and meter's scope.
func TestScope(t *testing.T) {
	tel := newTelemetry(t)
	b := sluiceotel.Wrap(newMemory(t), tel.options()...)
	if _, err := b.Do(tel.request(t), "k", hourly(), ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}); err != nil {
		t.Fatal(err)
	}
	s := tel.decisionSpans()[0].InstrumentationScope()
	if s.Name != sluiceotel.ScopeName || s.Version != sluiceotel.Version() || sluiceotel.ScopeName != "github.com/sluicehq/sluice/otel" {
		t.Errorf("span scope %+v; want %s at %s", s, sluiceotel.ScopeName, sluiceotel.Version())
	}
	for _, sm := range tel.collect(t).ScopeMetrics {
		if sm.Scope.Name != sluiceotel.ScopeName || sm.Scope.Version != sluiceotel.Version() {
			t.Errorf("metric scope %+v", sm.Scope)
		}
	}
}

// rejectedKeys returns the rejected-keys gauge's points, by attributes.
func rejectedKeys(t *testing.T, rm metricdata.ResourceMetrics) map[string]int64 {
	t.Helper()
	return gauge(t, rm, sluiceotel.MetricRejectedKeys)
}

// gauge returns an int64 gauge's points, by attributes.
func gauge(t *testing.T, rm metricdata.ResourceMetrics, name string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	g, _ := data[metricdata.Gauge[int64]](t, rm, name)
	for _, dp := range g.DataPoints {
		out[encode(dp.Attributes)] = dp.Value
	}
	return out
}

// The rejected-keys gauge shows the distinct keys rejected in the last
// whole minute: an abuser's many rejections count once.
func TestRejectedKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tel := newTelemetry(t)
		store := memory.New(memory.WithSweepInterval(0))
		defer store.Close()
		b := sluiceotel.Wrap(store, tel.options()...)
		ctx := sluiceotel.ContextWithRoute(context.Background(), "/v1/export")
		cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(1)}}
		consume := func(key string, n int) {
			for range n {
				if _, err := b.Do(ctx, key, cfg, ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}); err != nil {
					t.Fatal(err)
				}
			}
		}
		time.Sleep(time.Second) // into the first minute
		for i := range 5 {
			consume(fmt.Sprintf("cust-%d", i), 2) // one rejection each
		}
		consume("1.2.3.4", 100) // 99 rejections
		series := func(class string) string {
			return attrs(sluiceotel.AttrKeyClass.String(class), sluiceotel.AttrRoute.String("/v1/export"))
		}
		if got := rejectedKeys(t, tel.collect(t)); got[series("customer")] != 0 || got[series("anonymous")] != 0 {
			t.Errorf("during the minute: %v; want 0s (the last minute had none)", got)
		}
		time.Sleep(time.Minute)
		// Two of the five keys may share a register of the sketch (a 1%
		// chance, by the process's hash seed), which shows as one key less.
		got := rejectedKeys(t, tel.collect(t))
		if c, a := got[series("customer")], got[series("anonymous")]; len(got) != 2 || c < 4 || c > 5 || a != 1 {
			t.Errorf("the minute after: %v; want 5 (or 4) customer keys and 1 anonymous", got)
		}
		time.Sleep(time.Minute)
		want := map[string]int64{series("customer"): 0, series("anonymous"): 0}
		if got := rejectedKeys(t, tel.collect(t)); !maps(got, want) {
			t.Errorf("a quiet minute later: %v; want %v", got, want)
		}
	})
}

// The backend attribute names the store below the decorators.
func TestBackendName(t *testing.T) {
	tel := newTelemetry(t)
	store := newMemory(t)
	policy, err := failpolicy.Wrap(store, failpolicy.Open)
	if err != nil {
		t.Fatal(err)
	}
	stack, err := ratelimit.Stack(store, sluiceotel.Layer(tel.options()...), failpolicy.Layer(failpolicy.Closed))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		backend ratelimit.Backend
		want    string
	}{
		{sluiceotel.Wrap(store, tel.options()...), "memory"},
		{sluiceotel.Wrap(policy, tel.options()...), "memory"},
		{sluiceotel.Wrap(stack, tel.options()...), "memory"},
		{stack, "memory"},
		{sluiceotel.Wrap(down{}, tel.options()...), "otel_test"},
		{sluiceotel.Wrap(policy, tel.options(sluiceotel.WithBackendName("redis"))...), "redis"},
	} {
		tel.spans.Reset()
		if _, err := c.backend.Do(tel.request(t), "k", hourly(), ratelimit.Request{Op: ratelimit.Inspect}); err != nil && c.want != "otel_test" {
			t.Fatal(err)
		}
		spans := tel.decisionSpans()
		if len(spans) == 0 || !slices.Contains(spans[0].Attributes(), sluiceotel.AttrBackend.String(c.want)) {
			t.Errorf("%T: spans %v; want %s %q", c.backend, spans, sluiceotel.AttrBackend, c.want)
		}
	}
}

// A decision allocates nothing the bare backend does not, with the no-op
// providers, with the global ones unset, and with the SDK's metrics under
// a span its sampler dropped (a cached attribute set).
func TestNoAllocations(t *testing.T) {
	tel := newTelemetry(t)
	unsampled := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	t.Cleanup(func() { _ = unsampled.Shutdown(context.Background()) })
	dropped, span := unsampled.Tracer("test").Start(context.Background(), "request")
	defer span.End()
	dropped = sluiceotel.ContextWithRoute(dropped, "/v1/search")
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1_000_000).WithBurst(1_000_000_000)}}
	req := ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}
	for _, c := range []struct {
		name string
		b    ratelimit.Backend
		ctx  context.Context
	}{
		{"noop", sluiceotel.Wrap(newMemory(t), sluiceotel.WithTracerProvider(tracenoop.NewTracerProvider()), sluiceotel.WithMeterProvider(metricnoop.NewMeterProvider())), context.Background()},
		{"global", sluiceotel.Wrap(newMemory(t)), context.Background()},
		{"sdk-sampled-out", sluiceotel.Wrap(newMemory(t), tel.options()...), dropped},
	} {
		if _, err := c.b.Do(c.ctx, "cust-1", cfg, req); err != nil { // the bucket and the attribute set made
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(200, func() { _, _ = c.b.Do(c.ctx, "cust-1", cfg, req) }); n != 0 {
			t.Errorf("%s: %v allocations a decision; want 0", c.name, n)
		}
	}
}
