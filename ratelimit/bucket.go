package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// Bucket is a handle on one key's bucket whose config is supplied lazily.
// It holds no state of its own; it is cheap to create and safe for concurrent
// use.
type Bucket struct {
	limiter *Limiter
	key     string
	supply  func(context.Context) (Config, error)
}

// config asks the supplier for the bucket's current config.
func (b *Bucket) config(ctx context.Context) (Config, error) {
	if b.supply == nil {
		return Config{}, fmt.Errorf("%w: Bucket has no config supplier", ErrInvalidConfig)
	}
	cfg, err := b.supply(ctx)
	if err != nil {
		return Config{}, fmt.Errorf("ratelimit: config supplier: %w", err)
	}
	return cfg, nil
}

func (b *Bucket) do(ctx context.Context, req Request) (Decision, error) {
	cfg, err := b.config(ctx)
	if err != nil {
		return Decision{}, err
	}
	req.Strategy = b.limiter.strategy
	return b.limiter.backend.Do(ctx, b.key, cfg, req)
}

// TryConsume takes n tokens if every bandwidth has them; otherwise it takes
// nothing and the decision says when to retry.
func (b *Bucket) TryConsume(ctx context.Context, n int64) (Decision, error) {
	return b.do(ctx, Request{Op: Consume, Tokens: n})
}

// Estimate reports what TryConsume(ctx, n) would decide, taking nothing.
func (b *Bucket) Estimate(ctx context.Context, n int64) (Decision, error) {
	return b.do(ctx, Request{Op: Estimate, Tokens: n})
}

// Wait blocks until n tokens are taken. It reserves them in one call, on
// credit if need be, then sleeps until they are due. If they would be due
// after ctx's deadline, or further ahead than a bucket may be reserved
// (about 71 years of refill), it returns [ErrWaitExceedsDeadline] at once,
// taking nothing. A ctx that is already done returns its error at once,
// taking nothing. If ctx ends during
// the sleep, Wait gives the tokens back and returns ctx's error. If it ends
// while the reservation itself is in flight, the backend may return an
// error without knowing whether the store made it; Wait then returns that
// error and gives nothing back, so the tokens may stay taken until they
// refill: a cancelled Wait can cost tokens, but never admits extra.
//
// An algorithm that cannot reserve (see [Algorithm.Supports]) is polled
// instead: Wait tries to take the tokens, and sleeps for the decision's
// RetryAfter between tries. Waiters then are not served in arrival order,
// and one whose deadline comes before the RetryAfter returns
// [ErrWaitExceedsDeadline].
func (b *Bucket) Wait(ctx context.Context, n int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	cfg, err := b.config(ctx)
	if err != nil {
		return err
	}
	if !cfg.Algorithm.Supports(Reserve) {
		return b.poll(ctx, cfg, n)
	}
	maxWait, hasDeadline := time.Duration(math.MaxInt64), false
	if deadline, ok := ctx.Deadline(); ok {
		maxWait, hasDeadline = max(0, time.Until(deadline)), true
	}
	strategy := b.limiter.strategy
	d, err := b.limiter.backend.Do(ctx, b.key, cfg, Request{Op: Reserve, Tokens: n, MaxWait: maxWait, Strategy: strategy})
	if err != nil {
		return err
	}
	switch {
	case d.Allowed:
	case hasDeadline && d.RetryAfter > maxWait:
		return fmt.Errorf("%w: %d tokens are due in %v, the deadline is in %v", ErrWaitExceedsDeadline, n, d.RetryAfter, maxWait)
	default:
		return fmt.Errorf("%w: reserving %d tokens would put the bucket in debt for longer than it may be reserved ahead", ErrWaitExceedsDeadline, n)
	}
	if d.RetryAfter == 0 {
		return nil
	}
	timer := time.NewTimer(d.RetryAfter)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		// The reserved tokens were never used: hand them back so the wait
		// costs nothing. ctx is done, so the give-back runs without it.
		_, addErr := b.limiter.backend.Do(context.WithoutCancel(ctx), b.key, cfg, Request{Op: Add, Tokens: n, Strategy: strategy})
		return errors.Join(ctx.Err(), addErr)
	}
}

// poll is Wait for an algorithm that cannot reserve.
func (b *Bucket) poll(ctx context.Context, cfg Config, n int64) error {
	req := Request{Op: Consume, Tokens: n, Strategy: b.limiter.strategy}
	for {
		d, err := b.limiter.backend.Do(ctx, b.key, cfg, req)
		if err != nil || d.Allowed {
			return err
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < d.RetryAfter {
			return fmt.Errorf("%w: %d tokens are due in %v, the deadline is in %v", ErrWaitExceedsDeadline, n, d.RetryAfter, max(0, time.Until(deadline)))
		}
		timer := time.NewTimer(max(d.RetryAfter, time.Microsecond))
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		}
	}
}

// ConsumeUpTo takes as many tokens as are available, at most max, and
// returns how many it took (0 when none are).
func (b *Bucket) ConsumeUpTo(ctx context.Context, max int64) (int64, error) {
	d, err := b.do(ctx, Request{Op: ConsumeUpTo, Tokens: max})
	return d.Consumed, err
}

// AddTokens returns n tokens to every bandwidth, up to its capacity.
func (b *Bucket) AddTokens(ctx context.Context, n int64) error {
	_, err := b.do(ctx, Request{Op: Add, Tokens: n})
	return err
}

// Reset puts the bucket back in the state of a new one.
func (b *Bucket) Reset(ctx context.Context) error {
	_, err := b.do(ctx, Request{Op: Reset})
	return err
}

// Inspect reports the bucket's state without taking anything: Remaining,
// ResetAfter, and whether one token is available (if not, RetryAfter says
// when).
func (b *Bucket) Inspect(ctx context.Context) (Decision, error) {
	return b.do(ctx, Request{Op: Inspect})
}

// Replace converts the bucket to cfg now, carrying tokens over with s,
// rather than with the Limiter's strategy at the next call. The supplier
// should return cfg from then on, or the next call converts again.
func (b *Bucket) Replace(ctx context.Context, cfg Config, s Inheritance) error {
	_, err := b.limiter.backend.Do(ctx, b.key, cfg, Request{Op: Replace, Strategy: s})
	return err
}
