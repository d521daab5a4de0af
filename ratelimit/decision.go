package ratelimit

import "time"

// Decision is the outcome of one request.
type Decision struct {
	// Allowed reports whether the request passed. For Estimate it says
	// whether Consume would pass, for Inspect whether one token is available.
	Allowed bool
	// Degraded reports that a fail policy decided, not the store.
	Degraded bool
	// Limit is the capacity of the binding bandwidth.
	Limit int64
	// Remaining is the whole tokens left in the binding bandwidth after this
	// request; 0 while the bandwidth is reserved ahead.
	Remaining int64
	// Consumed is the tokens this request took: Tokens for an allowed Consume
	// or Reserve, the count taken by ConsumeUpTo, 0 otherwise.
	Consumed int64
	// RetryAfter is, when not allowed, the time until the request could
	// pass; it is exact to the microsecond and never rounded down. For an
	// allowed Reserve it is the time to wait before using the tokens;
	// otherwise 0.
	RetryAfter time.Duration
	// ResetAfter is the time until every bandwidth is full again.
	ResetAfter time.Duration
	// RefillAfter is the time until the binding bandwidth holds more than
	// Remaining whole tokens, if nothing is taken meanwhile: when its next
	// token arrives, or, for the window algorithms, when the next request
	// it counts leaves its window. It is 0 when that bandwidth is full or
	// the decision names none, and otherwise exact to the microsecond,
	// never rounded down. For a denial of one token it is RetryAfter.
	RefillAfter time.Duration
	// Bandwidth is the ID of the binding bandwidth, or its index when it has
	// none. When allowed, the binding bandwidth is the one with the fewest
	// tokens left; when not, the one that needs the longest to refill.
	Bandwidth string
}
