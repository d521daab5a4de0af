package main

import (
	"context"
	"errors"
	"sync"

	"github.com/sluicehq/sluice/failpolicy"
	sluiceotel "github.com/sluicehq/sluice/otel"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/sharding"
)

// failModes maps each fail mode of rlsconfig.FailModes that puts a fail
// policy in front of Redis to its failpolicy.Mode; "error" has none.
var failModes = map[string]failpolicy.Mode{
	"open":   failpolicy.Open,
	"closed": failpolicy.Closed,
	"local":  failpolicy.Local,
}

// stacks are the backends the server decides with: for each fail mode and
// sub-bucket count in use, sluice's layers over the one store (otel
// outermost, then sharding, then the fail policy), made when first asked
// for. There are at most len(failModes)+1 modes and
// sharding.MaxSubBuckets counts.
type stacks struct {
	store     ratelimit.Backend
	remote    bool // the store is Redis: the fail policy applies
	telemetry []sluiceotel.Option
	policy    []failpolicy.Option

	mu    sync.Mutex
	built sync.Map // stackKey → *ratelimit.Stacked, or broken
}

type stackKey struct {
	mode   string
	shards int
}

// backend returns the backend of fail mode mode, splitting each bucket
// into shards sub-buckets when shards > 1. A stack that cannot be built
// (a bad option, which the flags' checks keep out) is broken, whose
// decisions fail with its error; Close returns that error too.
func (s *stacks) backend(mode string, shards int) ratelimit.Backend {
	k := stackKey{mode, shards}
	if b, ok := s.built.Load(k); ok {
		return b.(ratelimit.Backend)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.built.Load(k); ok {
		return b.(ratelimit.Backend)
	}
	layers := []ratelimit.Layer{sluiceotel.Layer(s.telemetry...)}
	if shards > 1 {
		layers = append(layers, sharding.Layer(sharding.Match(shards, func(string) bool { return true })))
	}
	if m, ok := failModes[mode]; ok && s.remote {
		layers = append(layers, failpolicy.Layer(m, s.policy...))
	}
	var b ratelimit.Backend
	stacked, err := ratelimit.Stack(s.store, layers...)
	if err != nil {
		b = broken{err}
	} else {
		b = stacked
	}
	s.built.Store(k, b)
	return b
}

// Close closes every stack's layers (not the store), and returns their
// errors and those of the stacks that could not be built.
func (s *stacks) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	s.built.Range(func(_, v any) bool {
		switch b := v.(type) {
		case *ratelimit.Stacked:
			errs = append(errs, b.Close())
		case broken:
			errs = append(errs, b.err)
		}
		return true
	})
	s.built.Clear()
	return errors.Join(errs...)
}

// broken is the backend of a stack that could not be built: every
// decision fails with its error.
type broken struct{ err error }

func (b broken) Do(context.Context, string, ratelimit.Config, ratelimit.Request) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, b.err
}
