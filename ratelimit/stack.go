package ratelimit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
)

// Place is where a [Layer] goes in a [Stack]: a layer of a lower Place
// wraps a Backend closer to the store.
type Place uint8

// The places of sluice's decorators, from the store out. The fail policy
// sits next to the store, so that its deadline and breakers judge each
// store call, a sharded key's sub-bucket calls each on its own; sharding
// above it, so that a sub-bucket the policy gave up on moves the request
// on to the next; leasing above sharding, so that a lease of a split key
// is taken from its sub-buckets; telemetry outermost, so that it sees each
// decision as the caller gets it, Degraded included.
const (
	PlaceFailPolicy Place = 10
	PlaceSharding   Place = 20
	PlaceLeasing    Place = 25
	PlaceTelemetry  Place = 30
)

var placeNames = map[Place]string{PlaceFailPolicy: "fail policy", PlaceSharding: "sharding", PlaceLeasing: "leasing", PlaceTelemetry: "telemetry"}

// String names the place.
func (p Place) String() string {
	if n, ok := placeNames[p]; ok {
		return n
	}
	return fmt.Sprintf("Place(%d)", uint8(p))
}

// A Layer is a [Backend] decorator that [Stack] puts in its place: what
// failpolicy.Layer, sharding.Layer, lease.Layer and the otel module's
// Layer return.
type Layer interface {
	// Place says where the layer goes.
	Place() Place
	// Wrap returns the layer's decorator over next, or an error saying
	// what is wrong with the layer's settings.
	Wrap(next Backend) (Backend, error)
}

// Stacked is a store Backend with decorators around it, built by [Stack].
// It is safe for concurrent use.
type Stacked struct {
	top    Backend
	layers []Backend // the decorators, from the store out
}

var _ Backend = (*Stacked)(nil)

// Stack wraps store in layers, each in its [Place] whatever the order they
// are given in, so that
//
//	backend, err := ratelimit.Stack(redisBackend,
//		sluiceotel.Layer(),
//		failpolicy.Layer(failpolicy.Local, failpolicy.WithInstances(4)),
//		sharding.Layer(sharding.Keys(6, "global")),
//	)
//	limiter := ratelimit.New(backend)
//
// decides through the telemetry, then sharding, then the fail policy,
// then the store. Two layers of one Place, a nil store or layer, or a
// layer whose settings are wrong is an error wrapping [ErrInvalidConfig]
// that names the layer; the layers already built are then closed, and
// two layers of one Place are refused before any is built.
func Stack(store Backend, layers ...Layer) (*Stacked, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: Stack: the store Backend is nil", ErrInvalidConfig)
	}
	for i, l := range layers {
		if l == nil {
			return nil, fmt.Errorf("%w: Stack: layer %d is nil", ErrInvalidConfig, i)
		}
	}
	sorted := slices.SortedStableFunc(slices.Values(layers), func(a, b Layer) int { return cmp.Compare(a.Place(), b.Place()) })
	for i := 1; i < len(sorted); i++ {
		if p := sorted[i].Place(); p == sorted[i-1].Place() {
			return nil, fmt.Errorf("%w: Stack: two %v layers", ErrInvalidConfig, p)
		}
	}
	s := &Stacked{top: store}
	for _, l := range sorted {
		next, err := l.Wrap(s.top)
		if err == nil && next == nil {
			err = errors.New("it returned a nil Backend")
		}
		if err != nil {
			err = errors.Join(err, s.Close())
			if !errors.Is(err, ErrInvalidConfig) {
				err = fmt.Errorf("%w: %w", ErrInvalidConfig, err)
			}
			return nil, fmt.Errorf("ratelimit: Stack: the %v layer: %w", l.Place(), err)
		}
		if !same(next, s.top) {
			s.layers = append(s.layers, next)
		}
		s.top = next
	}
	return s, nil
}

// same reports whether a and b are one Backend: a layer with nothing to
// do may hand back the Backend it was given, which is then not a layer
// of the stack's own for Close to close (it may be the store). Values of
// a type that cannot be compared are never the same.
func same(a, b Backend) bool {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	return va.Type() == vb.Type() && va.Comparable() && va.Equal(vb)
}

// Unwrap returns the outermost layer, or the store if there is none, so
// that a decorator over s can find the store below, as it does through
// the Unwrap methods of sluice's decorators.
func (s *Stacked) Unwrap() Backend { return s.top }

// Do decides req through the layers and the store.
func (s *Stacked) Do(ctx context.Context, key string, cfg Config, req Request) (Decision, error) {
	return s.top.Do(ctx, key, cfg, req)
}

// Close closes each layer that holds resources (an [io.Closer], as the
// fail policy's Local mode is), from the outermost in, and returns their
// errors joined. It does not close the store, which is the caller's, nor
// a Backend that a layer handed back as it was given it.
func (s *Stacked) Close() error {
	var errs []error
	for _, l := range slices.Backward(s.layers) {
		if c, ok := l.(io.Closer); ok {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// DoPermit applies req through the layers and the store, which must hold
// permits (see [PermitBackend]).
func (s *Stacked) DoPermit(ctx context.Context, key string, lim Concurrency, req PermitRequest) (PermitDecision, error) {
	return Permits(s.top).DoPermit(ctx, key, lim, req)
}
