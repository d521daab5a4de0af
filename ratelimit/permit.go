package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Concurrency limits: where a [Config] says how often, a Concurrency says
// how many at once. A key's permits are held by holders, each for a
// weight, until the holder releases them or their lease ends on the
// store's clock, whichever comes first; the store grants an acquire only
// while the weights held, with it, stay within Limit.

// The accepted range of a [Concurrency] and a [PermitRequest].
const (
	// MaxPermits is the largest [Concurrency.Limit]: 2^16. A Redis store
	// keeps a sorted-set member per permit held, so a key's state is at
	// most this many members, and a weighted acquire writes one member per
	// unit of weight.
	MaxPermits = 1 << 16
	// MinPermitLease is the shortest [Concurrency.Lease]: a millisecond,
	// the resolution of a Redis key's expiry.
	MinPermitLease = time.Millisecond
	// MaxPermitLease is the longest [Concurrency.Lease]: a day. A request
	// that runs longer renews its permit (see [Permit.KeepAlive]).
	MaxPermitLease = 24 * time.Hour
	// MaxHolderLen is the longest [PermitRequest.Holder], in bytes.
	MaxHolderLen = 64
)

// Concurrency is a limit on the requests in flight at once for a key. Like
// a [Config], it travels with every call, and the store keeps only the
// permits held: a limit lowered while more are held denies every acquire
// until enough are released.
type Concurrency struct {
	// Limit is the most permits (the sum of their weights) held at once,
	// 1 to [MaxPermits].
	Limit int64
	// Lease is how long a permit lasts, on the store's clock, unless it is
	// released or renewed first: a holder that dies gives its permit back
	// within a Lease. [MinPermitLease] to [MaxPermitLease], whole
	// microseconds.
	Lease time.Duration
}

// InFlight returns a Concurrency of limit permits, each leased for lease.
func InFlight(limit int64, lease time.Duration) Concurrency {
	return Concurrency{Limit: limit, Lease: lease}
}

// Validate reports what is wrong with c, with an error wrapping
// [ErrInvalidConfig] that names the field; nil if c is usable.
func (c Concurrency) Validate() error {
	if c.Limit < 1 || c.Limit > MaxPermits {
		return invalidConfig("Concurrency.Limit must be 1 to %d, got %d", MaxPermits, c.Limit)
	}
	if c.Lease < MinPermitLease || c.Lease > MaxPermitLease {
		return invalidConfig("Concurrency.Lease must be %v to %v, got %v", MinPermitLease, MaxPermitLease, c.Lease)
	}
	if c.Lease%time.Microsecond != 0 {
		return invalidConfig("Concurrency.Lease must be whole microseconds, got %v", c.Lease)
	}
	return nil
}

// LeaseMicros is c.Lease in µs, the unit of the stores' clocks.
func (c Concurrency) LeaseMicros() int64 { return int64(c.Lease / time.Microsecond) }

// PermitOp is what a [PermitRequest] does.
type PermitOp uint8

const (
	// PermitAcquire takes a permit of Weight for Holder if the weights
	// held, with it, stay within the limit; otherwise it takes nothing. A
	// Holder that holds a permit of the key already (an acquire sent again
	// after a timeout) keeps it, its lease renewed, and is granted: a
	// retried acquire never holds two.
	PermitAcquire PermitOp = iota
	// PermitRelease frees Holder's permit. It is granted only if Holder
	// held one: a second or late release changes nothing, and never frees
	// another holder's permit.
	PermitRelease
	// PermitRenew starts Holder's lease afresh. It is granted only if
	// Holder held a permit whose lease had not ended.
	PermitRenew
	// PermitInspect reports the permits held, changing nothing.
	PermitInspect
)

var permitOpNames = [...]string{"Acquire", "Release", "Renew", "InspectPermits"}

// String returns the op's name, as spans and errors show it.
func (o PermitOp) String() string {
	if int(o) < len(permitOpNames) {
		return permitOpNames[o]
	}
	return fmt.Sprintf("PermitOp(%d)", uint8(o))
}

// PermitRequest is one operation on a key's permits.
type PermitRequest struct {
	// Op is what to do; the zero value is [PermitAcquire].
	Op PermitOp
	// Holder names the permit's owner: 1 to [MaxHolderLen] bytes, unique
	// to one permit (a [Limiter] makes a new one for each). Inspect
	// ignores it.
	Holder string
	// Weight is how many of the limit's permits the holder takes, 1 up to
	// the Limit. Release and Renew carry the weight the permit was
	// acquired with, for decorators (telemetry counts the permits in
	// flight by it); the store goes by what it holds. Inspect ignores it.
	Weight int64
}

