package otel_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/lease"
	sluiceotel "github.com/sluicehq/sluice/otel"
	"github.com/sluicehq/sluice/ratelimit"
)

// LeaseMetrics reports a lease.Backend's Stats as they are at each
// collection, and nothing once stopped.
func TestLeaseMetrics(t *testing.T) {
	tel := newTelemetry(t)
	store := memory.New(memory.WithSweepInterval(0))
	t.Cleanup(func() { _ = store.Close() })
	leased, err := lease.New(store, lease.Keys("global"), lease.WithRefillTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = leased.Close() })
	stop := sluiceotel.LeaseMetrics(leased, tel.options()...)
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1000).WithBurst(1000)}}
	for range 100 {
		if d, err := leased.Do(context.Background(), "global", cfg, ratelimit.Request{Tokens: 1}); err != nil || !d.Allowed {
			t.Fatalf("Do = %+v, %v; want allowed", d, err)
		}
	}
	// A refill ahead of need may land at any time: each count collected
	// lies between Stats read before the collection and after it.
	before := leased.Stats()
	if before.Decisions != 100 || before.Refills == 0 || before.Spent != 100 || before.Keys != 1 {
		t.Fatalf("Stats = %+v; want 100 decisions and tokens spent, a refill, a key", before)
	}
	rm := tel.collect(t)
	after := leased.Stats()
	within := func(name string, got, lo, hi int64) {
		t.Helper()
		if got < lo || got > hi {
			t.Errorf("%s = %d; want %d to %d, Stats before and after the collection", name, got, lo, hi)
		}
	}
	one := func(name string, points map[string]int64, attrs string) int64 {
		t.Helper()
		if len(points) != 1 && attrs == "" {
			t.Errorf("%s = %v; want one point", name, points)
		}
		v, ok := points[attrs]
		if !ok {
			t.Errorf("%s has no point %q: %v", name, attrs, points)
		}
		return v
	}
	decisions := sums(t, rm, sluiceotel.MetricLeaseDecisions)
	within(sluiceotel.MetricLeaseDecisions, one(sluiceotel.MetricLeaseDecisions, decisions, ""), before.Decisions, after.Decisions)
	refills := sums(t, rm, sluiceotel.MetricLeaseRefills)
	within(sluiceotel.MetricLeaseRefills, one(sluiceotel.MetricLeaseRefills, refills, ""), before.Refills, after.Refills)
	tokens := sums(t, rm, sluiceotel.MetricLeaseTokens)
	if len(tokens) != 3 {
		t.Errorf("%s = %v; want leased, spent and lapsed", sluiceotel.MetricLeaseTokens, tokens)
	}
	within("leased tokens", one(sluiceotel.MetricLeaseTokens, tokens, "sluice.lease.token_state=leased"), before.Leased, after.Leased)
	within("spent tokens", one(sluiceotel.MetricLeaseTokens, tokens, "sluice.lease.token_state=spent"), before.Spent, after.Spent)
	within("lapsed tokens", one(sluiceotel.MetricLeaseTokens, tokens, "sluice.lease.token_state=lapsed"), before.Lapsed, after.Lapsed)
	if got := gauge(t, rm, sluiceotel.MetricLeaseKeys); !maps(got, map[string]int64{"": 1}) {
		t.Errorf("%s = %v; want 1", sluiceotel.MetricLeaseKeys, got)
	}

	if err := stop(); err != nil {
		t.Fatal(err)
	}
	rm = tel.collect(t)
	for _, name := range []string{sluiceotel.MetricLeaseDecisions, sluiceotel.MetricLeaseRefills, sluiceotel.MetricLeaseTokens} {
		if got := sums(t, rm, name); len(got) != 0 {
			t.Errorf("%s = %v after stop; want nothing reported", name, got)
		}
	}
	if got := gauge(t, rm, sluiceotel.MetricLeaseKeys); len(got) != 0 {
		t.Errorf("%s = %v after stop; want nothing reported", sluiceotel.MetricLeaseKeys, got)
	}
}
