package plans

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/ratelimit"
)

// changeLog is an Invalidator that records what it is told.
type changeLog struct {
	mu      sync.Mutex
	changes []Change
	resyncs int
}

func (l *changeLog) Invalidate(c Change) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.changes = append(l.changes, c)
}

func (l *changeLog) Resync() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.resyncs++
}

func perMinute(n int64) ratelimit.Config {
	return ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(n)}}
}

func TestMemoryStore(t *testing.T) {
	var s MemoryStore
	var log changeLog
	s.Notify(&log)
	ctx := t.Context()

	if a, err := s.Lookup(ctx, "acme"); err != nil || a.Subject != "acme" || a.Version != 0 || a.Plan.Name != "" {
		t.Errorf("Lookup of an empty store = %+v, %v; want acme with no plan at version 0", a, err)
	}
	cfg := perMinute(100)
	pro, err := s.PutPlan("pro", cfg)
	if err != nil || pro.Name != "pro" || pro.Version != 1 {
		t.Fatalf("PutPlan(pro) = %+v, %v; want pro v1", pro, err)
	}
	cfg.Bandwidths[0].Capacity = 1 // the store keeps its own copy
	if _, err := s.PutPlan("bad", perMinute(0)); !errors.Is(err, ErrInvalidPlan) {
		t.Errorf("PutPlan of an invalid plan: %v, want an ErrInvalidPlan", err)
	}
	if _, err := s.Assign("acme", "gold"); err == nil || err.Error() != `plans: MemoryStore.Assign: subject "acme": no plan "gold"` {
		t.Errorf("Assign to a missing plan: %v", err)
	}
	if v, err := s.Assign("acme", "pro"); err != nil || v != 2 {
		t.Errorf("Assign(acme, pro) = %d, %v; want version 2", v, err)
	}
	a, err := s.Lookup(ctx, "acme")
	if err != nil || a.Version != 2 || a.Plan.Name != "pro" || a.Plan.Version != 1 || a.Plan.Bandwidths[0].Capacity != 100 {
		t.Errorf("Lookup(acme) = %+v, %v; want pro v1 of 100, assignment v2", a, err)
	}
	if _, err := s.PutPlan("pro", perMinute(200)); err != nil {
		t.Fatal(err)
	}
	if a, _ := s.Lookup(ctx, "acme"); a.Plan.Version != 3 || a.Plan.Bandwidths[0].Capacity != 200 || a.ConfigVersion() != 3 {
		t.Errorf("Lookup(acme) after the plan changed = %+v, want pro v3 of 200", a)
	}
	if v, _ := s.Assign("acme", ""); v != 4 {
		t.Errorf("Assign(acme, \"\") = %d, want version 4", v)
	}
	if a, _ := s.Lookup(ctx, "acme"); a.Version != 4 || a.Plan.Name != "" || a.Plan.Bandwidths != nil {
		t.Errorf("Lookup(acme) after unassigning = %+v, want no plan at version 4", a)
	}
	want := []Change{
		{Kind: PlanChanged, ID: "pro", Version: 1},
		{Kind: AssignmentChanged, ID: "acme", Version: 2},
		{Kind: PlanChanged, ID: "pro", Version: 3},
		{Kind: AssignmentChanged, ID: "acme", Version: 4},
	}
	if !slices.Equal(log.changes, want) {
		t.Errorf("notified %+v, want %+v", log.changes, want)
	}

	s.Notify(nil)
	if _, err := s.Assign("acme", "pro"); err != nil || len(log.changes) != len(want) {
		t.Errorf("notified after Notify(nil): %+v", log.changes)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Lookup(cancelled, "acme"); !errors.Is(err, context.Canceled) {
		t.Errorf("Lookup(cancelled ctx) = %v, want context.Canceled", err)
	}
}

func TestMemoryStoreConcurrent(t *testing.T) {
	var s MemoryStore
	c := mustCache(t, &s)
	s.Notify(c)
	if _, err := s.PutPlan("pro", perMinute(100)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 100 {
				subject := fmt.Sprint("s", j%10)
				switch i % 3 {
				case 0:
					if _, err := s.Assign(subject, "pro"); err != nil {
						t.Error(err)
					}
				case 1:
					if _, err := s.PutPlan("pro", perMinute(int64(j+1))); err != nil {
						t.Error(err)
					}
				default:
					if _, err := c.Config(t.Context(), subject); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	// Every change drew its own version: the first plan, 300 assignments,
	// 300 plan revisions, and this one.
	const want = 1 + 300 + 300 + 1
	if v, err := s.Assign("last", "pro"); err != nil || v != want {
		t.Errorf("last version = %d, %v; want %d", v, err, want)
	}
}