// PermitDecision is the outcome of one [PermitRequest].
type PermitDecision struct {
	// Granted reports, for an acquire, that the holder holds the permit;
	// for a release, that it held one, now freed; for a renew, that it
	// held one, now leased afresh. Inspect sets it when a permit of weight
	// 1 could be acquired.
	Granted bool
	// Degraded reports that a fail policy decided, not the store. A
	// policy that counts permits in a store of its own (failpolicy's
	// Local mode) reports its count and its share in InFlight and Limit:
	// an Acquire it refuses there, for the caller's share being full, has
	// InFlight above 0. A Degraded Acquire refused with InFlight 0 was
	// refused without a count (failpolicy's Closed mode, or Local unable
	// to decide): the limiter is out, not the caller's share.
	Degraded bool
	// Limit is the request's [Concurrency.Limit], or the share of it a
	// Degraded decision was counted against.
	Limit int64
	// InFlight is the permits held after the request, weights summed, on
	// the store's count (expired leases are not counted), or on the fail
	// policy's own count for a Degraded decision.
	InFlight int64
	// RetryAfter is, for a denied acquire, the time until the first held
	// lease ends: the longest the key can stay as full as it is, unless
	// the limit changes. A release may free room sooner. Otherwise 0.
	RetryAfter time.Duration
}

// PermitBackend is implemented by a [Backend] that also holds concurrency
// permits: the stores sluice ships, and its decorators, which ask the
// Backend they wrap. Like Do, DoPermit must call [CheckPermit] first and
// return its error before any I/O, return ctx's error for a ctx already
// done (taking nothing), wrap the store's own failures in
// [ErrBackendUnavailable] or [ErrTimeout], and return an error wrapping
// ctx.Err() and neither store sentinel if ctx ends while the call is out.
// A decorator over a Backend that holds no permits returns an error
// wrapping [errors.ErrUnsupported].
type PermitBackend interface {
	// DoPermit applies req to the permits of key atomically, under the
	// limit lim, reclaiming first every permit whose lease has ended on
	// the store's clock.
	DoPermit(ctx context.Context, key string, lim Concurrency, req PermitRequest) (PermitDecision, error)
}

// ErrPermitLost is returned by [Permit.Renew] and [Permit.Release] when the
// store no longer held the permit: its lease had ended (the holder was
// paused, or ran longer than the lease without renewing), so another
// request may have taken its place.
var ErrPermitLost = errors.New("ratelimit: permit lost")

// CheckPermit validates a permit call before any I/O: the key, the limit
// and the request. Every [PermitBackend] calls it first. The error wraps
// [ErrInvalidKey], [ErrInvalidConfig] or [ErrInvalidRequest] and names the
// field.
func CheckPermit(key string, lim Concurrency, req PermitRequest) error {
	if len(key) == 0 || len(key) > MaxKeyLen {
		return fmt.Errorf("%w: key must be 1 to %d bytes, got %d", ErrInvalidKey, MaxKeyLen, len(key))
	}
	if err := lim.Validate(); err != nil {
		return err
	}
	switch req.Op {
	case PermitAcquire, PermitRelease, PermitRenew:
		if len(req.Holder) == 0 || len(req.Holder) > MaxHolderLen {
			return fmt.Errorf("%w: %v Holder must be 1 to %d bytes, got %d", ErrInvalidRequest, req.Op, MaxHolderLen, len(req.Holder))
		}
	case PermitInspect:
		return nil
	default:
		return fmt.Errorf("%w: Op %v is not a known PermitOp", ErrInvalidRequest, req.Op)
	}
	if req.Op == PermitAcquire && (req.Weight < 1 || req.Weight > lim.Limit) {
		return fmt.Errorf("%w: Acquire Weight must be between 1 and the Limit (%d), got %d", ErrInvalidRequest, lim.Limit, req.Weight)
	}
	return nil
}

// Permits returns b as a [PermitBackend]: b itself if it is one, else one
// whose every call fails with an error wrapping [errors.ErrUnsupported]
// (after [CheckPermit]). Decorators call it on the Backend they wrap.
func Permits(b Backend) PermitBackend {
	if pb, ok := b.(PermitBackend); ok {
		return pb
	}
	return noPermits{b}
}

// noPermits is a Backend that holds no permits, as a PermitBackend.
type noPermits struct{ b Backend }

func (n noPermits) DoPermit(_ context.Context, key string, lim Concurrency, req PermitRequest) (PermitDecision, error) {
	if err := CheckPermit(key, lim, req); err != nil {
		return PermitDecision{}, err
	}
	return PermitDecision{}, fmt.Errorf("ratelimit: the Backend %T holds no permits: %w", n.b, errors.ErrUnsupported)
}
