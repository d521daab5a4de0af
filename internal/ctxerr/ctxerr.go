// Package ctxerr is the one place sluice's backends and decorators turn a
// caller's ended context into the error a call returns, so that every
// path reads the same way: the context's error first (errors.Is-able to
// [context.Canceled] or [context.DeadlineExceeded]), then what was being
// done, then the context's cause when it has one of its own, then the
// store's error, if the call got one.
//
// Such an error never wraps ratelimit.ErrTimeout or
// ratelimit.ErrBackendUnavailable: the caller ending its own call says
// nothing about the store.
package ctxerr

import (
	"context"
	"fmt"
	"time"
)

// Caller returns nil while ctx is live. Once ctx is done, it returns the
// error for a call on it: ctx.Err(), wrapped with what ("memory: Consume
// on key \"k\""), context.Cause(ctx) if that differs from ctx.Err(), and
// err, the store's own error, if not nil; each stays reachable with
// errors.Is and errors.As.
func Caller(ctx context.Context, what string, err error) error {
	done := Done(ctx)
	if done == nil {
		return nil
	}
	format, args := "%w: %s", []any{done, what}
	if cause := context.Cause(ctx); cause != nil && cause != done {
		format, args = format+": %w", append(args, cause)
	}
	if err != nil {
		format, args = format+": %w", append(args, err)
	}
	return fmt.Errorf(format, args...)
}

// Done returns ctx.Err(), or [context.DeadlineExceeded] if ctx's deadline
// has passed though ctx does not say so yet: a socket's deadline, set from
// the context's, can fire a moment before the context's own timer, and a
// client then returns its timeout while ctx.Err() is still nil.
func Done(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if deadline, ok := ctx.Deadline(); ok && !time.Now().Before(deadline) {
		return context.DeadlineExceeded
	}
	return nil
}
