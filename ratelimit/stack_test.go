package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/sluicehq/sluice/ratelimit"
)

// events is what a stack's fakes did, in order.
type events []string

func (ev *events) add(format string, args ...any) { *ev = append(*ev, fmt.Sprintf(format, args...)) }

// take returns the events so far, and forgets them.
func (ev *events) take() []string {
	log := *ev
	*ev = nil
	return log
}

// fakeStore is a store that logs its calls and its Close, and stamps its
// decisions "store".
type fakeStore struct{ ev *events }

func (s fakeStore) Do(context.Context, string, ratelimit.Config, ratelimit.Request) (ratelimit.Decision, error) {
	s.ev.add("do store")
	return ratelimit.Decision{Allowed: true, Bandwidth: "store"}, nil
}

func (s fakeStore) Close() error {
	s.ev.add("close store")
	return nil
}

// fakeLayer is a Layer at place whose Wrap logs what it wraps and returns
// a fakeDecorator, or err, or with pass, next as it is.
type fakeLayer struct {
	place    ratelimit.Place
	ev       *events
	err      error
	nilValue bool  // Wrap returns nil, nil
	pass     bool  // Wrap returns next
	closer   bool  // the decorator is an io.Closer
	closeErr error // what its Close returns
}

func (l fakeLayer) Place() ratelimit.Place { return l.place }

func (l fakeLayer) Wrap(next ratelimit.Backend) (ratelimit.Backend, error) {
	l.ev.add("wrap %v over %v", l.place, name(next))
	switch {
	case l.err != nil:
		return nil, l.err
	case l.nilValue:
		return nil, nil
	case l.pass:
		return next, nil
	}
	d := &fakeDecorator{place: l.place, next: next, ev: l.ev}
	if l.closer {
		return &closingDecorator{fakeDecorator: d, err: l.closeErr}, nil
	}
	return d, nil
}

// fakeDecorator logs its calls and appends its place to the decision's
// Bandwidth, so that the decision says which layers it passed, from the
// store out.
type fakeDecorator struct {
	place ratelimit.Place
	next  ratelimit.Backend
	ev    *events
}

func (d *fakeDecorator) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	d.ev.add("do %v", d.place)
	dec, err := d.next.Do(ctx, key, cfg, req)
	dec.Bandwidth += " < " + d.place.String()
	return dec, err
}

type closingDecorator struct {
	*fakeDecorator
	err error
}

func (d *closingDecorator) Close() error {
	d.ev.add("close %v", d.place)
	return d.err
}

// name is what a fake Backend is: "store", or a decorator's place.
func name(b ratelimit.Backend) string {
	switch b := b.(type) {
	case fakeStore:
		return "store"
	case *fakeDecorator:
		return b.place.String()
	case *closingDecorator:
		return b.place.String()
	}
	return fmt.Sprintf("%T", b)
}

var (
	stackCfg = ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1)}}
	stackReq = ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}
)

// TestStackOrder: whatever the order the layers are given in, each wraps
// the one of the next lower Place, the lowest the store, and a decision
// passes them from the highest Place down.
func TestStackOrder(t *testing.T) {
	places := []ratelimit.Place{ratelimit.PlaceFailPolicy, ratelimit.PlaceSharding, ratelimit.PlaceLeasing, ratelimit.PlaceTelemetry}
	wantWraps := []string{"wrap fail policy over store", "wrap sharding over fail policy", "wrap leasing over sharding", "wrap telemetry over leasing"}
	wantDo := []string{"do telemetry", "do leasing", "do sharding", "do fail policy", "do store"}
	for _, order := range permutations(len(places)) {
		t.Run(fmt.Sprint(order), func(t *testing.T) {
			ev := new(events)
			var layers []ratelimit.Layer
			for _, i := range order {
				layers = append(layers, fakeLayer{place: places[i], ev: ev})
			}
			s, err := ratelimit.Stack(fakeStore{ev}, layers...)
			if err != nil {
				t.Fatal(err)
			}
			if got := ev.take(); !slices.Equal(got, wantWraps) {
				t.Errorf("wrapped\n\t%q\nwant\n\t%q", got, wantWraps)
			}
			d, err := s.Do(context.Background(), "k", stackCfg, stackReq)
			if want := "store < fail policy < sharding < leasing < telemetry"; err != nil || d.Bandwidth != want {
				t.Errorf("Do: %+v, %v; want the decision stamped %q", d, err, want)
			}
			if got := ev.take(); !slices.Equal(got, wantDo) {
				t.Errorf("Do called\n\t%q\nwant\n\t%q", got, wantDo)
			}
		})
	}
}

// permutations returns every order of 0..n-1.
func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := range n {
			q := slices.Insert(slices.Clone(p), i, n-1)
			out = append(out, q)
		}
	}
	return out
}

