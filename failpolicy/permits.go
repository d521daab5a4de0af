package failpolicy

import (
	"context"

	"github.com/sluicehq/sluice/internal/ctxerr"
	"github.com/sluicehq/sluice/ratelimit"
)

// DoPermit implements [ratelimit.PermitBackend]: it applies req to the
// next Backend's permits under the deadline and the key's breaker, as Do
// decides, or by the mode if the breaker is open or the next Backend
// fails; see "Permits" in the package doc. Bad input is
// [ratelimit.CheckPermit]'s error, before anything else. If the next
// Backend holds no permits, every call fails with an error wrapping
// [errors.ErrUnsupported], which no mode stands in for.
func (b *Backend) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	if err := ratelimit.CheckPermit(key, lim, req); err != nil {
		return ratelimit.PermitDecision{}, err
	}
	if b.permits == nil {
		return ratelimit.Permits(b.next).DoPermit(ctx, key, lim, req)
	}
	if ctx.Err() != nil {
		return ratelimit.PermitDecision{}, ctxerr.Caller(ctx, what(req.Op, key), nil)
	}
	if b.mode == Local && (req.Op == ratelimit.PermitRelease || req.Op == ratelimit.PermitRenew) {
		// A permit the local store holds was taken there: it is released
		// and renewed there, the store knowing nothing of it.
		d, held, err := b.heldLocally(ctx, key, lim, req)
		if held || err != nil {
			return d, err
		}
	}
	r, cause := b.send(ctx, &call{key: key, permit: true, lim: lim, preq: req})
	if cause != nil {
		return b.degradePermit(ctx, key, lim, req, cause)
	}
	return r.pd, r.err
}

// heldLocally applies a Release or a Renew to the local store, and
// reports whether it held the holder's permit. If not, it changed
// nothing, and the call is the store's. err is the caller's context
// ending.
func (b *Backend) heldLocally(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (d ratelimit.PermitDecision, held bool, err error) {
	d, err = b.local.DoPermit(ctx, key, PermitShare(lim, b.instances), req)
	switch {
	case err != nil && ctx.Err() != nil:
		return ratelimit.PermitDecision{}, false, ctxerr.Caller(ctx, what(req.Op, key), nil)
	case err != nil || !d.Granted:
		// Not held there (or the local store is closed, and holds
		// nothing).
		return ratelimit.PermitDecision{}, false, nil
	}
	d.Degraded = true
	return d, true, nil
}

// degradePermit decides req by the mode, because of cause.
func (b *Backend) degradePermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest, cause error) (ratelimit.PermitDecision, error) {
	if b.hooks.Degraded != nil {
		b.hooks.Degraded(ctx, key, b.mode, cause)
	}
	switch b.mode {
	case Open:
		// Release is not granted: the store frees the permit when its
		// lease ends. The others are: no request is kept out or cut off.
		return ratelimit.PermitDecision{Granted: req.Op != ratelimit.PermitRelease, Degraded: true, Limit: lim.Limit}, nil
	case Local:
		return b.permitLocally(ctx, key, lim, req)
	}
	return b.closedPermit(lim, req), nil
}

// closedPermit is the Closed mode's decision: nothing granted, an
// Acquire told to come back after [WithRetryAfter].
func (b *Backend) closedPermit(lim ratelimit.Concurrency, req ratelimit.PermitRequest) ratelimit.PermitDecision {
	d := ratelimit.PermitDecision{Degraded: true, Limit: lim.Limit}
	if req.Op == ratelimit.PermitAcquire {
		d.RetryAfter = b.retryAfter
	}
	return d
}

// permitLocally decides req in the local store, under this instance's
// share of lim.
func (b *Backend) permitLocally(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	share := PermitShare(lim, b.instances)
	d, err := b.local.DoPermit(ctx, key, share, req)
	switch {
	case err != nil && ctx.Err() != nil:
		return ratelimit.PermitDecision{}, ctxerr.Caller(ctx, what(req.Op, key), nil)
	case err != nil:
		// The share cannot hold it (a Weight above the share), or the
		// local store cannot decide (it holds permits of WithLocalKeys
		// keys already, or it is closed): deny, as Closed would.
		return b.closedPermit(share, req), nil
	}
	d.Degraded = true
	return d, nil
}

// PermitShare returns lim with its Limit divided by instances, rounded
// up: one instance's share of a concurrency limit, which the Local mode
// enforces. Rounded up, the shares together are never fewer than the
// limit, so that the instances can still run Limit requests at once while
// the store is away; n shares of a limit L hold at most L + n − 1.
func PermitShare(lim ratelimit.Concurrency, instances int64) ratelimit.Concurrency {
	if instances > 1 {
		lim.Limit = (lim.Limit + instances - 1) / instances
	}
	return lim
}
