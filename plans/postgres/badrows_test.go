package postgres

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/plans"
)

// TestBadRowKeepsLastGood writes each kind of bad row over a good plan by
// hand, as a mistaken UPDATE would, under a cache with a listener: the
// notification makes the cache read the row again, the read fails naming
// the plan, its version and the field (reported to Hooks.StaleServed), and
// the cache keeps serving the last good version of the plan.
func TestBadRowKeepsLastGood(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	good := putPlan(t, s, proPlan())
	assign(t, s, "c1", "pro")
	var mu sync.Mutex
	var failures []error
	// The first lookup checks the plan it gets: it waits for its read,
	// however slowly a busy machine runs it.
	cache, err := plans.NewCache(s, plans.WithRetryBackoff(time.Millisecond), plans.WithReadWait(time.Minute), plans.WithHooks(plans.Hooks{
		StaleServed: func(_ string, err error) { mu.Lock(); failures = append(failures, err); mu.Unlock() },
	}))
	if err != nil {
		t.Fatal(err)
	}
	w := newWatch()
	listen(t, s, &tee{cache, w}, WithApplicationName(appName()))
	w.waitCount(t, "resync", 1)
	ctx := context.Background()
	serve := func() int64 {
		t.Helper()
		cfg, err := cache.Config(ctx, "c1")
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Bandwidths[0].Capacity
	}
	if got := serve(); got != 100 {
		t.Fatalf("capacity %d, want pro's 100", got)
	}
	for _, bad := range []struct{ name, algorithm, bandwidths, field string }{
		{"negative capacity", "TokenBucket", `[{"capacity":-5,"refill_tokens":10,"refill_period":"1s"}]`, "Bandwidths[0].Capacity"},
		{"zero period", "TokenBucket", `[{"capacity":10,"refill_tokens":10,"refill_period":"0s"}]`, "Bandwidths[0].RefillPeriod"},
		{"unknown algorithm", "Magic", `[{"capacity":10,"refill_tokens":10,"refill_period":"1s"}]`, "Algorithm"},
		{"malformed bandwidth list", "TokenBucket", `{"capacity":10}`, "bandwidths"},
		{"string capacity", "TokenBucket", `[{"capacity":"10","refill_tokens":10,"refill_period":"1s"}]`, "bandwidths[0].capacity"},
	} {
		mu.Lock()
		failures = nil
		mu.Unlock()
		var version int64
		if err := pool.QueryRow(ctx, "UPDATE sluice.plans SET algorithm = $1, bandwidths = $2::jsonb WHERE name = 'pro' RETURNING version",
			bad.algorithm, bad.bandwidths).Scan(&version); err != nil {
			t.Fatal(err)
		}
		w.waitChange(t, plans.Change{Kind: plans.PlanChanged, ID: "pro", Version: uint64(version)})
		var got error
		deadline := time.Now().Add(waitTimeout)
		for got == nil {
			if c := serve(); c != 100 {
				t.Fatalf("%s: capacity %d, want the last good pro's 100", bad.name, c)
			}
			mu.Lock()
			if len(failures) > 0 {
				got = failures[0]
			}
			mu.Unlock()
			if time.Now().After(deadline) {
				t.Fatalf("%s: no StaleServed within %v", bad.name, waitTimeout)
			}
		}
		t.Logf("%s: %v", bad.name, got)
		if !errors.Is(got, plans.ErrInvalidPlan) || !strings.Contains(got.Error(), `plan "pro" version `) || !strings.Contains(got.Error(), bad.field) {
			t.Errorf("%s: StaleServed(%v), want an ErrInvalidPlan naming plan \"pro\", its version and %s", bad.name, got, bad.field)
		}
	}
	good = putPlan(t, s, good)
	w.waitChange(t, plans.Change{Kind: plans.PlanChanged, ID: "pro", Version: good.Version})
	deadline := time.Now().Add(waitTimeout)
	for {
		cfg, err := cache.Config(ctx, "c1")
		if err == nil && cfg.Version == good.Version {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the repaired plan, version %d, never served: %+v, %v", good.Version, cfg, err)
		}
	}
}

// tee passes a listener's calls to two Invalidators.
type tee struct{ a, b plans.Invalidator }

func (t *tee) Invalidate(c plans.Change) { t.a.Invalidate(c); t.b.Invalidate(c) }
func (t *tee) Resync()                   { t.a.Resync(); t.b.Resync() }
