package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/ratelimit"
)

// A demoPlan is one of the plans the demo starts with, and the subject on it.
type demoPlan struct {
	name    string
	subject string
	limit   limit
}

// A limit is the one bandwidth of a demo plan, as the control endpoint
// reads and writes it.
type limit struct {
	Algorithm    ratelimit.Algorithm
	Capacity     int64
	RefillTokens int64
	RefillPeriod time.Duration
}

// config is l as the plan's config; the bandwidth is named after the plan,
// so that the RateLimit-Policy header says which plan a response was
// limited by, and a revision keeps the bucket's tokens (bandwidths are
// matched by ID).
func (l limit) config(plan string) ratelimit.Config {
	return ratelimit.Config{
		Algorithm: l.Algorithm,
		Bandwidths: []ratelimit.Bandwidth{{
			ID:           plan,
			Capacity:     l.Capacity,
			RefillTokens: l.RefillTokens,
			RefillPeriod: l.RefillPeriod,
		}},
	}
}

// The demo's tenants, each on its own plan.
const (
	tenantFree = "acme"
	tenantPro  = "globex"
)

// demoPlans are the plans the demo starts with: a free tenant that a burst
// of 20 runs dry, a pro tenant it does not, and anonymous callers, each
// address with a small bucket of its own.
var demoPlans = []demoPlan{
	{"free", tenantFree, limit{ratelimit.TokenBucket, 10, 1, time.Second}},
	{"pro", tenantPro, limit{ratelimit.TokenBucket, 50, 10, time.Second}},
	{"anonymous", httplimit.AnonymousSubject, limit{ratelimit.TokenBucket, 5, 1, 3 * time.Second}},
}

// demoKeys are the API keys the demo's auth layer knows, as a real one
// would find them in its database: the key's secret, its ID and its tenant.
var demoKeys = map[string]httplimit.Caller{
	"demo-free": {Tenant: tenantFree, APIKey: "key-free-1"},
	"demo-pro":  {Tenant: tenantPro, APIKey: "key-pro-1"},
}

// revisionStore is the demo's plan store: a [plans.MemoryStore] that also
// numbers each plan's revisions, 1 for the plan as the demo starts, for
// the page. A plan's version does not count its revisions: one counter
// versions every plan and assignment, so that a subject's config version
// never goes back when it moves to another plan. The demo's plans start
// at versions 1, 3 and 5 (their subjects' assignments take 2, 4 and 6),
// and the first edit of any of them takes 7.
type revisionStore struct {
	*plans.MemoryStore
	// mu orders revisions as the store orders versions, and reads a
	// plan's revision with the plan.
	mu        sync.Mutex
	revisions map[string]uint64 // by plan name
}

// revise stores cfg as plan name's next revision, and returns the plan
// and its revision number. A plan the store rejects changes nothing.
func (s *revisionStore) revise(name string, cfg ratelimit.Config) (plans.Plan, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := s.PutPlan(name, cfg)
	if err != nil {
		return plans.Plan{}, 0, err
	}
	s.revisions[name]++
	return p, s.revisions[name], nil
}

// lookup returns subject's assignment, and the revision of its plan as
// the store holds it.
func (s *revisionStore) lookup(ctx context.Context, subject string) (plans.Assignment, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, err := s.Lookup(ctx, subject)
	if err != nil {
		return plans.Assignment{}, 0, err
	}
	return a, s.revisions[a.Plan.Name], nil
}

// newPlanStore returns a store holding the demo plans, each at revision 1
// with its subject assigned.
func newPlanStore() (*revisionStore, error) {
	store := &revisionStore{MemoryStore: new(plans.MemoryStore), revisions: make(map[string]uint64)}
	for _, p := range demoPlans {
		if _, _, err := store.revise(p.name, p.limit.config(p.name)); err != nil {
			return nil, fmt.Errorf("plan %q: %w", p.name, err)
		}
		if _, err := store.Assign(p.subject, p.name); err != nil {
			return nil, fmt.Errorf("plan %q: assign %q: %w", p.name, p.subject, err)
		}
	}
	return store, nil
}

// findPlan returns the demo plan named name.
func findPlan(name string) (demoPlan, bool) {
	for _, p := range demoPlans {
		if p.name == name {
			return p, true
		}
	}
	return demoPlan{}, false
}