// TestStackNoLayers: with no layers, the stack is the store.
func TestStackNoLayers(t *testing.T) {
	ev := new(events)
	s, err := ratelimit.Stack(fakeStore{ev})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := s.Do(context.Background(), "k", stackCfg, stackReq); err != nil || d.Bandwidth != "store" {
		t.Errorf("Do: %+v, %v; want the store's decision", d, err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if got, want := ev.take(), []string{"do store"}; !slices.Equal(got, want) {
		t.Errorf("logged %q; want %q, the store not closed", got, want)
	}
}

// TestStackRefuses: a nil store or layer, or two layers of one Place, is
// an error wrapping ErrInvalidConfig that names it, before any layer is
// built.
func TestStackRefuses(t *testing.T) {
	ev := new(events)
	closer := func(p ratelimit.Place) ratelimit.Layer { return fakeLayer{place: p, ev: ev, closer: true} }
	tests := []struct {
		name   string
		store  ratelimit.Backend
		layers []ratelimit.Layer
		want   string
	}{
		{"NilStore", nil, []ratelimit.Layer{closer(ratelimit.PlaceSharding)}, "ratelimit: invalid config: Stack: the store Backend is nil"},
		{"NilLayer", fakeStore{ev}, []ratelimit.Layer{closer(ratelimit.PlaceSharding), nil}, "ratelimit: invalid config: Stack: layer 1 is nil"},
		{"TwoSharding", fakeStore{ev}, []ratelimit.Layer{
			closer(ratelimit.PlaceSharding), closer(ratelimit.PlaceFailPolicy), closer(ratelimit.PlaceTelemetry), closer(ratelimit.PlaceSharding),
		}, "ratelimit: invalid config: Stack: two sharding layers"},
		{"TwoFailPolicies", fakeStore{ev}, []ratelimit.Layer{closer(ratelimit.PlaceFailPolicy), closer(ratelimit.PlaceFailPolicy)}, "ratelimit: invalid config: Stack: two fail policy layers"},
		{"TwoUnnamed", fakeStore{ev}, []ratelimit.Layer{closer(40), closer(40)}, "ratelimit: invalid config: Stack: two Place(40) layers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := ratelimit.Stack(tt.store, tt.layers...)
			if s != nil || !errors.Is(err, ratelimit.ErrInvalidConfig) || err.Error() != tt.want {
				t.Errorf("Stack: %v, %v; want nil and %q", s, err, tt.want)
			}
			if got := ev.take(); len(got) != 0 {
				t.Errorf("logged %q; want no layer built", got)
			}
		})
	}
}

// TestStackLayerFails: a layer whose Wrap fails makes an error wrapping
// ErrInvalidConfig and the layer's own, naming the layer; the layers
// built below it are closed, and none above it is built.
func TestStackLayerFails(t *testing.T) {
	errBad := errors.New("sharding: rule 0: n must be between 2 and 64")
	errClose := errors.New("fail policy: close failed")
	tests := []struct {
		name     string
		sharding fakeLayer
		closeErr error
		want     string
		wantIs   []error
	}{
		{"Error", fakeLayer{err: errBad}, nil,
			"ratelimit: Stack: the sharding layer: ratelimit: invalid config: sharding: rule 0: n must be between 2 and 64", []error{errBad}},
		{"InvalidConfig", fakeLayer{err: fmt.Errorf("%w: %w", ratelimit.ErrInvalidConfig, errBad)}, nil,
			"ratelimit: Stack: the sharding layer: ratelimit: invalid config: sharding: rule 0: n must be between 2 and 64", []error{errBad}},
		{"NilBackend", fakeLayer{nilValue: true}, nil,
			"ratelimit: Stack: the sharding layer: ratelimit: invalid config: it returned a nil Backend", nil},
		{"CloseFails", fakeLayer{err: errBad}, errClose,
			"ratelimit: Stack: the sharding layer: ratelimit: invalid config: sharding: rule 0: n must be between 2 and 64\nfail policy: close failed", []error{errBad, errClose}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := new(events)
			sharding := tt.sharding
			sharding.place, sharding.ev = ratelimit.PlaceSharding, ev
			s, err := ratelimit.Stack(fakeStore{ev},
				fakeLayer{place: ratelimit.PlaceTelemetry, ev: ev, closer: true},
				sharding,
				fakeLayer{place: ratelimit.PlaceFailPolicy, ev: ev, closer: true, closeErr: tt.closeErr},
			)
			if s != nil || err == nil || err.Error() != tt.want {
				t.Fatalf("Stack: %v, %v; want nil and\n\t%q", s, err, tt.want)
			}
			for _, target := range append(tt.wantIs, ratelimit.ErrInvalidConfig) {
				if !errors.Is(err, target) {
					t.Errorf("the error does not wrap %q", target)
				}
			}
			want := []string{"wrap fail policy over store", "wrap sharding over fail policy", "close fail policy"}
			if got := ev.take(); !slices.Equal(got, want) {
				t.Errorf("logged\n\t%q\nwant\n\t%q", got, want)
			}
		})
	}
}

