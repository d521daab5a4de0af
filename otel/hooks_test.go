package otel_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/lease"
	sluiceotel "github.com/sluicehq/sluice/otel"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/sharding"
)

// movingClock is a clock a test moves.
type movingClock struct{ ns atomic.Int64 }

func (c *movingClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *movingClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// switchable is a store on one node that is down until up is set.
type switchable struct {
	up   atomic.Bool
	node string
}

func (s *switchable) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if !s.up.Load() {
		return down{}.Do(ctx, key, cfg, req)
	}
	return ratelimit.Decision{Allowed: true, Limit: 2, Remaining: 1}, nil
}

func (s *switchable) Node(string) string { return s.node }

// The fail policy's degraded decisions are counted by cause, and its
// breakers' states follow them: open after the failures, half-open while
// the probe is out, neither once it answers.
func TestFailPolicyHooks(t *testing.T) {
	for _, node := range []string{"", "10.0.0.7:6379"} {
		t.Run("node="+node, func(t *testing.T) {
			tel := newTelemetry(t)
			clock := &movingClock{}
			store := &switchable{node: node}
			var probing atomic.Bool
			var seen []string // the breaker states seen while the probe was out
			hooks := sluiceotel.FailPolicyHooks(sluiceotel.WithMeterProvider(tel.mp))
			changed := hooks.BreakerChanged
			hooks.BreakerChanged = func(n string, from, to failpolicy.BreakerState) {
				changed(n, from, to)
				if to == failpolicy.BreakerHalfOpen {
					probing.Store(true)
				}
			}
			var next ratelimit.Backend = store
			if node == "" {
				next = noNode{store}
			}
			policy, err := failpolicy.Wrap(probeWatcher{next, &probing, func() {
				seen = append(seen, breakerState(t, tel, node))
			}}, failpolicy.Closed, failpolicy.WithBreaker(2, time.Second), failpolicy.WithClock(clock), failpolicy.WithHooks(hooks))
			if err != nil {
				t.Fatal(err)
			}
			defer policy.Close()
			consume := func() ratelimit.Decision {
				t.Helper()
				d, err := policy.Do(context.Background(), "k", hourly(), ratelimit.Request{Op: ratelimit.Consume, Tokens: 1})
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			for range 3 {
				if d := consume(); !d.Degraded || d.Allowed {
					t.Fatalf("decision %+v; want a Closed mode denial", d)
				}
			}
			address := func(kv ...string) []string {
				if node != "" {
					kv = append([]string{"server.address=" + node}, kv...)
				}
				return kv
			}
			wantDegraded := map[string]int64{
				"error.type=backend_unavailable,sluice.rate_limit.fail_mode=Closed": 2,
				"error.type=breaker_open,sluice.rate_limit.fail_mode=Closed":        1,
			}
			rm := tel.collect(t)
			if got := sums(t, rm, sluiceotel.MetricDegraded); !maps(got, wantDegraded) {
				t.Errorf("%s = %v; want %v", sluiceotel.MetricDegraded, got, wantDegraded)
			}
			wantOpen := map[string]int64{join(address("sluice.rate_limit.breaker.state=open")): 1}
			if got := sums(t, rm, sluiceotel.MetricBreakers); !maps(got, wantOpen) {
				t.Errorf("%s while open = %v; want %v", sluiceotel.MetricBreakers, got, wantOpen)
			}

			store.up.Store(true)
			clock.advance(time.Second)
			if d := consume(); d.Degraded || !d.Allowed {
				t.Fatalf("probe decision %+v; want the store's", d)
			}
			if len(seen) != 1 || seen[0] != "half_open" {
				t.Errorf("breaker states seen during the probe: %v; want [half_open]", seen)
			}
			wantClosed := map[string]int64{
				join(address("sluice.rate_limit.breaker.state=open")):      0,
				join(address("sluice.rate_limit.breaker.state=half_open")): 0,
			}
			if got := sums(t, tel.collect(t), sluiceotel.MetricBreakers); !maps(got, wantClosed) {
				t.Errorf("%s once closed = %v; want %v", sluiceotel.MetricBreakers, got, wantClosed)
			}
		})
	}
}

// noNode hides a store's Node.
type noNode struct{ next ratelimit.Backend }

func (n noNode) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	return n.next.Do(ctx, key, cfg, req)
}

