package otel_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/lease"
	sluiceotel "github.com/sluicehq/sluice/otel"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/sharding"
)

// permitStore is a memory backend that is down, for rates and permits
// alike, while down is set; its errors name the key, as a client's may.
type permitStore struct {
	*memory.Backend
	down atomic.Bool
}

func newPermitStore(t *testing.T, clock ratelimit.Clock) *permitStore {
	t.Helper()
	m := memory.New(memory.WithClock(clock), memory.WithSweepInterval(0))
	t.Cleanup(func() { _ = m.Close() })
	return &permitStore{Backend: m}
}

func (s *permitStore) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if s.down.Load() {
		return down{}.Do(ctx, key, cfg, req)
	}
	return s.Backend.Do(ctx, key, cfg, req)
}

func (s *permitStore) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	if err := ratelimit.CheckPermit(key, lim, req); err != nil {
		return ratelimit.PermitDecision{}, err
	}
	if s.down.Load() {
		return ratelimit.PermitDecision{}, fmt.Errorf("%w: dial tcp 10.0.0.7:6379 for key %q: connection refused", ratelimit.ErrBackendUnavailable, key)
	}
	return s.Backend.DoPermit(ctx, key, lim, req)
}

func acquireReq(holder string, weight int64) ratelimit.PermitRequest {
	return ratelimit.PermitRequest{Op: ratelimit.PermitAcquire, Holder: holder, Weight: weight}
}

func releaseReq(holder string, weight int64) ratelimit.PermitRequest {
	return ratelimit.PermitRequest{Op: ratelimit.PermitRelease, Holder: holder, Weight: weight}
}

// threeAMinute is a limit of 3 permits leased for a minute.
var threeAMinute = ratelimit.InFlight(3, time.Minute)

// inFlight returns the in-flight up-down counter's points, by attributes.
func inFlight(t *testing.T, tel *telemetry) map[string]int64 {
	t.Helper()
	return sums(t, tel.collect(t), sluiceotel.MetricPermitsInFlight)
}

