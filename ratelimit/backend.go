package ratelimit

import (
	"context"
	"fmt"
	"time"
)

// Backend stores buckets and applies requests to them. Implementations live
// in sluice/backend/...; decorators (fail policies, sharding, telemetry) are
// Backends that wrap another. Every implementation must pass
// ratelimittest.Run.
type Backend interface {
	// Do applies req to the bucket at key atomically, creating it from cfg
	// if absent, and converting it with req.Strategy if it was built from a
	// config whose [Config.Fingerprint] differs, never to an older
	// [Config.Version] than it holds: as [Apply] decides, to the scaled
	// unit.
	//
	// Do must first call [CheckRequest] and return its error, before any
	// I/O and without changing any state. A call whose ctx is already done
	// must then return ctx's error, taking nothing. An error from the store
	// itself must wrap [ErrBackendUnavailable] or [ErrTimeout], and an
	// error about this key alone (a foreign value, a full key cap)
	// [ErrKeyRejected]. If ctx ends while the call is out, Do returns an
	// error wrapping ctx.Err() ([context.Canceled] or
	// [context.DeadlineExceeded]) and neither store sentinel: the caller
	// gave up, the store did not fail. Do must be safe for concurrent use
	// and must not keep cfg.Bandwidths after it returns.
	Do(ctx context.Context, key string, cfg Config, req Request) (Decision, error)
}

// Op is what a [Request] does to a bucket.
type Op uint8

const (
	// Consume takes Tokens if every bandwidth has them, else takes nothing.
	Consume Op = iota
	// Estimate reports what Consume would decide, taking nothing.
	Estimate
	// Reserve takes Tokens on credit if they arrive within MaxWait; the
	// decision's RetryAfter is then how long to wait before using them.
	Reserve
	// ConsumeUpTo takes as many tokens as are available, at most Tokens.
	ConsumeUpTo
	// Add puts Tokens back into every bandwidth, up to its capacity.
	Add
	// Reset puts the bucket back in the state of a new one.
	Reset
	// Replace converts the bucket to cfg with Strategy, even when its
	// fingerprint matches.
	Replace
	// Inspect reports the bucket's state: whether one token is available,
	// and if not, when.
	Inspect
)

var opNames = [...]string{"Consume", "Estimate", "Reserve", "ConsumeUpTo", "Add", "Reset", "Replace", "Inspect"}

// String returns the op's Go name.
func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Inheritance says how a bucket's tokens carry over when its config changes.
// Bandwidths are matched by ID, or by position when both have no ID; a new
// bandwidth with no match starts as in a new bucket. AsIs and Additive
// carry tokens over whole, fractions dropped; Proportionally scales the
// exact level, fraction included. The time since the bucket was last
// touched refills at the new rate.
//
// The window algorithms (FixedWindow, SlidingWindowLog,
// SlidingWindowCounter) have no tokens to carry: across a config change
// they keep the requests already counted, up to the new Capacity, unless
// the strategy is ResetTokens, which forgets them. GCRA and LeakyBucket
// keep each bandwidth's arrival time, as redis_rate does, whatever the
// strategy but ResetTokens. A change of [Algorithm] always starts the
// bucket afresh.
type Inheritance uint8

const (
	// AsIs keeps the tokens, trimmed to the new capacity. It is the default.
	AsIs Inheritance = iota
	// ResetTokens starts every bandwidth as in a new bucket. (Bucket4j calls
	// it RESET; the name Reset is taken by the [Op].)
	ResetTokens
	// Proportionally scales the tokens, fraction included, by
	// newCapacity/oldCapacity, rounding down once, to the smallest part of
	// a token the bandwidth counts (see [State]): 1.8 tokens of a capacity
	// of 10 become 36 of 200, as in Bucket4j.
	Proportionally
	// Additive keeps min(tokens, newCapacity) and adds any capacity the
	// bandwidth gained: + max(0, newCapacity - oldCapacity).
	Additive
)

var inheritanceNames = [...]string{"AsIs", "ResetTokens", "Proportionally", "Additive"}

// String returns the strategy's Go name.
func (s Inheritance) String() string {
	if int(s) < len(inheritanceNames) {
		return inheritanceNames[s]
	}
	return fmt.Sprintf("Inheritance(%d)", uint8(s))
}

