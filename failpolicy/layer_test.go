package failpolicy_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestLayer: Layer's place is PlaceFailPolicy, and its Wrap is Wrap's
// with the mode and a copy of the options.
func TestLayer(t *testing.T) {
	s := newStore(t, nil)
	opts := []failpolicy.Option{failpolicy.WithRetryAfter(7 * time.Second)}
	l := failpolicy.Layer(failpolicy.Closed, opts...)
	opts[0] = failpolicy.WithRetryAfter(time.Second)
	if p := l.Place(); p != ratelimit.PlaceFailPolicy {
		t.Errorf("Place() = %v; want %v", p, ratelimit.PlaceFailPolicy)
	}
	next, err := l.Wrap(s)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := next.(*failpolicy.Backend)
	if !ok {
		t.Fatalf("Wrap returned %T; want a *failpolicy.Backend", next)
	}
	defer p.Close()
	s.fail(errDown)
	want := ratelimit.Decision{Degraded: true, Limit: 10, RetryAfter: 7 * time.Second}
	if d := do(t, p, consume); d != want {
		t.Errorf("with the store down: %+v; want Closed's denial with the option's RetryAfter, %+v", d, want)
	}
}

// TestLayerErrors: a bad mode or option is Wrap's error, and no Backend.
func TestLayerErrors(t *testing.T) {
	s := newStore(t, nil)
	for _, tt := range []struct {
		l    ratelimit.Layer
		next ratelimit.Backend
		want string
	}{
		{failpolicy.Layer(failpolicy.Mode(9)), s, "failpolicy: mode Mode(9) is not Open, Closed or Local"},
		{failpolicy.Layer(failpolicy.Local, failpolicy.WithTimeout(0)), s, "failpolicy: WithTimeout 0s is not positive"},
		{failpolicy.Layer(failpolicy.Open), nil, "failpolicy: the next Backend is nil"},
	} {
		next, err := tt.l.Wrap(tt.next)
		if next != nil || !errors.Is(err, ratelimit.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Wrap: %v, %v; want nil and ErrInvalidConfig: %q", next, err, tt.want)
		}
	}
}

// TestLayerStackClose: in a Stack, the policy is closed with the stack
// (its Local buckets dropped, so a degraded request is then denied), and
// the store is not.
func TestLayerStackClose(t *testing.T) {
	s := newStore(t, nil)
	stacked, err := ratelimit.Stack(s, failpolicy.Layer(failpolicy.Local))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s.fail(errDown)
	if d, err := stacked.Do(ctx, "k", perMinute, consume); err != nil || !d.Allowed || !d.Degraded {
		t.Fatalf("with the store down: %+v, %v; want the Local share's admission", d, err)
	}
	if err := stacked.Close(); err != nil {
		t.Fatal(err)
	}
	if d, err := stacked.Do(ctx, "k", perMinute, consume); err != nil || d.Allowed || !d.Degraded {
		t.Errorf("after Close, with the store down: %+v, %v; want a degraded denial, the Local buckets gone", d, err)
	}
	s.heal()
	if d, err := stacked.Do(ctx, "k", perMinute, consume); err != nil || !d.Allowed || d.Degraded {
		t.Errorf("after Close, with the store back: %+v, %v; want the store's admission, the store still open", d, err)
	}
}