// Each outcome of each op, once: exact spans, attributes and counts.
func TestPermitOutcomes(t *testing.T) {
	tel := newTelemetry(t)
	ctx := tel.request(t)
	store := newPermitStore(t, fixedClock{time.Unix(1_700_000_000, 0)})
	b := sluiceotel.Wrap(store, tel.options(sluiceotel.WithBackendName("memory"))...)
	policy, err := failpolicy.Wrap(store, failpolicy.Open)
	if err != nil {
		t.Fatal(err)
	}
	degraded := sluiceotel.Wrap(policy, tel.options(sluiceotel.WithBackendName("redis"))...)

	calls := []struct {
		b    *sluiceotel.Backend
		req  ratelimit.PermitRequest
		down bool
	}{
		{b, acquireReq("a", 2), false}, // granted
		{b, acquireReq("b", 2), false}, // rejected
		{b, ratelimit.PermitRequest{Op: ratelimit.PermitRenew, Holder: "a", Weight: 2}, false}, // granted
		{b, releaseReq("a", 2), false},                                   // granted
		{b, releaseReq("a", 2), false},                                   // rejected: no longer held
		{b, ratelimit.PermitRequest{Op: ratelimit.PermitInspect}, false}, // granted
		{degraded, acquireReq("c", 1), true},                             // degraded
		{b, acquireReq("d", 1), true},                                    // error
	}
	for i, c := range calls {
		store.down.Store(c.down)
		if _, err := c.b.DoPermit(ctx, secretKey, threeAMinute, c.req); (err != nil) != (i == len(calls)-1) {
			t.Fatalf("call %d, %v: %v", i, c.req.Op, err)
		}
	}

	start := func(backend, op string, weight int64) []attribute.KeyValue {
		return []attribute.KeyValue{
			sluiceotel.AttrOperation.String(op),
			sluiceotel.AttrPermitWeight.Int64(weight),
			sluiceotel.AttrPermitLease.Float64(60),
			sluiceotel.AttrBackend.String(backend),
			sluiceotel.AttrKeyClass.String("customer"),
			sluiceotel.AttrRoute.String("/v1/search"),
		}
	}
	decided := func(backend, op string, weight int64, result string, granted, degraded bool, limit, inFlight int64, retryAfter float64) string {
		return attrs(append(start(backend, op, weight),
			sluiceotel.AttrResult.String(result),
			sluiceotel.AttrPermitGranted.Bool(granted),
			sluiceotel.AttrDegraded.Bool(degraded),
			sluiceotel.AttrLimit.Int64(limit),
			sluiceotel.AttrPermitInFlight.Int64(inFlight),
			sluiceotel.AttrRetryAfter.Float64(retryAfter),
		)...)
	}
	want := []struct {
		name, attrs string
		status      sdktrace.Status
	}{
		{"sluice Acquire", decided("memory", "Acquire", 2, "allowed", true, false, 3, 2, 0), sdktrace.Status{}},
		{"sluice Acquire", decided("memory", "Acquire", 2, "rejected", false, false, 3, 2, 60), sdktrace.Status{}},
		{"sluice Renew", decided("memory", "Renew", 2, "allowed", true, false, 3, 2, 0), sdktrace.Status{}},
		{"sluice Release", decided("memory", "Release", 2, "allowed", true, false, 3, 0, 0), sdktrace.Status{}},
		{"sluice Release", decided("memory", "Release", 2, "rejected", false, false, 3, 0, 0), sdktrace.Status{}},
		{"sluice InspectPermits", decided("memory", "InspectPermits", 0, "allowed", true, false, 3, 0, 0), sdktrace.Status{}},
		{"sluice Acquire", decided("redis", "Acquire", 1, "degraded", true, true, 3, 0, 0), sdktrace.Status{}},
		{"sluice Acquire", attrs(append(start("memory", "Acquire", 1),
			sluiceotel.AttrResult.String("error"),
			sluiceotel.AttrErrorType.String("backend_unavailable"),
		)...), sdktrace.Status{Code: codes.Error, Description: ratelimit.ErrBackendUnavailable.Error()}},
	}
	spans := tel.decisionSpans()
	if len(spans) != len(want) {
		t.Fatalf("%d spans; want %d", len(spans), len(want))
	}
	for i, s := range spans {
		if s.Name() != want[i].name || s.SpanKind() != trace.SpanKindInternal {
			t.Errorf("span %d: name %q, kind %v; want %q, internal", i, s.Name(), s.SpanKind(), want[i].name)
		}
		if got := attrs(s.Attributes()...); got != want[i].attrs {
			t.Errorf("span %d attributes:\n got %s\nwant %s", i, got, want[i].attrs)
		}
		if s.Status() != want[i].status {
			t.Errorf("span %d status = %+v; want %+v", i, s.Status(), want[i].status)
		}
		if s.Parent().SpanID() != trace.SpanContextFromContext(ctx).SpanID() {
			t.Errorf("span %d is not a child of the request's span", i)
		}
	}

	rm := tel.collect(t)
	series := func(op, result string, more ...attribute.KeyValue) string {
		return attrs(append([]attribute.KeyValue{
			sluiceotel.AttrOperation.String(op),
			sluiceotel.AttrResult.String(result),
			sluiceotel.AttrKeyClass.String("customer"),
			sluiceotel.AttrRoute.String("/v1/search"),
		}, more...)...)
	}
	wantCounts := map[string]int64{
		series("Acquire", "allowed"):  1,
		series("Acquire", "rejected"): 1,
		series("Acquire", "degraded"): 1,
		series("Acquire", "error", sluiceotel.AttrErrorType.String("backend_unavailable")): 1,
		series("Renew", "allowed"):          1,
		series("Release", "allowed"):        1,
		series("Release", "rejected"):       1,
		series("InspectPermits", "allowed"): 1,
	}
	if got := sums(t, rm, sluiceotel.MetricPermitDecisions); !maps(got, wantCounts) {
		t.Errorf("%s = %v; want %v", sluiceotel.MetricPermitDecisions, got, wantCounts)
	}
	// a: +2, −2 (granted); −2 again (a second release); c: +1 (Open's).
	wantHeld := map[string]int64{attrs(sluiceotel.AttrKeyClass.String("customer")): -1}
	if got := sums(t, rm, sluiceotel.MetricPermitsInFlight); !maps(got, wantHeld) {
		t.Errorf("%s = %v; want %v", sluiceotel.MetricPermitsInFlight, got, wantHeld)
	}
	if got := sums(t, rm, sluiceotel.MetricDecisions); len(got) != 0 {
		t.Errorf("%s = %v; want no rate decision counted", sluiceotel.MetricDecisions, got)
	}
	wantDurations := map[string]uint64{}
	for series, n := range map[[2]string]uint64{
		{"Acquire", "allowed"}: 1, {"Acquire", "rejected"}: 1, {"Acquire", "degraded"}: 1, {"Acquire", "error"}: 1,
		{"Renew", "allowed"}: 1, {"Release", "allowed"}: 1, {"Release", "rejected"}: 1, {"InspectPermits", "allowed"}: 1,
	} {
		wantDurations[attrs(sluiceotel.AttrOperation.String(series[0]), sluiceotel.AttrResult.String(series[1]))] = n
	}
	if got := histogramCounts(t, rm, sluiceotel.MetricPermitDuration); !maps(got, wantDurations) {
		t.Errorf("%s counts = %v; want %v", sluiceotel.MetricPermitDuration, got, wantDurations)
	}
	if got := histogramCounts(t, rm, sluiceotel.MetricDecisionDuration); len(got) != 0 {
		t.Errorf("%s = %v; want no rate decision timed", sluiceotel.MetricDecisionDuration, got)
	}
	noRawKey(t, tel, rm, secretKey)
}

