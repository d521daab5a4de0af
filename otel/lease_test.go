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
	st := leased.Stats()
	if st.Decisions != 100 || st.Refills == 0 || st.Spent != 100 || st.Keys != 1 {
		t.Fatalf("Stats = %+v; want 100 decisions and tokens spent, a refill, a key", st)
	}
	rm := tel.collect(t)
	want := map[string]map[string]int64{
		sluiceotel.MetricLeaseDecisions: {"": st.Decisions},
		sluiceotel.MetricLeaseRefills:   {"": st.Refills},
		sluiceotel.MetricLeaseTokens: {
			"sluice.lease.token_state=leased": st.Leased,
			"sluice.lease.token_state=spent":  st.Spent,
			"sluice.lease.token_state=lapsed": st.Lapsed,
		},
	}
	for name, w := range want {
		if got := sums(t, rm, name); !maps(got, w) {
			t.Errorf("%s = %v; want %v", name, got, w)
		}
	}
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