// probeWatcher calls watch on a call made while probing is set: the
// probe's, in the store.
type probeWatcher struct {
	next    ratelimit.Backend
	probing *atomic.Bool
	watch   func()
}

func (p probeWatcher) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if p.probing.Load() {
		p.watch()
	}
	return p.next.Do(ctx, key, cfg, req)
}

func (p probeWatcher) Node(key string) string {
	if l, ok := p.next.(ratelimit.NodeLocator); ok {
		return l.Node(key)
	}
	return ""
}

// breakerState returns the state the breakers metric shows node's breaker
// in: "open", "half_open" or "closed".
func breakerState(t *testing.T, tel *telemetry, node string) string {
	t.Helper()
	got := sums(t, tel.collect(t), sluiceotel.MetricBreakers)
	for _, state := range []string{"open", "half_open"} {
		k := "sluice.rate_limit.breaker.state=" + state
		if node != "" {
			k = "server.address=" + node + "," + k
		}
		if got[k] == 1 {
			return state
		}
	}
	return "closed"
}

func join(kv []string) string { return strings.Join(kv, ",") }

// A sharded request's moves to another sub-bucket are counted by reason;
// a request its first sub-bucket decides is not.
func TestShardingHooks(t *testing.T) {
	tel := newTelemetry(t)
	first := func(context.Context, string) uint64 { return 0 }
	split, err := sharding.New(newMemory(t),
		sharding.Keys(2, "hot").WithAffinity(first),
		sharding.WithHooks(sluiceotel.ShardingHooks(sluiceotel.WithMeterProvider(tel.mp))))
	if err != nil {
		t.Fatal(err)
	}
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(2)}} // a token a sub-bucket
	for i, want := range []bool{true, true, false} {
		d, err := split.Do(context.Background(), "hot", cfg, ratelimit.Request{Op: ratelimit.Consume, Tokens: 1})
		if err != nil || d.Allowed != want {
			t.Fatalf("Consume %d = %+v, %v; want allowed %v", i, d, err, want)
		}
	}
	want := map[string]int64{"sluice.sharding.reason=rejected": 2}
	if got := sums(t, tel.collect(t), sluiceotel.MetricShardRetries); !maps(got, want) {
		t.Errorf("%s = %v; want %v", sluiceotel.MetricShardRetries, got, want)
	}
}

// An instrument the meter cannot make goes to otel.Handle, and Wrap and
// the hooks still work.
func TestInstrumentErrorsAreHandled(t *testing.T) {
	handled := installErrorHandler(t)
	mp := failingMeterProvider{}
	b := sluiceotel.Wrap(newMemory(t), sluiceotel.WithMeterProvider(mp))
	if d, err := b.Do(context.Background(), "k", hourly(), ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}); err != nil || !d.Allowed {
		t.Fatalf("Do = %+v, %v; want allowed", d, err)
	}
	acquire := ratelimit.PermitRequest{Op: ratelimit.PermitAcquire, Holder: "h", Weight: 1}
	if d, err := b.DoPermit(context.Background(), "k", ratelimit.InFlight(1, time.Minute), acquire); err != nil || !d.Granted {
		t.Fatalf("DoPermit = %+v, %v; want granted", d, err)
	}
	fp := sluiceotel.FailPolicyHooks(sluiceotel.WithMeterProvider(mp))
	fp.Degraded(context.Background(), "k", failpolicy.Open, errors.New("x"))
	fp.BreakerChanged("", failpolicy.BreakerClosed, failpolicy.BreakerOpen)
	sh := sluiceotel.ShardingHooks(sluiceotel.WithMeterProvider(mp))
	sh.Retried(context.Background(), "k", sharding.RetryFailed)
	ph := sluiceotel.PlanHooks(sluiceotel.WithMeterProvider(mp))
	ph.Hit("s")
	ph.LoadFailed("s", errors.New("x"))
	leased, err := lease.New(newMemory(t), lease.Keys("k"))
	if err != nil {
		t.Fatal(err)
	}
	defer leased.Close()
	if err := sluiceotel.LeaseMetrics(leased, sluiceotel.WithMeterProvider(mp))(); err != nil {
		t.Errorf("LeaseMetrics' stop: %v", err)
	}
	// Wrap: decisions, duration, rejected keys, permit decisions, permits
	// in flight, permit duration; fail policy: 2; sharding: 1; plans: 2;
	// leases: 4.
	if n := handled.Load(); n != 15 {
		t.Errorf("otel.Handle got %d errors; want 15", n)
	}
}