// The in-flight count follows the permits a Limiter's handles hold, by
// key class: up by a granted acquire's weight, down by each release's,
// even of a permit whose lease had ended (ErrPermitLost) or whose release
// the store failed, and released with a context of no route; a denied
// acquire, bad input and a store that holds no permits leave it as it
// is.
func TestPermitInFlight(t *testing.T) {
	tel := newTelemetry(t)
	clock := &movingClock{}
	store := newPermitStore(t, clock)
	l := ratelimit.New(sluiceotel.Wrap(store, tel.options()...))
	ctx := sluiceotel.ContextWithRoute(context.Background(), "/v1/search")
	customer, anonymous := attrs(sluiceotel.AttrKeyClass.String("customer")), attrs(sluiceotel.AttrKeyClass.String("anonymous"))
	want := func(what string, c, a int64) {
		t.Helper()
		w := map[string]int64{customer: c, anonymous: a}
		if got := inFlight(t, tel); !maps(got, w) {
			t.Fatalf("%s: %s = %v; want %v", what, sluiceotel.MetricPermitsInFlight, got, w)
		}
	}
	acquire := func(key string, n int64) *ratelimit.Permit {
		t.Helper()
		p, _, err := l.TryAcquire(ctx, key, threeAMinute, n)
		if err != nil || p == nil {
			t.Fatalf("TryAcquire(%q, %d): %v, %v; want a permit", key, n, p, err)
		}
		return p
	}
	c1, c2, a1 := acquire("cust-1", 2), acquire("cust-1", 1), acquire("ip-1", 3)
	want("acquired", 3, 3)
	if p, _, err := l.TryAcquire(ctx, "cust-1", threeAMinute, 1); p != nil || err != nil {
		t.Fatalf("TryAcquire on a full key: %v, %v; want none", p, err)
	}
	want("a denied acquire", 3, 3)
	if err := c1.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	want("released with no route", 1, 3)

	clock.advance(2 * time.Minute) // c2's and a1's leases end
	if err := c2.Release(ctx); !errors.Is(err, ratelimit.ErrPermitLost) {
		t.Fatalf("Release after the lease: %v; want ErrPermitLost", err)
	}
	want("a lost permit released", 0, 3)
	store.down.Store(true)
	if err := a1.Release(ctx); !errors.Is(err, ratelimit.ErrBackendUnavailable) {
		t.Fatalf("Release with the store down: %v; want ErrBackendUnavailable", err)
	}
	want("a release the store failed", 0, 0)
	store.down.Store(false)

	b := sluiceotel.Wrap(store, tel.options()...)
	for _, c := range []struct {
		key string
		req ratelimit.PermitRequest
	}{
		{"cust-1", releaseReq("", 2)},
		{"", releaseReq("h", 2)},
		{"cust-1", ratelimit.PermitRequest{Op: 9, Holder: "h", Weight: 2}},
	} {
		if _, err := b.DoPermit(ctx, c.key, threeAMinute, c.req); err == nil {
			t.Fatalf("%v %q on %q: no error", c.req.Op, c.req.Holder, c.key)
		}
	}
	unsupported := sluiceotel.Wrap(down{}, tel.options()...)
	if _, err := unsupported.DoPermit(ctx, "cust-1", threeAMinute, releaseReq("h", 2)); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("a store without permits: %v; want ErrUnsupported", err)
	}
	want("bad input and a store without permits", 0, 0)
	var unsupportedCalls int64
	for k, v := range sums(t, tel.collect(t), sluiceotel.MetricPermitDecisions) {
		if strings.Contains(k, "error.type=unsupported") {
			unsupportedCalls += v
		}
	}
	if unsupportedCalls != 1 {
		t.Errorf("%d permit calls counted of error.type unsupported; want 1", unsupportedCalls)
	}
}