// Request is one operation on a bucket.
type Request struct {
	// Op is what to do; the zero value is [Consume].
	Op Op
	// Tokens is the count for Consume, Estimate and Reserve (1 up to the
	// smallest capacity), the most to take for ConsumeUpTo (at least 1) and
	// the count to return for Add (at least 1). Other ops ignore it.
	Tokens int64
	// MaxWait is, for Reserve, the longest the caller will wait for the
	// tokens. It must not be negative.
	MaxWait time.Duration
	// Strategy converts the stored state when the config changed (for
	// Replace: always).
	Strategy Inheritance
	// Ago, for Consume, ConsumeUpTo and Reserve, makes the store decide
	// the request as of this long before now, on its own clock, as if it
	// had been made then: tokens an instance took while the store could
	// not be asked (failpolicy's Local mode) are charged as of when they
	// were taken, and refill from then. The bucket's time never goes back:
	// a bucket changed since then decides the request as it would on a
	// store whose clock stepped back (each algorithm's docs say how: the
	// sliding log, for one, keeps the request at its own time). The
	// Decision is the one made then, its durations counted from then. It
	// must be 0 to [MaxAgo]. Like Add, it trusts the caller: tokens taken
	// "a while ago" may have refilled already, so never set it from a
	// client's input.
	Ago time.Duration
}

// MaxAgo is the longest [Request.Ago]: a day.
const MaxAgo = 24 * time.Hour

// Clock tells the time to backends that keep their own: the memory backend
// reads it on every decision, and tests pass a fake one.
type Clock interface {
	Now() time.Time
}

// CheckRequest validates a call before any I/O: the key, the config and the
// request against it. Every [Backend] calls it first. The error wraps
// [ErrInvalidKey], [ErrInvalidConfig] or [ErrInvalidRequest] and names the
// field.
func CheckRequest(key string, cfg Config, req Request) error {
	if len(key) == 0 || len(key) > MaxKeyLen {
		return fmt.Errorf("%w: key must be 1 to %d bytes, got %d", ErrInvalidKey, MaxKeyLen, len(key))
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	return CheckOp(cfg, req)
}

// CheckOp validates req against cfg: what [CheckRequest] checks once the
// key and the config have passed. A backend that knows both to be good (a
// key it holds a bucket for, a config equal to one that passed
// [Config.Validate]) may call it in place of CheckRequest, to spare the
// config's checks on every call. The error wraps [ErrInvalidRequest] and
// names the field.
func CheckOp(cfg Config, req Request) error {
	if req.Op <= Inspect && !cfg.Algorithm.Supports(req.Op) {
		return fmt.Errorf("%w: Op %v is not supported by %v", ErrInvalidRequest, req.Op, cfg.Algorithm)
	}
	if req.Strategy > Additive {
		return fmt.Errorf("%w: Strategy %v is not a known Inheritance", ErrInvalidRequest, req.Strategy)
	}
	if req.Ago != 0 {
		if req.Ago < 0 || req.Ago > MaxAgo {
			return fmt.Errorf("%w: Ago must be 0 to %v, got %v", ErrInvalidRequest, MaxAgo, req.Ago)
		}
		if req.Op != Consume && req.Op != ConsumeUpTo && req.Op != Reserve {
			return fmt.Errorf("%w: Ago is for Consume, ConsumeUpTo and Reserve, not %v", ErrInvalidRequest, req.Op)
		}
	}
	switch req.Op {
	case Consume, Estimate, Reserve:
		if limit := cfg.MinCapacity(); req.Tokens < 1 || req.Tokens > limit {
			return fmt.Errorf("%w: %v Tokens must be between 1 and the smallest Capacity (%d), got %d", ErrInvalidRequest, req.Op, limit, req.Tokens)
		}
		if req.MaxWait < 0 {
			return fmt.Errorf("%w: MaxWait must not be negative, got %v", ErrInvalidRequest, req.MaxWait)
		}
	case ConsumeUpTo, Add:
		if req.Tokens < 1 {
			return fmt.Errorf("%w: %v Tokens must be at least 1, got %d", ErrInvalidRequest, req.Op, req.Tokens)
		}
	case Reset, Replace, Inspect:
	default:
		return fmt.Errorf("%w: Op %v is not a known Op", ErrInvalidRequest, req.Op)
	}
	return nil
}

// MinCapacity returns the smallest Capacity of c's bandwidths: the most
// tokens one request may ask for, and the Limit a decision not made by the
// store reports. It is [MaxCapacity] when c has no bandwidths.
func (c Config) MinCapacity() int64 {
	limit := int64(MaxCapacity)
	for i := range c.Bandwidths {
		limit = min(limit, c.Bandwidths[i].Capacity)
	}
	return limit
}
