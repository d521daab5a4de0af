package lease_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/ratelimit"
)

// DoPermit records a permit call that reaches r, as Do does, and passes
// it to next.
func (r *recorder) DoPermit(ctx context.Context, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	r.mu.Lock()
	r.ops = append(r.ops, req.Op.String()+" "+key)
	r.mu.Unlock()
	return ratelimit.Permits(r.next).DoPermit(ctx, key, lim, req)
}

// TestPermitsPassThrough: permit calls go to the store as they came, each
// once, and get its decisions: on a leased key that holds a lease as on a
// key no rule matches, and after Close.
func TestPermitsPassThrough(t *testing.T) {
	b, rec, clock := setup(t)
	for range 5 { // a lease held
		do(t, b, "hot", perSecond, consume)
		clock.Advance(time.Millisecond)
	}
	rec.take()
	lim := ratelimit.InFlight(2, time.Minute)
	req := func(op ratelimit.PermitOp, holder string) ratelimit.PermitRequest {
		return ratelimit.PermitRequest{Op: op, Holder: holder, Weight: 1}
	}
	steps := []struct {
		req  ratelimit.PermitRequest
		want ratelimit.PermitDecision
	}{
		{req(ratelimit.PermitAcquire, "a"), ratelimit.PermitDecision{Granted: true, Limit: 2, InFlight: 1}},
		{req(ratelimit.PermitAcquire, "b"), ratelimit.PermitDecision{Granted: true, Limit: 2, InFlight: 2}},
		{req(ratelimit.PermitAcquire, "c"), ratelimit.PermitDecision{Limit: 2, InFlight: 2, RetryAfter: time.Minute}},
		{req(ratelimit.PermitRenew, "a"), ratelimit.PermitDecision{Granted: true, Limit: 2, InFlight: 2}},
		{req(ratelimit.PermitRelease, "a"), ratelimit.PermitDecision{Granted: true, Limit: 2, InFlight: 1}},
		{req(ratelimit.PermitRelease, "a"), ratelimit.PermitDecision{Limit: 2, InFlight: 1}},
		{req(ratelimit.PermitInspect, ""), ratelimit.PermitDecision{Granted: true, Limit: 2, InFlight: 1}},
	}
	run := func(key string) {
		t.Helper()
		for i, s := range steps {
			d, err := b.DoPermit(ctx, key, lim, s.req)
			if err != nil || d != s.want {
				t.Errorf("%s, step %d, %v %q: %+v, %v; want %+v", key, i, s.req.Op, s.req.Holder, d, err, s.want)
			}
			if got, want := rec.take(), []string{s.req.Op.String() + " " + key}; !slices.Equal(got, want) {
				t.Errorf("%s, step %d: the store saw %q; want %q", key, i, got, want)
			}
		}
	}
	run("hot")
	run("cold")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if d, err := b.DoPermit(ctx, "hot", lim, req(ratelimit.PermitRelease, "b")); err != nil || !d.Granted {
		t.Errorf("a Release after Close: %+v, %v; want granted by the store", d, err)
	}
}

// rateOnly is a Backend that holds no permits.
type rateOnly struct{ ratelimit.Backend }

// TestPermitsUnsupported: over a Backend that holds no permits, a permit
// call fails with errors.ErrUnsupported.
func TestPermitsUnsupported(t *testing.T) {
	_, rec, _ := setup(t)
	b, err := lease.New(rateOnly{rec}, lease.Keys("hot"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	req := ratelimit.PermitRequest{Op: ratelimit.PermitAcquire, Holder: "a", Weight: 1}
	if _, err := b.DoPermit(ctx, "hot", ratelimit.InFlight(2, time.Minute), req); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("%v; want errors.ErrUnsupported", err)
	}
}
