package plans

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/sluicehq/sluice/ratelimit"
)

// MemoryStore is a [Store] that keeps plans and assignments in memory, for
// tests, examples and services whose plans are fixed in code. Plan and
// assignment versions are drawn from one counter, as the contract of
// [Plan.Version] asks. The zero value is an empty store, ready to use. It is
// safe for concurrent use.
type MemoryStore struct {
	mu          sync.Mutex
	version     uint64               // the last version drawn
	plans       map[string]Plan      // by name
	assignments map[string]placement // by subject; unassigned subjects keep their version
	notify      Invalidator
}

var _ Store = (*MemoryStore)(nil)

// placement is one subject's assignment: the plan's name ("" for none) and
// the version of the assignment.
type placement struct {
	plan    string
	version uint64
}

// Notify makes the store tell inv (a [Cache]) about every later change, as
// a database's change feed would. A nil inv stops the notifications.
// Notifications are sent after the change, outside the store's lock, so
// concurrent changes may be told out of order.
func (s *MemoryStore) Notify(inv Invalidator) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notify = inv
}

// PutPlan creates plan name, or revises it, with the algorithm and
// bandwidths of cfg (not its Version: the store draws its own) at the next
// version, and returns it. A plan that [Plan.Validate] rejects is an
// error, and changes nothing. The store keeps a copy of cfg.Bandwidths.
func (s *MemoryStore) PutPlan(name string, cfg ratelimit.Config) (Plan, error) {
	s.mu.Lock()
	p := Plan{Name: name, Version: s.version + 1, Algorithm: cfg.Algorithm, Bandwidths: slices.Clone(cfg.Bandwidths)}
	if err := p.Validate(); err != nil {
		s.mu.Unlock()
		return Plan{}, err
	}
	s.version = p.Version
	if s.plans == nil {
		s.plans = make(map[string]Plan)
	}
	s.plans[name] = p
	inv := s.notify
	s.mu.Unlock()

	if inv != nil {
		inv.Invalidate(Change{Kind: PlanChanged, ID: name, Version: p.Version})
	}
	return p, nil
}

// Assign puts subject on plan, at the next version, and returns that
// version. plan "" takes the subject off its plan. A plan the store does
// not hold is an error, and changes nothing.
func (s *MemoryStore) Assign(subject, plan string) (uint64, error) {
	s.mu.Lock()
	if _, ok := s.plans[plan]; !ok && plan != "" {
		s.mu.Unlock()
		return 0, fmt.Errorf("plans: MemoryStore.Assign: subject %q: no plan %q", subject, plan)
	}
	s.version++
	v := s.version
	if s.assignments == nil {
		s.assignments = make(map[string]placement)
	}
	s.assignments[subject] = placement{plan: plan, version: v}
	inv := s.notify
	s.mu.Unlock()

	if inv != nil {
		inv.Invalidate(Change{Kind: AssignmentChanged, ID: subject, Version: v})
	}
	return v, nil
}

// Lookup returns subject's assignment with its plan as it is now. The
// plan's Bandwidths are shared with the store: callers must not modify
// them.
func (s *MemoryStore) Lookup(ctx context.Context, subject string) (Assignment, error) {
	if err := ctx.Err(); err != nil {
		return Assignment{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pl := s.assignments[subject]
	a := Assignment{Subject: subject, Version: pl.version}
	if pl.plan != "" {
		a.Plan = s.plans[pl.plan]
	}
	return a, nil
}
