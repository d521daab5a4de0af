package ratelimit

import (
	"context"
	"fmt"
)

// DefaultInheritance is the strategy a [Limiter] uses when a bucket's config
// changes, unless [WithInheritance] says otherwise.
const DefaultInheritance = AsIs

// Limiter makes rate-limit decisions against a [Backend]. It is safe for
// concurrent use. Create one with [New] and share it.
type Limiter struct {
	backend  Backend
	strategy Inheritance
}

// Option configures a [Limiter].
type Option func(*Limiter)

// WithInheritance sets how a bucket's tokens carry over when the config
// passed for its key changes (a customer changes plan). The default is
// [DefaultInheritance].
func WithInheritance(s Inheritance) Option {
	return func(l *Limiter) { l.strategy = s }
}

// New returns a Limiter deciding with b. With a nil b, every call fails
// with [ErrBackendUnavailable].
func New(b Backend, opts ...Option) *Limiter {
	if b == nil {
		b = noBackend{}
	}
	if s, ok := b.(*Stacked); ok {
		// A Stacked only hands each call to its top layer: calling that
		// one saves a layer of calls (tens of nanoseconds a decision).
		b = s.top
	}
	l := &Limiter{backend: b, strategy: DefaultInheritance}
	for _, opt := range opts {
		opt(l)
	}
	return l
}

// Allow takes one token from the bucket at key, built from cfg if it does
// not exist. It is shorthand for AllowN(ctx, key, cfg, 1).
func (l *Limiter) Allow(ctx context.Context, key string, cfg Config) (Decision, error) {
	// Allow and AllowN each call Do themselves, and leave out the Op, as
	// Consume is the zero Op: so each is cheap enough for the compiler to
	// inline into its caller, which spares every decision a call and a
	// copy of its Decision (5-10% of an in-memory decision).
	return l.backend.Do(ctx, key, cfg, Request{Tokens: 1, Strategy: l.strategy})
}

// AllowN takes n tokens from the bucket at key if every bandwidth has them;
// otherwise it takes nothing and the decision says when to retry.
func (l *Limiter) AllowN(ctx context.Context, key string, cfg Config, n int64) (Decision, error) {
	return l.backend.Do(ctx, key, cfg, Request{Tokens: n, Strategy: l.strategy})
}

// Bucket returns a handle on the bucket at key whose config comes from
// supply, called once per operation. A supplier that reads plans from a
// store behind a cache, such as the Supplier of sluice/plans' Cache,
// makes a plan change apply on the next request; give its configs the
// plan's [Config.Version] so that the change goes forward only.
func (l *Limiter) Bucket(key string, supply func(context.Context) (Config, error)) *Bucket {
	return &Bucket{limiter: l, key: key, supply: supply}
}

// noBackend stands in for a nil Backend passed to New.
type noBackend struct{}

func (noBackend) Do(context.Context, string, Config, Request) (Decision, error) {
	return Decision{}, fmt.Errorf("%w: Limiter has no Backend", ErrBackendUnavailable)
}

func (noBackend) DoPermit(_ context.Context, key string, lim Concurrency, req PermitRequest) (PermitDecision, error) {
	if err := CheckPermit(key, lim, req); err != nil {
		return PermitDecision{}, err
	}
	return PermitDecision{}, fmt.Errorf("%w: Limiter has no Backend", ErrBackendUnavailable)
}
