package ratelimit

import (
	"context"
	crypto "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"
)

// TryAcquire takes a permit of weight n for key under lim if there is room,
// in one call to the store, and returns it with the decision; when there is
// none it returns a nil Permit and the decision says why. Release the
// permit when the work it guards is done; one never released comes back
// within lim.Lease. The Limiter's Backend must be a [PermitBackend]: a
// store of sluice's, or a [Stack] of them, is.
func (l *Limiter) TryAcquire(ctx context.Context, key string, lim Concurrency, n int64) (*Permit, PermitDecision, error) {
	pb := Permits(l.backend)
	req := PermitRequest{Op: PermitAcquire, Holder: newHolder(), Weight: n}
	d, err := pb.DoPermit(ctx, key, lim, req)
	if err != nil || !d.Granted {
		return nil, d, err
	}
	return &Permit{backend: pb, key: key, lim: lim, holder: req.Holder, weight: n, decision: d}, d, nil
}

// Acquire waits until it takes a permit of weight n for key under lim, or
// ctx ends, when it returns ctx's error and holds nothing. It tries as
// TryAcquire does, and between tries sleeps for a backoff that doubles
// from [MinAcquireBackoff] to [MaxAcquireBackoff], each sleep drawn from
// its upper half, or until the decision's RetryAfter (the first lease's
// end) when that comes sooner: a store tells no waiter when a permit is
// released, so waiters poll, and are not served in arrival order.
func (l *Limiter) Acquire(ctx context.Context, key string, lim Concurrency, n int64) (*Permit, error) {
	backoff := MinAcquireBackoff
	for {
		p, d, err := l.TryAcquire(ctx, key, lim, n)
		if err != nil || p != nil {
			return p, err
		}
		sleep := backoff/2 + rand.N(backoff/2+1)
		if d.RetryAfter > 0 && d.RetryAfter < sleep {
			sleep = d.RetryAfter
		}
		timer := time.NewTimer(sleep)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		}
		backoff = min(2*backoff, MaxAcquireBackoff)
	}
}

// The backoff of [Limiter.Acquire] between tries.
const (
	MinAcquireBackoff = time.Millisecond
	MaxAcquireBackoff = 100 * time.Millisecond
)

// Semaphore returns a handle on the permits of key whose limit comes from
// supply, called once per acquire: as [Limiter.Bucket] does for a rate, a
// supplier that reads plans makes a plan change apply on the next acquire.
func (l *Limiter) Semaphore(key string, supply func(context.Context) (Concurrency, error)) *Semaphore {
	return &Semaphore{limiter: l, key: key, supply: supply}
}

// Semaphore is a handle on one key's permits whose limit is supplied
// lazily. It holds no state of its own; it is cheap to create and safe for
// concurrent use.
type Semaphore struct {
	limiter *Limiter
	key     string
	supply  func(context.Context) (Concurrency, error)
}

func (s *Semaphore) limit(ctx context.Context) (Concurrency, error) {
	if s.supply == nil {
		return Concurrency{}, fmt.Errorf("%w: Semaphore has no limit supplier", ErrInvalidConfig)
	}
	lim, err := s.supply(ctx)
	if err != nil {
		return Concurrency{}, fmt.Errorf("ratelimit: limit supplier: %w", err)
	}
	return lim, nil
}

// TryAcquire is [Limiter.TryAcquire] on the semaphore's key and limit.
func (s *Semaphore) TryAcquire(ctx context.Context, n int64) (*Permit, PermitDecision, error) {
	lim, err := s.limit(ctx)
	if err != nil {
		return nil, PermitDecision{}, err
	}
	return s.limiter.TryAcquire(ctx, s.key, lim, n)
}

// Acquire is [Limiter.Acquire] on the semaphore's key and limit, the limit
// supplied once.
func (s *Semaphore) Acquire(ctx context.Context, n int64) (*Permit, error) {
	lim, err := s.limit(ctx)
	if err != nil {
		return nil, err
	}
	return s.limiter.Acquire(ctx, s.key, lim, n)
}

// InFlight reports the permits held, weights summed, as the store counts
// them.
func (s *Semaphore) InFlight(ctx context.Context) (PermitDecision, error) {
	lim, err := s.limit(ctx)
	if err != nil {
		return PermitDecision{}, err
	}
	return Permits(s.limiter.backend).DoPermit(ctx, s.key, lim, PermitRequest{Op: PermitInspect})
}

// Permit is one held permit: what [Limiter.TryAcquire] and
// [Limiter.Acquire] return. Its methods are safe for concurrent use.
type Permit struct {
	backend  PermitBackend
	key      string
	lim      Concurrency
	holder   string
	weight   int64
	decision PermitDecision
	released atomic.Bool
}

// Holder is the permit's owner identity in the store: unique to this
// permit.
func (p *Permit) Holder() string { return p.holder }

// Weight is the permits this one counts for.
func (p *Permit) Weight() int64 { return p.weight }

