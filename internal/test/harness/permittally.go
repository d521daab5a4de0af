package harness

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// PermitTally is what the calls of a permits run add up to, and the
// calls whose decision breaks the limit.
type PermitTally struct {
	Calls int
	// Acquires are the acquires of a new permit that the store decided:
	// Granted and Denied. Reacquires are those of a permit held already.
	Acquires, Granted, Denied, Reacquires int
	// Releases are the releases the store decided; Released, those it
	// granted.
	Releases, Released int
	Inspects           int
	// Degraded are the calls a fail policy decided instead of the store:
	// their decisions are not the store's, and are not checked.
	Degraded int
	// Failed are the calls that returned an error; Unknown, those of them
	// whose outcome is unknown ([Call.Unknown]).
	Failed, Unknown int
	// MaxOverlap is the overlap counter's highest value.
	MaxOverlap int64
	// Violations are the calls whose decision breaks the limit (see
	// [CountPermits]); Errors say why, for the first few.
	Violations int
	Errors     []string
	// First and Last are the earliest start and the latest end, in ns.
	First, Last int64
}

// maxPermitErrors is how many violations a PermitTally describes.
const maxPermitErrors = 5

// CountPermits adds up the calls of a permits run under lim, and checks
// each decision the store made (not a fail policy) against what it says
// of itself: that it
// was made under lim.Limit; that it counts between 0 and the Limit in
// flight; that an acquire granted counts its own weight, and one denied
// had no room for it, with a RetryAfter of more than 0 and at most the
// Lease; that no other decision has a RetryAfter; that an inspect is
// granted exactly when there is room for one more; and that the overlap
// counter never went past the Limit.
func CountPermits(calls []Call, lim ratelimit.Concurrency) PermitTally {
	var n PermitTally
	for _, c := range calls {
		if n.Calls == 0 || c.Start < n.First {
			n.First = c.Start
		}
		n.Last = max(n.Last, c.End)
		n.Calls++
		p := c.Permit
		if p == nil {
			n.violation(c, "not a permit call")
			continue
		}
		n.MaxOverlap = max(n.MaxOverlap, p.Overlap)
		if p.Overlap > lim.Limit {
			n.violation(c, fmt.Sprintf("the overlap counter reached %d, over the limit of %d", p.Overlap, lim.Limit))
		}
		switch {
		case c.Err != "":
			n.Failed++
			if c.Unknown() {
				n.Unknown++
			}
		case p.Decision.Degraded:
			n.Degraded++
		default:
			n.add(c, lim)
		}
	}
	return n
}

// add counts the decided call c, and checks its decision under lim.
func (n *PermitTally) add(c Call, lim ratelimit.Concurrency) {
	req, d := c.Permit.Request, c.Permit.Decision
	if d.Limit != lim.Limit || d.InFlight < 0 || d.InFlight > lim.Limit {
		n.violation(c, fmt.Sprintf("%d in flight of a limit of %d; want 0 to %d", d.InFlight, d.Limit, lim.Limit))
	}
	retry := time.Duration(0)
	switch {
	case req.Op == ratelimit.PermitAcquire && c.Permit.Reacquire:
		n.Reacquires++
	case req.Op == ratelimit.PermitAcquire:
		n.Acquires++
		if !d.Granted {
			n.Denied++
			retry = d.RetryAfter
			if d.InFlight+req.Weight <= lim.Limit {
				n.violation(c, fmt.Sprintf("denied with %d in flight: room for its weight of %d", d.InFlight, req.Weight))
			}
			if d.RetryAfter <= 0 || d.RetryAfter > lim.Lease {
				n.violation(c, fmt.Sprintf("denied with a RetryAfter of %v; want more than 0 and at most the lease, %v", d.RetryAfter, lim.Lease))
			}
			break
		}
		n.Granted++
		if d.InFlight < req.Weight {
			n.violation(c, fmt.Sprintf("granted with %d in flight, less than its own weight of %d", d.InFlight, req.Weight))
		}
	case req.Op == ratelimit.PermitRelease:
		n.Releases++
		if d.Granted {
			n.Released++
		}
	case req.Op == ratelimit.PermitInspect:
		n.Inspects++
		if d.Granted != (d.InFlight < lim.Limit) {
			n.violation(c, fmt.Sprintf("inspect granted %t with %d of %d in flight", d.Granted, d.InFlight, lim.Limit))
		}
	}
	if d.RetryAfter != retry {
		n.violation(c, fmt.Sprintf("a RetryAfter of %v; want it only on a denied acquire", d.RetryAfter))
	}
}

// violation records that call c broke the limit, as why says.
func (n *PermitTally) violation(c Call, why string) {
	n.Violations++
	if len(n.Errors) < maxPermitErrors {
		n.Errors = append(n.Errors, fmt.Sprintf("instance %d, attempt %d, %s: %s", c.Instance, c.Attempt, describePermitCall(c), why))
	}
}

// describePermitCall says what call c asked and got.
func describePermitCall(c Call) string {
	if c.Permit == nil {
		return "a call on a bucket"
	}
	req, d := c.Permit.Request, c.Permit.Decision
	return fmt.Sprintf("%v(%s, %d) -> granted %t, %d in flight, retry after %v", req.Op, req.Holder, req.Weight, d.Granted, d.InFlight, d.RetryAfter)
}

// Check returns an error describing the first few violations, if there
// are any.
func (n PermitTally) Check() error {
	if n.Violations == 0 {
		return nil
	}
	errs := make([]error, 0, len(n.Errors)+1)
	errs = append(errs, fmt.Errorf("%d calls of %d break the limit", n.Violations, n.Calls))
	for _, e := range n.Errors {
		errs = append(errs, errors.New(e))
	}
	return errors.Join(errs...)
}

// Span is the time from the first call's start to the last one's end.
func (n PermitTally) Span() time.Duration { return time.Duration(n.Last - n.First) }
