// Package plans makes per-customer limits data: a [Plan] is a named,
// versioned [ratelimit.Config], a [Store] says which plan a subject (a
// tenant or an API key's ID) is on, and a [Cache] in front of the store
// supplies each request's config with no I/O on the hot path.
//
// It sits between ratelimit and the stores: plans/postgres reads plans
// from Postgres and feeds its LISTEN/NOTIFY changes to a Cache as an
// [Invalidator]; [MemoryStore] holds them in memory. A Limiter's bucket
// gets its config from [Cache.Supplier], so a plan change is a database
// update that applies on the next request.
//
// # Stored form
//
// A store keeps a plan as a name, a version, an algorithm by its Go name
// ("TokenBucket", "GCRA", ...; see [ParseAlgorithm]) and its bandwidths as
// a JSON array (a Postgres jsonb column), one object per bandwidth:
//
//	[{"id":"burst","capacity":100,"refill_tokens":100,"refill_period":"1m",
//	  "refill":"Greedy","initial_tokens":50},
//	 {"id":"daily","capacity":10000,"refill_tokens":10000,"refill_period":"24h",
//	  "refill":"IntervalAligned","aligned_start":"2026-01-01T00:00:00Z"}]
//
// capacity, refill_tokens and refill_period are required; id, refill
// (default "Greedy"), initial_tokens (default: capacity) and aligned_start
// are optional, and null stands for absent. Numbers are integers;
// refill_period is a Go duration string ("1m", "1h30m", "250ms");
// aligned_start is an RFC 3339 time. Fields map to those of
// [ratelimit.Bandwidth]. [ParseBandwidths] rejects anything else: unknown
// or repeated fields, other types, trailing data. [MarshalBandwidths]
// writes the form, [PlanFromRow] reads a whole row.
//
// # Errors
//
// A plan that is not valid, as read or as built, is an error wrapping
// [ErrInvalidPlan] that names the plan, its version and the field:
//
//	plans: invalid plan: plan "pro" version 7: Bandwidths[0].Capacity must be between 1 and 2^50, got -5
//
// A [Cache] never returns store errors: it serves the last good plan, or
// its default plan, and reports the error through its [Hooks].
package plans

import (
	"context"

	"github.com/sluicehq/sluice/ratelimit"
)

// Plan is a named set of limits at one version.
type Plan struct {
	// Name identifies the plan ("free", "pro").
	Name string
	// Version orders the plan's revisions: a later revision has a higher
	// version. A store draws plan and assignment versions from one
	// increasing sequence, in the order the changes take effect, so that a
	// subject's config version (see [Assignment.ConfigVersion]) never
	// decreases, whether its plan is edited or it moves to another plan,
	// and names one config (see [Store]).
	Version uint64
	// Algorithm and Bandwidths are the limits, as in [ratelimit.Config].
	Algorithm  ratelimit.Algorithm
	Bandwidths []ratelimit.Bandwidth
}

// Assignment is what a [Store] reads for one subject: the plan it is on.
type Assignment struct {
	// Subject is the tenant or API key the assignment is for.
	Subject string
	// Version is the assignment's version, from the same sequence as plan
	// versions; 0 for a subject that was never assigned.
	Version uint64
	// Plan is the assigned plan; its Name is "" when the subject has none
	// (never assigned, or unassigned), and the cache then supplies its
	// default plan.
	Plan Plan
}

// ConfigVersion is the version of the config the subject's bucket is
// built from: the later of the assignment's and the plan's.
func (a Assignment) ConfigVersion() uint64 { return max(a.Version, a.Plan.Version) }

// Config is the config of a's plan at a's ConfigVersion: what a bucket
// limited by this assignment is decided on ([Cache.Config] returns it).
func (a Assignment) Config() ratelimit.Config {
	p := a.Plan
	p.Version = a.ConfigVersion()
	return p.Config()
}

// Store reads plans. Implementations must be safe for concurrent use, and
// must version changes in the order they take effect: a Lookup that
// returns config version V (see [Assignment.ConfigVersion]) sees every
// change versioned below V, so that two lookups returning one config
// version return one plan, on any replica. A bucket changes forward only,
// by version; two configs at one version would convert it back and forth.
type Store interface {
	// Lookup returns subject's assignment and its plan, in one read. A
	// subject with no plan is not an error: it is an Assignment whose
	// Plan.Name is "". A plan row that is not a valid plan is an error
	// wrapping [ErrInvalidPlan] naming the plan, its version and the field.
	// Lookup should return when ctx ends: a [Cache] bounds each read with
	// [WithLoadTimeout].
	Lookup(ctx context.Context, subject string) (Assignment, error)
}

// ChangeKind says what a [Change] changed.
type ChangeKind uint8

const (
	// PlanChanged: the plan named ID is now at Version.
	PlanChanged ChangeKind = iota + 1
	// AssignmentChanged: the subject ID's assignment is now at Version.
	AssignmentChanged
)

// Change is one notification that a plan or an assignment changed.
type Change struct {
	// Kind says whether a plan or an assignment changed.
	Kind ChangeKind
	// ID is the plan's name, or the assignment's subject.
	ID string
	// Version is the plan's or the assignment's version after the change.
	Version uint64
}

// Invalidator is what a store's change feed (plans/postgres's listener)
// tells about changes; [Cache] implements it.
type Invalidator interface {
	// Invalidate makes entries older than c refresh at their next use.
	// Duplicate and out-of-order changes are harmless.
	Invalidate(c Change)
	// Resync makes every entry refresh at its next use, still serving it
	// if the refresh fails: changes may have been missed.
	Resync()
}