// Decision is the acquire's decision.
func (p *Permit) Decision() PermitDecision { return p.decision }

// Release gives the permit back. Only the first call goes to the store;
// later ones return nil. It returns [ErrPermitLost] if the store no
// longer held the permit (its lease had ended), and the store's error if
// it could not be asked: the permit then comes back when its lease ends.
// When a fail policy answers for the store, or granted the permit (its
// Decision is Degraded, and the store never held it), Release returns
// nil. Release with a ctx of its own, not one that may be done
// already (a request's): context.WithoutCancel of it, say.
func (p *Permit) Release(ctx context.Context) error {
	if p.released.Swap(true) {
		return nil
	}
	d, err := p.backend.DoPermit(ctx, p.key, p.lim, PermitRequest{Op: PermitRelease, Holder: p.holder, Weight: p.weight})
	if err != nil {
		return err
	}
	if d.Degraded {
		// A fail policy answered: the store frees the permit when its
		// lease ends.
		return nil
	}
	return p.outcome(d, "release")
}

// Renew starts the permit's lease afresh, on the store's clock. It returns
// [ErrPermitLost] if the permit was released or its lease had ended; the
// store's error if it could not be asked, or an error wrapping
// [ErrBackendUnavailable] if a fail policy answered without granting: the
// permit may still be held, and [Permit.KeepAlive] tries again. A permit
// a fail policy granted is lost only once released.
func (p *Permit) Renew(ctx context.Context) error {
	if p.released.Load() {
		return fmt.Errorf("%w: key %q: the permit was released", ErrPermitLost, p.key)
	}
	d, err := p.backend.DoPermit(ctx, p.key, p.lim, PermitRequest{Op: PermitRenew, Holder: p.holder, Weight: p.weight})
	if err != nil {
		return err
	}
	return p.outcome(d, "renew")
}

// outcome is the error of a renew, or of a release no fail policy
// answered, that returned d.
func (p *Permit) outcome(d PermitDecision, op string) error {
	switch {
	case d.Granted, p.decision.Degraded:
		// Granted by a fail policy, the permit was never the store's to
		// lose.
		return nil
	case d.Degraded:
		return fmt.Errorf("%w: key %q: a fail policy answered the %s: the store was not asked", ErrBackendUnavailable, p.key, op)
	}
	return fmt.Errorf("%w: key %q: its lease of %v had ended", ErrPermitLost, p.key, p.lim.Lease)
}

// KeepAlive renews the permit every third of its lease until ctx ends or
// the permit is released, when it returns nil, or until it is lost, when
// it returns [ErrPermitLost]. A renewal the store fails is tried again at
// the next third: two in a row may fail before the lease ends. Run it on a
// goroutine of its own for work that may outlast the lease.
func (p *Permit) KeepAlive(ctx context.Context) error {
	ticker := time.NewTicker(max(p.lim.Lease/3, time.Millisecond))
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		err := p.Renew(ctx)
		switch {
		case p.released.Load() || ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrPermitLost):
			return err
		}
	}
}

// holderPrefix makes this process's holders unlike any other's: 12 random
// bytes, so two processes share one with a chance of 2^-96.
var holderPrefix = func() string {
	var b [12]byte
	_, _ = crypto.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:]) + "."
}()

var holderSeq atomic.Uint64

// newHolder returns a holder no other permit, of any process, has.
func newHolder() string {
	// One allocation: the digits go after the prefix in a buffer the
	// string is made of, not into a string of their own first.
	var b [64]byte // the prefix's 25 bytes and at most 13 base-36 digits
	return string(strconv.AppendUint(append(b[:0], holderPrefix...), holderSeq.Add(1), 36))
}

// Hold calls fn holding the permit, and releases it when fn returns or
// panics (the panic then goes on up unchanged): what middleware does with
// a request's permit. While fn runs past a third of the lease, the permit
// is renewed then and every third of a lease after, as [Permit.KeepAlive]
// does, on a goroutine a timer starts: an fn that returns sooner costs a
// timer and no goroutine, and fn's end stops the renewals and waits for
// them. A permit lost meanwhile (the store away for a whole lease) is not
// renewed again; fn runs on without it. The renewals and the release use
// context.WithoutCancel(ctx), so that a request whose client went away
// still gives its permit back; a release the store fails is left to the
// lease.
func (p *Permit) Hold(ctx context.Context, fn func()) {
	ctx = context.WithoutCancel(ctx)
	defer func() { _ = p.Release(ctx) }()
	defer p.keepAliveFromAThird(ctx)()
	fn()
}

// keepAliveFromAThird renews p from a third of its lease on, and returns
// the function that stops the renewals and waits for them to end.
func (p *Permit) keepAliveFromAThird(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	t := time.AfterFunc(p.lim.Lease/3, func() {
		defer close(done)
		// A renewal now, then one every third of a lease: as if
		// KeepAlive had run since the acquire, so that two renewals in a
		// row may fail before the lease ends.
		if err := p.Renew(ctx); errors.Is(err, ErrPermitLost) {
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