// installErrorHandler counts what otel.Handle gets until the test ends.
func installErrorHandler(t *testing.T) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	prev := otel.GetErrorHandler()
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(error) { n.Add(1) }))
	t.Cleanup(func() { otel.SetErrorHandler(prev) })
	return &n
}

// failingMeterProvider's meter cannot make any instrument.
type failingMeterProvider struct{ metricnoop.MeterProvider }

func (failingMeterProvider) Meter(string, ...metric.MeterOption) metric.Meter { return failingMeter{} }

type failingMeter struct{ metricnoop.Meter }

var errNoInstrument = errors.New("test: no instrument")

func (failingMeter) Int64Counter(string, ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return nil, errNoInstrument
}

func (failingMeter) Int64UpDownCounter(string, ...metric.Int64UpDownCounterOption) (metric.Int64UpDownCounter, error) {
	return nil, errNoInstrument
}

func (failingMeter) Float64Histogram(string, ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	return nil, errNoInstrument
}

func (failingMeter) Int64ObservableGauge(string, ...metric.Int64ObservableGaugeOption) (metric.Int64ObservableGauge, error) {
	return nil, errNoInstrument
}

func (failingMeter) Int64ObservableCounter(string, ...metric.Int64ObservableCounterOption) (metric.Int64ObservableCounter, error) {
	return nil, errNoInstrument
}

// planStore serves the plans of a MemoryStore, or fails while broken.
type planStore struct {
	plans.MemoryStore
	broken atomic.Bool
}

func (s *planStore) Lookup(ctx context.Context, subject string) (plans.Assignment, error) {
	if s.broken.Load() {
		return plans.Assignment{}, fmt.Errorf("%w: plan row for %q", plans.ErrInvalidPlan, subject)
	}
	return s.MemoryStore.Lookup(ctx, subject)
}

// The plan cache's lookups are counted as hits and misses, and its reads
// by result; the subject is in neither.
func TestPlanHooks(t *testing.T) {
	tel := newTelemetry(t)
	store := &planStore{}
	if _, err := store.PutPlan("pro", hourly()); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Assign(secretKey, "pro"); err != nil {
		t.Fatal(err)
	}
	cache, err := plans.NewCache(store, plans.WithHooks(sluiceotel.PlanHooks(sluiceotel.WithMeterProvider(tel.mp))), plans.WithRetryBackoff(time.Hour), plans.WithReadWait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 3 {
		if _, err := cache.Lookup(ctx, secretKey); err != nil {
			t.Fatal(err)
		}
	}
	cache.Invalidate(plans.Change{Kind: plans.AssignmentChanged, ID: secretKey, Version: 1 << 40})
	store.broken.Store(true)
	for _, subject := range []string{secretKey, secretKey, "cust-new"} {
		if _, err := cache.Lookup(ctx, subject); err != nil {
			t.Fatal(err)
		}
	}
	rm := tel.collect(t)
	wantLookups := map[string]int64{"sluice.plan_cache.result=hit": 3, "sluice.plan_cache.result=miss": 3}
	if got := sums(t, rm, sluiceotel.MetricPlanLookups); !maps(got, wantLookups) {
		t.Errorf("%s = %v; want %v", sluiceotel.MetricPlanLookups, got, wantLookups)
	}
	wantLoads := map[string]int64{
		"sluice.plan_cache.result=loaded":                               1,
		"error.type=invalid_plan,sluice.plan_cache.result=stale_served": 1,
		"error.type=invalid_plan,sluice.plan_cache.result=failed":       1,
	}
	if got := sums(t, rm, sluiceotel.MetricPlanLoads); !maps(got, wantLoads) {
		t.Errorf("%s = %v; want %v", sluiceotel.MetricPlanLoads, got, wantLoads)
	}
	noRawKey(t, tel, rm, secretKey)
}
