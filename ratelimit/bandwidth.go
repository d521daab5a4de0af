package ratelimit

import (
	"fmt"
	"time"
)

// RefillKind says how a [Bandwidth] regains tokens.
type RefillKind uint8

const (
	// Greedy adds tokens continuously: at 100 per minute, one token returns
	// every 600ms. It is the default.
	Greedy RefillKind = iota
	// Interval adds all RefillTokens at once when each RefillPeriod ends. The
	// first period starts when the bandwidth is first drawn below capacity,
	// and periods follow back to back while it stays below capacity.
	Interval
	// IntervalAligned is Interval with periods aligned to
	// [Bandwidth.AlignedStart]: with a start at midnight UTC and a period of
	// 24h, tokens return at every midnight UTC.
	IntervalAligned
)

// String returns the kind's Go name.
func (k RefillKind) String() string {
	switch k {
	case Greedy:
		return "Greedy"
	case Interval:
		return "Interval"
	case IntervalAligned:
		return "IntervalAligned"
	}
	return fmt.Sprintf("RefillKind(%d)", uint8(k))
}

// A Bandwidth is one limit: at most Capacity tokens, refilled by RefillTokens
// every RefillPeriod. A bucket may have several (a burst and a sustained
// rate); a request passes only when every one of them has the tokens.
//
// The zero value is not valid; build one with [PerSecond], [PerMinute],
// [PerHour] or [Every], and widen the burst with [Bandwidth.WithBurst].
type Bandwidth struct {
	// ID optionally names the bandwidth ("burst", "hourly"). It appears in
	// [Decision.Bandwidth] and response headers, and it matches bandwidths
	// when a bucket's config changes. IDs are unique within a config, at most
	// [MaxIDLen] bytes of letters, digits and -_.: and not all digits (a
	// bandwidth without an ID is named by its index).
	ID string
	// Capacity is the most tokens the bandwidth holds: the largest burst.
	// From 1 to [MaxCapacity].
	Capacity int64
	// RefillTokens are added every RefillPeriod. At least 1, and at most one
	// token per microsecond of RefillPeriod.
	RefillTokens int64
	// RefillPeriod is a whole number of microseconds from 1µs to
	// [MaxRefillPeriod].
	RefillPeriod time.Duration
	// Refill is how tokens return; the zero value is [Greedy].
	Refill RefillKind
	// InitialTokens is what a bucket without stored state starts with; nil
	// means Capacity. A bucket's state expires once it is full again, so an
	// idle bucket starts again from InitialTokens.
	InitialTokens *int64
	// AlignedStart anchors the periods of an [IntervalAligned] bandwidth
	// (microsecond precision); it must be zero for the other kinds.
	AlignedStart time.Time
}

// Every returns a greedy bandwidth of n tokens per period, with a capacity
// of n.
func Every(period time.Duration, n int64) Bandwidth {
	return Bandwidth{Capacity: n, RefillTokens: n, RefillPeriod: period}
}

// PerSecond is shorthand for Every(time.Second, n).
func PerSecond(n int64) Bandwidth { return Every(time.Second, n) }

// PerMinute is shorthand for Every(time.Minute, n).
func PerMinute(n int64) Bandwidth { return Every(time.Minute, n) }

// PerHour is shorthand for Every(time.Hour, n).
func PerHour(n int64) Bandwidth { return Every(time.Hour, n) }

// WithBurst returns b with its capacity set to capacity, keeping the refill
// rate: PerSecond(10).WithBurst(50) admits a burst of 50, then 10 a second.
func (b Bandwidth) WithBurst(capacity int64) Bandwidth {
	b.Capacity = capacity
	return b
}

// WithID returns b named id.
func (b Bandwidth) WithID(id string) Bandwidth {
	b.ID = id
	return b
}

// WithRefill returns b refilled the given way. For [IntervalAligned] use
// [Bandwidth.AlignedTo], which also sets the anchor.
func (b Bandwidth) WithRefill(kind RefillKind) Bandwidth {
	b.Refill = kind
	return b
}

// AlignedTo returns b refilled as [IntervalAligned], with periods counted
// from start.
func (b Bandwidth) AlignedTo(start time.Time) Bandwidth {
	b.Refill = IntervalAligned
	b.AlignedStart = start
	return b
}

// WithInitialTokens returns b whose fresh buckets start with n tokens.
func (b Bandwidth) WithInitialTokens(n int64) Bandwidth {
	b.InitialTokens = &n
	return b
}