// TestStackClose: Close closes the layers that are io.Closers, from the
// outermost in, and returns their errors joined; not the layers that are
// none, not a Backend a layer handed back as it was given it, and never
// the store.
func TestStackClose(t *testing.T) {
	ev := new(events)
	errTelemetry, errFail := errors.New("telemetry: flush failed"), errors.New("fail policy: close failed")
	s, err := ratelimit.Stack(fakeStore{ev},
		fakeLayer{place: ratelimit.PlaceSharding, ev: ev},
		fakeLayer{place: ratelimit.PlaceTelemetry, ev: ev, closer: true, closeErr: errTelemetry},
		fakeLayer{place: ratelimit.Place(5), ev: ev, pass: true},     // over the store, itself a closer
		fakeLayer{place: ratelimit.PlaceLeasing, ev: ev, pass: true}, // over sharding
		fakeLayer{place: ratelimit.PlaceFailPolicy, ev: ev, closer: true, closeErr: errFail},
	)
	if err != nil {
		t.Fatal(err)
	}
	ev.take()
	if d, err := s.Do(context.Background(), "k", stackCfg, stackReq); err != nil || d.Bandwidth != "store < fail policy < sharding < telemetry" {
		t.Errorf("Do: %+v, %v; want the pass-through layers left out", d, err)
	}
	ev.take()
	err = s.Close()
	if !errors.Is(err, errTelemetry) || !errors.Is(err, errFail) || err.Error() != "telemetry: flush failed\nfail policy: close failed" {
		t.Errorf("Close: %v; want both layers' errors, outermost first", err)
	}
	if got, want := ev.take(), []string{"close telemetry", "close fail policy"}; !slices.Equal(got, want) {
		t.Errorf("closed %q; want %q", got, want)
	}

	s, err = ratelimit.Stack(fakeStore{ev}, fakeLayer{place: ratelimit.PlaceSharding, ev: ev, closer: true})
	if err != nil {
		t.Fatal(err)
	}
	ev.take()
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if got, want := ev.take(), []string{"close sharding"}; !slices.Equal(got, want) {
		t.Errorf("closed %q; want %q", got, want)
	}
}

// uncomparable is a Backend whose values == would panic on.
type uncomparable struct {
	fakeStore
	label string
	_     []int
}

func (u uncomparable) Close() error {
	u.ev.add("close %s", u.label)
	return nil
}

// TestStackUncomparable: a store or layer whose type cannot be compared
// is stacked, and closed, as any other.
func TestStackUncomparable(t *testing.T) {
	ev := new(events)
	s, err := ratelimit.Stack(uncomparable{fakeStore: fakeStore{ev}, label: "store"}, uncomparableLayer{fakeStore{ev}})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := s.Do(context.Background(), "k", stackCfg, stackReq); err != nil || d.Bandwidth != "store" {
		t.Errorf("Do: %+v, %v; want the store's decision", d, err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if got, want := ev.take(), []string{"do store", "close layer"}; !slices.Equal(got, want) {
		t.Errorf("logged %q; want %q: the layer's own Backend closed, not the store", got, want)
	}
}

// uncomparableLayer hands back an uncomparable of its own over an
// uncomparable store.
type uncomparableLayer struct{ fakeStore fakeStore }

func (uncomparableLayer) Place() ratelimit.Place { return ratelimit.PlaceTelemetry }

func (l uncomparableLayer) Wrap(next ratelimit.Backend) (ratelimit.Backend, error) {
	if _, ok := next.(uncomparable); !ok {
		return nil, fmt.Errorf("next is %T", next)
	}
	return uncomparable{fakeStore: l.fakeStore, label: "layer"}, nil
}

// TestLimiterOverStack: a Limiter over a stack decides through every
// layer, in order, as the stack does (New calls its top layer directly),
// and over a stack with no layers, through the store.
func TestLimiterOverStack(t *testing.T) {
	ev := new(events)
	s, err := ratelimit.Stack(fakeStore{ev}, fakeLayer{place: ratelimit.PlaceTelemetry, ev: ev}, fakeLayer{place: ratelimit.PlaceFailPolicy, ev: ev})
	if err != nil {
		t.Fatal(err)
	}
	ev.take()
	d, err := ratelimit.New(s).Allow(context.Background(), "k", stackCfg)
	if want := "store < fail policy < telemetry"; err != nil || d.Bandwidth != want {
		t.Errorf("Allow: %+v, %v; want the decision stamped %q", d, err, want)
	}
	if got, want := ev.take(), []string{"do telemetry", "do fail policy", "do store"}; !slices.Equal(got, want) {
		t.Errorf("Do called\n\t%q\nwant\n\t%q", got, want)
	}
	bare, err := ratelimit.Stack(fakeStore{ev})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := ratelimit.New(bare).Allow(context.Background(), "k", stackCfg); err != nil || d.Bandwidth != "store" {
		t.Errorf("Allow with no layers: %+v, %v; want the store's decision", d, err)
	}
}
