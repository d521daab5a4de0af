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

// New returns a Limiter deciding with b.
func New(b Backend, opts ...Option) *Limiter {
	l := &Limiter{backend: b, strategy: DefaultInheritance}
	for _, opt := range opts {
		opt(l)
	}
	return l
}

// Allow takes one token from the bucket at key, built from cfg if it does
// not exist. It is shorthand for AllowN(ctx, key, cfg, 1).
func (l *Limiter) Allow(ctx context.Context, key string, cfg Config) (Decision, error) {
	return l.AllowN(ctx, key, cfg, 1)
}

// AllowN takes n tokens from the bucket at key if every bandwidth has them;
// otherwise it takes nothing and the decision says when to retry.
func (l *Limiter) AllowN(ctx context.Context, key string, cfg Config, n int64) (Decision, error) {
	return l.do(ctx, key, cfg, Request{Op: Consume, Tokens: n})
}

// Bucket returns a handle on the bucket at key whose config comes from
// supply, called once per operation. A supplier backed by a cache (see
// sluice/plans) makes a plan change apply on the next request.
func (l *Limiter) Bucket(key string, supply func(context.Context) (Config, error)) *Bucket {
	return &Bucket{limiter: l, key: key, supply: supply}
}

// do sends req to the backend, with the Limiter's strategy for a changed
// config unless req is a Replace that names its own.
func (l *Limiter) do(ctx context.Context, key string, cfg Config, req Request) (Decision, error) {
	if l.backend == nil {
		return Decision{}, fmt.Errorf("%w: Limiter has no Backend", ErrBackendUnavailable)
	}
	if req.Op != Replace {
		req.Strategy = l.strategy
	}
	return l.backend.Do(ctx, key, cfg, req)
}