// A permit call under no recording span makes none, but is counted, its
// error by type; WithRootSpans makes one.
func TestPermitSpansNeedARecordingParent(t *testing.T) {
	tel := newTelemetry(t)
	b := sluiceotel.Wrap(newPermitStore(t, fixedClock{time.Unix(1e9, 0)}), tel.options()...)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.DoPermit(context.Background(), "k", threeAMinute, acquireReq("a", 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.DoPermit(cancelled, "k", threeAMinute, acquireReq("b", 1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled call: %v; want context.Canceled", err)
	}
	if n := len(tel.decisionSpans()); n != 0 {
		t.Errorf("%d spans without a recording parent; want 0", n)
	}
	root := sluiceotel.Wrap(newPermitStore(t, fixedClock{time.Unix(1e9, 0)}), tel.options(sluiceotel.WithRootSpans())...)
	if _, err := root.DoPermit(context.Background(), "k", threeAMinute, acquireReq("a", 1)); err != nil {
		t.Fatal(err)
	}
	if spans := tel.decisionSpans(); len(spans) != 1 || spans[0].Parent().IsValid() || spans[0].Name() != "sluice Acquire" {
		t.Errorf("WithRootSpans: spans %v; want one root span \"sluice Acquire\"", spans)
	}
	series := func(result string, more ...attribute.KeyValue) string {
		return attrs(append([]attribute.KeyValue{
			sluiceotel.AttrOperation.String("Acquire"),
			sluiceotel.AttrResult.String(result),
			sluiceotel.AttrKeyClass.String("anonymous"),
		}, more...)...)
	}
	want := map[string]int64{
		series("allowed"): 2,
		series("error", sluiceotel.AttrErrorType.String("canceled")): 1,
	}
	if got := sums(t, tel.collect(t), sluiceotel.MetricPermitDecisions); !maps(got, want) {
		t.Errorf("%s = %v; want %v", sluiceotel.MetricPermitDecisions, got, want)
	}
}

// panickingPermits panics in DoPermit.
type panickingPermits struct{ panicking }

func (panickingPermits) DoPermit(context.Context, string, ratelimit.Concurrency, ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	panic("boom")
}

// A panic in the wrapped Backend's DoPermit goes on up; its span is ended
// and the call counted as an error of type panic, and a Release counts
// down all the same.
func TestPermitPanicIsCounted(t *testing.T) {
	tel := newTelemetry(t)
	b := sluiceotel.Wrap(panickingPermits{}, tel.options()...)
	ctx := tel.request(t)
	for _, req := range []ratelimit.PermitRequest{acquireReq("a", 2), releaseReq("a", 2)} {
		func() {
			defer func() {
				if r := recover(); r != "boom" {
					t.Errorf("%v: recovered %v; want boom", req.Op, r)
				}
			}()
			_, _ = b.DoPermit(ctx, "cust-1", threeAMinute, req)
		}()
	}
	spans := tel.decisionSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans; want 2", len(spans))
	}
	for _, s := range spans {
		if s.Status().Code != codes.Error || !slices.Contains(s.Attributes(), sluiceotel.AttrErrorType.String("panic")) {
			t.Errorf("span %q: %v, %v; want status Error and error.type panic", s.Name(), s.Status(), s.Attributes())
		}
	}
	rm := tel.collect(t)
	var panics int64
	for k, v := range sums(t, rm, sluiceotel.MetricPermitDecisions) {
		if strings.Contains(k, "error.type=panic") {
			panics += v
		}
	}
	if panics != 2 {
		t.Errorf("%d permit calls counted as panics; want 2", panics)
	}
	if got := sums(t, rm, sluiceotel.MetricPermitsInFlight); got[attrs(sluiceotel.AttrKeyClass.String("customer"))] != -2 {
		t.Errorf("%s = %v; want the Release's -2 alone", sluiceotel.MetricPermitsInFlight, got)
	}
	wantDurations := map[string]uint64{
		attrs(sluiceotel.AttrOperation.String("Acquire"), sluiceotel.AttrResult.String("error")): 1,
		attrs(sluiceotel.AttrOperation.String("Release"), sluiceotel.AttrResult.String("error")): 1,
	}
	if got := histogramCounts(t, rm, sluiceotel.MetricPermitDuration); !maps(got, wantDurations) {
		t.Errorf("%s counts = %v; want %v", sluiceotel.MetricPermitDuration, got, wantDurations)
	}
}

// A permit call allocates nothing the bare backend does not, with the
// no-op providers, with the global ones unset, and with the SDK's metrics
// under a span its sampler dropped (cached attribute sets).
func TestPermitNoAllocations(t *testing.T) {
	tel := newTelemetry(t)
	unsampled := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	t.Cleanup(func() { _ = unsampled.Shutdown(context.Background()) })
	dropped, span := unsampled.Tracer("test").Start(context.Background(), "request")
	defer span.End()
	dropped = sluiceotel.ContextWithRoute(dropped, "/v1/search")
	for _, c := range []struct {
		name string
		b    *sluiceotel.Backend
		ctx  context.Context
	}{
		{"noop", sluiceotel.Wrap(newMemory(t), sluiceotel.WithTracerProvider(tracenoop.NewTracerProvider()), sluiceotel.WithMeterProvider(metricnoop.NewMeterProvider())), context.Background()},
		{"global", sluiceotel.Wrap(newMemory(t)), context.Background()},
		{"sdk-sampled-out", sluiceotel.Wrap(newMemory(t), tel.options()...), dropped},
	} {
		// A permit held, and its Renew's attribute set made.
		if _, err := c.b.DoPermit(c.ctx, "cust-1", threeAMinute, acquireReq("a", 1)); err != nil {
			t.Fatal(err)
		}
		renew := ratelimit.PermitRequest{Op: ratelimit.PermitRenew, Holder: "a", Weight: 1}
		if n := testing.AllocsPerRun(200, func() { _, _ = c.b.DoPermit(c.ctx, "cust-1", threeAMinute, renew) }); n != 0 {
			t.Errorf("%s: %v allocations a Renew; want 0", c.name, n)
		}
	}
}

// A Stack of the memory store and every decorator hands permit calls
// through each layer to the store, for the key as it is: the telemetry
// sees them, leasing and sharding pass them on though the key is leased
// and split, and the fail policy decides when the store fails.
func TestPermitsThroughStack(t *testing.T) {
	tel := newTelemetry(t)
	store := newPermitStore(t, fixedClock{time.Unix(1e9, 0)})
	stack, err := ratelimit.Stack(store,
		sluiceotel.Layer(tel.options()...),
		lease.Layer(lease.Keys("hot")),
		sharding.Layer(sharding.Keys(4, "hot")),
		failpolicy.Layer(failpolicy.Open),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer stack.Close()
	// Every layer, from the outermost in, holds permits.
	var layers []string
	for b := stack.Unwrap(); b != ratelimit.Backend(store); b = b.(interface{ Unwrap() ratelimit.Backend }).Unwrap() {
		if _, ok := b.(ratelimit.PermitBackend); !ok {
			t.Errorf("%T is no PermitBackend", b)
		}
		layers = append(layers, fmt.Sprintf("%T", b))
	}
	if want := []string{"*otel.Backend", "*lease.Backend", "*sharding.Backend", "*failpolicy.Backend"}; !slices.Equal(layers, want) {
		t.Fatalf("layers %v; want %v", layers, want)
	}

	l := ratelimit.New(stack)
	ctx := tel.request(t)
	lim := ratelimit.InFlight(4, time.Minute)
	whole, d, err := l.TryAcquire(ctx, "hot", lim, 4) // 4 at once: one limit of 4, not 4 sub-buckets of 1
	if err != nil || whole == nil || d.Degraded {
		t.Fatalf("TryAcquire(4) on the hot key: %v, %+v, %v; want a permit from the store", whole, d, err)
	}
	held, err := store.DoPermit(context.Background(), "hot", lim, ratelimit.PermitRequest{Op: ratelimit.PermitInspect})
	if err != nil || held.InFlight != 4 {
		t.Fatalf("the store's count of the hot key: %+v, %v; want 4", held, err)
	}
	if err := whole.Release(ctx); err != nil {
		t.Fatal(err)
	}
	store.down.Store(true)
	p, d, err := l.TryAcquire(ctx, "hot", lim, 1)
	if err != nil || p == nil || !d.Degraded {
		t.Fatalf("TryAcquire with the store down: %v, %+v, %v; want the Open policy's degraded permit", p, d, err)
	}
	var names []string
	for _, s := range tel.decisionSpans() {
		names = append(names, s.Name())
	}
	if want := []string{"sluice Acquire", "sluice Release", "sluice Acquire"}; !slices.Equal(names, want) {
		t.Errorf("spans %v; want %v", names, want)
	}
	want := map[string]int64{attrs(sluiceotel.AttrKeyClass.String("anonymous")): 1}
	if got := inFlight(t, tel); !maps(got, want) {
		t.Errorf("%s = %v; want %v", sluiceotel.MetricPermitsInFlight, got, want)
	}
}
