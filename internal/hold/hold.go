// Package hold runs work while holding a concurrency permit: the one way
// sluice's middleware (httplimit, grpclimit) keeps a permit alive for as
// long as a request runs and gives it back when the request ends, however
// it ends.
package hold

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// Run calls fn holding p, a permit leased for lease, and releases p when
// fn returns or panics (the panic then goes on up unchanged). While fn
// runs past a third of the lease, p is renewed every third of a lease
// ([ratelimit.Permit.KeepAlive]) on a goroutine a timer starts then, and
// that fn's end stops and waits for: an fn that returns sooner costs a
// timer and no goroutine. The renewals and the release use
// context.WithoutCancel(ctx), so that a request whose client went away
// still gives its permit back. A release the store fails is left to the
// lease, which brings the permit back when it ends.
func Run(ctx context.Context, p *ratelimit.Permit, lease time.Duration, fn func()) {
	ctx = context.WithoutCancel(ctx)
	defer func() { _ = p.Release(ctx) }()
	defer keepAlive(ctx, p, lease)()
	fn()
}

// keepAlive renews p from a third of its lease on, and returns the
// function that stops the renewals and waits for them to end.
func keepAlive(ctx context.Context, p *ratelimit.Permit, lease time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	t := time.AfterFunc(lease/3, func() {
		defer close(done)
		// A renewal now, then one every third of a lease: as if
		// KeepAlive had run since the acquire, so that two renewals in a
		// row may fail before the lease ends. A permit lost (its store
		// away for a whole lease) is not renewed again; fn runs on
		// without it.
		if err := p.Renew(ctx); errors.Is(err, ratelimit.ErrPermitLost) {
			return
		}
		_ = p.KeepAlive(ctx)
	})
	return func() {
		if !t.Stop() {
			cancel()
			<-done
		}
		cancel()
	}
}
