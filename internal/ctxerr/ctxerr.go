// Package ctxerr is the one place sluice's backends and decorators turn a
// caller's ended context into the error a call returns, so that every
// path reads the same way: the context's error first (errors.Is-able to
// [context.Canceled] or [context.DeadlineExceeded]), then what was being
// done, then the context's cause when it has one of its own, then the
// store's error, if the call got one.
//
// A context has ended when it is done ([Done]), or, for a call that got a
// deadline's error back from its store, when its deadline is at most
// [Slack] away ([Ended]): a client can return such an error a moment
// before the deadline it belongs to.
//
// Such an error never wraps ratelimit.ErrTimeout or
// ratelimit.ErrBackendUnavailable: the caller ending its own call says
// nothing about the store.
package ctxerr

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// Slack is how far ahead a context's deadline may still be when a call on
// it gets a deadline's error back and [Ended] takes that error for the
// context's own deadline.
//
// A client can return its deadline error before time.Now() reaches the
// context's deadline, not only before ctx.Err() says so (see [Done]).
// rueidis does when calls overlap on one connection, as the calls a fail
// policy leaves behind at its caller's deadline do: a call joins the
// dial another call started, with the other's context (mux._pipe shares
// one dial between its callers), and gets that dial's error, "dial tcp
// ...: i/o timeout" or the HELLO's "context deadline exceeded"; then, on
// the dead connection, the error stored there. Neither rueidis's timers
// nor the socket's deadline fire early: the error is another call's. With
// callers of 50µs deadlines through a fail policy, redisscript.Error got
// such an error 2–31µs before the caller's deadline in 9 of 200 calls, and
// a bare rueidis client driven the same way 2–43µs before it in 6–15 of
// 400: never more than the caller's own timeout, as the dial a call joins
// ends after the call started. (A caller with a longer timeout can so get
// such an error further ahead of its deadline; beyond Slack it stays the
// store's timeout.)
//
// 1ms is twenty times the most measured and leaves room for a loaded
// machine's scheduling. Taking a store's own timeout (a dial or write
// timeout, a fail policy's deadline) for the caller's deadline costs
// little while the slack is small: the error then is the caller's
// context error, as it would have been anyway within the slack, and only
// that call goes uncounted as a store failure. A larger slack would reach
// deadlines callers really use (a few milliseconds for a network round
// trip), and a store failing would then go uncounted for all their calls.
const Slack = time.Millisecond

// Caller returns nil while ctx has not ended (see [Ended], which judges
// err, the store's own error, if not nil). Once it has, it returns the
// error for a call on it: ctx.Err() (or [context.DeadlineExceeded] if ctx
// does not say so yet), wrapped with what ("memory: Consume on key
// \"k\""), context.Cause(ctx) if that differs from ctx.Err(), and err if
// not nil; each stays reachable with errors.Is and errors.As.
func Caller(ctx context.Context, what string, err error) error {
	return caller(ctx, what, err, err)
}

// Judged is [Caller] for a decorator that judges err, the next Backend's
// error, as Caller does, but leaves it out of the error it returns: a
// Backend that took the caller's deadline for its own timeout would have
// it wrap ratelimit.ErrTimeout.
func Judged(ctx context.Context, what string, err error) error {
	return caller(ctx, what, err, nil)
}

func caller(ctx context.Context, what string, judged, wrapped error) error {
	done := Done(ctx)
	if done == nil && Ended(ctx, judged) {
		done = context.DeadlineExceeded
	}
	if done == nil {
		return nil
	}
	format, args := "%w: %s", []any{done, what}
	if cause := context.Cause(ctx); cause != nil && cause != done {
		format, args = format+": %w", append(args, cause)
	}
	if wrapped != nil {
		format, args = format+": %w", append(args, wrapped)
	}
	return fmt.Errorf(format, args...)
}

// Done returns ctx.Err(), or [context.DeadlineExceeded] if ctx's deadline
// has passed though ctx does not say so yet: a socket's deadline, set from
// the context's, can fire a moment before the context's own timer, and a
// client then returns its timeout while ctx.Err() is still nil.
//
// Done is the check before a call: a context with any time left is not
// done, and the call is made.
func Done(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if deadline, ok := ctx.Deadline(); ok && !time.Now().Before(deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// Ended reports whether a call on ctx that returned err ended because ctx
// did: ctx is [Done], or err is a deadline's (it wraps
// [context.DeadlineExceeded], or is a [net.Error] timeout) and ctx's
// deadline is at most [Slack] away, so that the deadline err came back
// for is taken to be ctx's, returned a moment early (see Slack).
func Ended(ctx context.Context, err error) bool {
	if Done(ctx) != nil {
		return true
	}
	deadline, ok := ctx.Deadline()
	return ok && err != nil && time.Until(deadline) <= Slack && IsDeadline(err)
}

// IsDeadline reports whether err is a deadline's: the context's, or a
// socket's (os.ErrDeadlineExceeded), which is a net.Error timeout.
func IsDeadline(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}
