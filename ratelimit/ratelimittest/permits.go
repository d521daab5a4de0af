package ratelimittest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// permitScenarios check a [ratelimit.PermitBackend]'s concurrency permits:
// exact counts, owner identity, weights, leases that end on the store's
// clock, renewal, a lowered limit, bad input, the caller's context,
// concurrent holders and the Limiter's handles. Run runs them when
// [Harness.Permits] is set. Under ServerClock the leases that must end
// are a few hundred milliseconds, slept past, and those that must not a
// day, so that no scenario depends on how fast it runs.
var permitScenarios = []scenario{
	{name: "Counts", run: testPermitCounts},
	{name: "Owner", run: testPermitOwner},
	{name: "Reacquire", run: testPermitReacquire},
	{name: "Weights", run: testPermitWeights},
	{name: "LeaseEnds", run: testPermitLeaseEnds},
	{name: "LeaseEndsExact", fakeClock: true, run: testPermitLeaseEndsExact},
	{name: "Renew", run: testPermitRenew},
	{name: "LimitLowered", run: testPermitLimitLowered},
	{name: "BadInput", run: testPermitBadInput},
	{name: "Context", run: testPermitContext},
	{name: "Concurrent", run: testPermitConcurrent},
	{name: "Keys", run: testPermitKeys},
	{name: "Handles", run: testPermitHandles},
	{name: "Wait", run: testPermitWait},
}

// day is the lease of permits that must outlive their scenario.
const day = 24 * time.Hour

// shortLease is, under ServerClock, the lease of permits whose end a
// scenario sleeps past.
const shortLease = 200 * time.Millisecond

// permits returns the scenario's backend as a PermitBackend.
func (e *env) permits(t *testing.T) ratelimit.PermitBackend {
	t.Helper()
	pb, ok := e.backend.(ratelimit.PermitBackend)
	if !ok {
		t.Fatalf("ratelimittest: Harness.Permits is set, but %T is not a ratelimit.PermitBackend", e.backend)
	}
	return pb
}

// pstep is one permit call in a scripted sequence on one key.
type pstep struct {
	advance time.Duration // moved on before the call
	lim     ratelimit.Concurrency
	req     ratelimit.PermitRequest
	want    ratelimit.PermitDecision
}

func acquire(holder string, weight int64) ratelimit.PermitRequest {
	return ratelimit.PermitRequest{Op: ratelimit.PermitAcquire, Holder: holder, Weight: weight}
}

func release(holder string) ratelimit.PermitRequest {
	return ratelimit.PermitRequest{Op: ratelimit.PermitRelease, Holder: holder}
}

func renew(holder string) ratelimit.PermitRequest {
	return ratelimit.PermitRequest{Op: ratelimit.PermitRenew, Holder: holder}
}

func inspectPermits() ratelimit.PermitRequest {
	return ratelimit.PermitRequest{Op: ratelimit.PermitInspect}
}

// doPermit applies req and fails the test on error.
func (e *env) doPermit(t *testing.T, key string, lim ratelimit.Concurrency, req ratelimit.PermitRequest) ratelimit.PermitDecision {
	t.Helper()
	d, err := e.permits(t).DoPermit(context.Background(), key, lim, req)
	if err != nil {
		t.Fatalf("DoPermit(%q, %v %q weight %d): %v", key, req.Op, req.Holder, req.Weight, err)
	}
	return d
}

// checkPermit compares a decision with the one wanted: exactly on the fake
// clock; under ServerClock with RetryAfter allowed to fall short by the
// real time the scenario has run.
func (e *env) checkPermit(t *testing.T, what string, got, want ratelimit.PermitDecision) {
	t.Helper()
	g, w := got, want
	if !e.fake() {
		slack := time.Since(e.started) + time.Millisecond
		if got.RetryAfter <= want.RetryAfter && got.RetryAfter >= want.RetryAfter-slack {
			g.RetryAfter, w.RetryAfter = 0, 0
		}
	}
	if g != w {
		t.Fatalf("%s:\n got %+v\nwant %+v", what, got, want)
	}
}

// psteps runs a sequence of permit calls on key, checking each decision.
func (e *env) psteps(t *testing.T, key string, steps []pstep) {
	t.Helper()
	for i, s := range steps {
		if s.advance != 0 {
			e.advance(s.advance)
		}
		got := e.doPermit(t, key, s.lim, s.req)
		e.checkPermit(t, fmt.Sprintf("step %d (after %v more): %v %q weight %d", i, s.advance, s.req.Op, s.req.Holder, s.req.Weight), got, s.want)
	}
}

// granted and denied are the decisions of the tables below.
func granted(limit, inFlight int64) ratelimit.PermitDecision {
	return ratelimit.PermitDecision{Granted: true, Limit: limit, InFlight: inFlight}
}

func notGranted(limit, inFlight int64) ratelimit.PermitDecision {
	return ratelimit.PermitDecision{Limit: limit, InFlight: inFlight}
}

func full(limit, inFlight int64, retry time.Duration) ratelimit.PermitDecision {
	return ratelimit.PermitDecision{Limit: limit, InFlight: inFlight, RetryAfter: retry}
}

// testPermitCounts: a limit of 3 grants three holders, denies the fourth
// until one releases, and Inspect counts them.
func testPermitCounts(t *testing.T, e *env) {
	lim := ratelimit.InFlight(3, day)
	e.psteps(t, e.key("k"), []pstep{
		{lim: lim, req: inspectPermits(), want: granted(3, 0)},
		{lim: lim, req: acquire("a", 1), want: granted(3, 1)},
		{lim: lim, req: acquire("b", 1), want: granted(3, 2)},
		{lim: lim, req: acquire("c", 1), want: granted(3, 3)},
		{lim: lim, req: acquire("d", 1), want: full(3, 3, day)},
		{lim: lim, req: inspectPermits(), want: notGranted(3, 3)},
		{lim: lim, req: release("b"), want: granted(3, 2)},
		{lim: lim, req: acquire("d", 1), want: granted(3, 3)},
		{lim: lim, req: release("a"), want: granted(3, 2)},
		{lim: lim, req: release("c"), want: granted(3, 1)},
		{lim: lim, req: release("d"), want: granted(3, 0)},
		{lim: lim, req: inspectPermits(), want: granted(3, 0)},
	})
}

// testPermitOwner: a release or renew by a holder that holds nothing (a
// second release, a stranger) is not granted and frees no one's permit.
func testPermitOwner(t *testing.T, e *env) {
	lim := ratelimit.InFlight(2, day)
	e.psteps(t, e.key("k"), []pstep{
		{lim: lim, req: acquire("a", 1), want: granted(2, 1)},
		{lim: lim, req: acquire("b", 1), want: granted(2, 2)},
		{lim: lim, req: release("stranger"), want: notGranted(2, 2)},
		{lim: lim, req: renew("stranger"), want: notGranted(2, 2)},
		{lim: lim, req: release("a"), want: granted(2, 1)},
		{lim: lim, req: release("a"), want: notGranted(2, 1)},
		{lim: lim, req: renew("a"), want: notGranted(2, 1)},
		{lim: lim, req: acquire("c", 1), want: granted(2, 2)},
		{lim: lim, req: release("a"), want: notGranted(2, 2)},
		{lim: lim, req: acquire("d", 1), want: full(2, 2, day)},
	})
	// A release on a key that holds nothing is not granted and creates
	// nothing.
	e.psteps(t, e.key("empty"), []pstep{
		{lim: lim, req: release("a"), want: notGranted(2, 0)},
		{lim: lim, req: renew("a"), want: notGranted(2, 0)},
		{lim: lim, req: inspectPermits(), want: granted(2, 0)},
	})
}

// testPermitReacquire: an acquire sent again by its holder (a retry after
// a timeout) is granted and holds one permit, not two.
func testPermitReacquire(t *testing.T, e *env) {
	lim := ratelimit.InFlight(2, day)
	e.psteps(t, e.key("k"), []pstep{
		{lim: lim, req: acquire("a", 1), want: granted(2, 1)},
		{lim: lim, req: acquire("a", 1), want: granted(2, 1)},
		{lim: lim, req: acquire("b", 1), want: granted(2, 2)},
		{lim: lim, req: acquire("b", 1), want: granted(2, 2)},
		{lim: lim, req: release("a"), want: granted(2, 1)},
		{lim: lim, req: release("a"), want: notGranted(2, 1)},
	})
}

// testPermitWeights: weighted permits count their weight, and a release
// frees all of it.
func testPermitWeights(t *testing.T, e *env) {
	lim := ratelimit.InFlight(5, day)
	e.psteps(t, e.key("k"), []pstep{
		{lim: lim, req: acquire("a", 3), want: granted(5, 3)},
		{lim: lim, req: acquire("b", 3), want: full(5, 3, day)},
		{lim: lim, req: acquire("c", 2), want: granted(5, 5)},
		{lim: lim, req: acquire("d", 1), want: full(5, 5, day)},
		{lim: lim, req: release("a"), want: granted(5, 2)},
		{lim: lim, req: acquire("b", 3), want: granted(5, 5)},
		{lim: lim, req: release("c"), want: granted(5, 3)},
		{lim: lim, req: acquire("e", 5), want: full(5, 3, day)},
		{lim: lim, req: release("b"), want: granted(5, 0)},
		{lim: lim, req: acquire("e", 5), want: granted(5, 5)},
		{lim: lim, req: release("e"), want: granted(5, 0)},
	})
}

// testPermitLeaseEnds: a permit whose lease has ended is reclaimed by the
// next call, and can be neither renewed nor released; the others stay.
func testPermitLeaseEnds(t *testing.T, e *env) {
	lease := shortLease
	if e.fake() {
		lease = time.Minute
	}
	short, long := ratelimit.InFlight(2, lease), ratelimit.InFlight(2, day)
	e.psteps(t, e.key("k"), []pstep{
		{lim: short, req: acquire("a", 1), want: granted(2, 1)},
		{lim: long, req: acquire("b", 1), want: granted(2, 2)},
		{advance: lease + lease/4, lim: long, req: inspectPermits(), want: granted(2, 1)},
		{lim: long, req: renew("a"), want: notGranted(2, 1)},
		{lim: long, req: release("a"), want: notGranted(2, 1)},
		{lim: long, req: acquire("c", 1), want: granted(2, 2)},
		{lim: long, req: release("b"), want: granted(2, 1)},
		{lim: long, req: release("c"), want: granted(2, 0)},
	})
}

// testPermitLeaseEndsExact: on the fake clock, a lease ends at exactly
// its length, and a denial's RetryAfter is exactly the time to the first
// lease's end.
func testPermitLeaseEndsExact(t *testing.T, e *env) {
	lim := ratelimit.InFlight(2, 10*time.Second)
	e.psteps(t, e.key("k"), []pstep{
		{lim: lim, req: acquire("a", 1), want: granted(2, 1)},
		{advance: 3 * time.Second, lim: lim, req: acquire("b", 1), want: granted(2, 2)},
		{advance: 6*time.Second + 999999*time.Microsecond, lim: lim, req: acquire("c", 1), want: full(2, 2, time.Microsecond)},
		{advance: time.Microsecond, lim: lim, req: acquire("c", 1), want: granted(2, 2)},
		{lim: lim, req: acquire("d", 1), want: full(2, 2, 3*time.Second)},
		{advance: 3 * time.Second, lim: lim, req: inspectPermits(), want: granted(2, 1)},
		{advance: 7 * time.Second, lim: lim, req: inspectPermits(), want: granted(2, 0)},
	})
}

// testPermitRenew: a renewal starts the lease afresh, with the lease the
// renewal passes.
func testPermitRenew(t *testing.T, e *env) {
	if !e.fake() {
		// The permit's short lease is renewed with a day's: it outlives
		// the short one.
		short, long := ratelimit.InFlight(1, shortLease), ratelimit.InFlight(1, day)
		e.psteps(t, e.key("k"), []pstep{
			{lim: short, req: acquire("a", 1), want: granted(1, 1)},
			{lim: long, req: renew("a"), want: granted(1, 1)},
			{advance: shortLease + shortLease/4, lim: long, req: inspectPermits(), want: notGranted(1, 1)},
			{lim: long, req: release("a"), want: granted(1, 0)},
		})
		return
	}
	lim := ratelimit.InFlight(1, 10*time.Second)
	e.psteps(t, e.key("k"), []pstep{
		{lim: lim, req: acquire("a", 1), want: granted(1, 1)},
		{advance: 8 * time.Second, lim: lim, req: renew("a"), want: granted(1, 1)},
		{advance: 8 * time.Second, lim: lim, req: acquire("b", 1), want: full(1, 1, 2*time.Second)},
		{advance: 2 * time.Second, lim: lim, req: renew("a"), want: notGranted(1, 0)},
		{lim: lim, req: acquire("b", 1), want: granted(1, 1)},
	})
}

// testPermitLimitLowered: the limit travels with each call; lowered below
// the permits held, it denies until enough are released.
func testPermitLimitLowered(t *testing.T, e *env) {
	three, two := ratelimit.InFlight(3, day), ratelimit.InFlight(2, day)
	e.psteps(t, e.key("k"), []pstep{
		{lim: three, req: acquire("a", 1), want: granted(3, 1)},
		{lim: three, req: acquire("b", 1), want: granted(3, 2)},
		{lim: three, req: acquire("c", 1), want: granted(3, 3)},
		{lim: two, req: acquire("d", 1), want: full(2, 3, day)},
		{lim: two, req: inspectPermits(), want: notGranted(2, 3)},
		{lim: two, req: release("a"), want: granted(2, 2)},
		{lim: two, req: acquire("d", 1), want: full(2, 2, day)},
		{lim: two, req: release("b"), want: granted(2, 1)},
		{lim: two, req: acquire("d", 1), want: granted(2, 2)},
		{lim: three, req: acquire("e", 1), want: granted(3, 3)},
	})
}

// testPermitBadInput: each bad key, limit or request fails with the
// sentinel it names the field under, and changes nothing.
func testPermitBadInput(t *testing.T, e *env) {
	key := e.key("k")
	lim := ratelimit.InFlight(2, day)
	e.psteps(t, key, []pstep{{lim: lim, req: acquire("a", 1), want: granted(2, 1)}})
	cases := []struct {
		name  string
		key   string
		lim   ratelimit.Concurrency
		req   ratelimit.PermitRequest
		want  error
		field string
	}{
		{"EmptyKey", "", lim, acquire("b", 1), ratelimit.ErrInvalidKey, "key"},
		{"LongKey", strings.Repeat("k", ratelimit.MaxKeyLen+1), lim, acquire("b", 1), ratelimit.ErrInvalidKey, "key"},
		{"ZeroLimit", key, ratelimit.InFlight(0, day), acquire("b", 1), ratelimit.ErrInvalidConfig, "Limit"},
		{"NegativeLimit", key, ratelimit.InFlight(-1, day), acquire("b", 1), ratelimit.ErrInvalidConfig, "Limit"},
		{"HugeLimit", key, ratelimit.InFlight(ratelimit.MaxPermits+1, day), acquire("b", 1), ratelimit.ErrInvalidConfig, "Limit"},
		{"ZeroLease", key, ratelimit.InFlight(2, 0), acquire("b", 1), ratelimit.ErrInvalidConfig, "Lease"},
		{"ShortLease", key, ratelimit.InFlight(2, time.Millisecond-time.Microsecond), acquire("b", 1), ratelimit.ErrInvalidConfig, "Lease"},
		{"LongLease", key, ratelimit.InFlight(2, ratelimit.MaxPermitLease+time.Microsecond), acquire("b", 1), ratelimit.ErrInvalidConfig, "Lease"},
		{"FractionalLease", key, ratelimit.InFlight(2, time.Second+1), acquire("b", 1), ratelimit.ErrInvalidConfig, "Lease"},
		{"NoHolder", key, lim, acquire("", 1), ratelimit.ErrInvalidRequest, "Holder"},
		{"LongHolder", key, lim, acquire(strings.Repeat("h", ratelimit.MaxHolderLen+1), 1), ratelimit.ErrInvalidRequest, "Holder"},
		{"ReleaseNoHolder", key, lim, release(""), ratelimit.ErrInvalidRequest, "Holder"},
		{"ZeroWeight", key, lim, acquire("b", 0), ratelimit.ErrInvalidRequest, "Weight"},
		{"NegativeWeight", key, lim, acquire("b", -1), ratelimit.ErrInvalidRequest, "Weight"},
		{"WeightOverLimit", key, lim, acquire("b", 3), ratelimit.ErrInvalidRequest, "Weight"},
		{"UnknownOp", key, lim, ratelimit.PermitRequest{Op: 200, Holder: "b", Weight: 1}, ratelimit.ErrInvalidRequest, "Op"},
	}
	for _, c := range cases {
		d, err := e.permits(t).DoPermit(context.Background(), c.key, c.lim, c.req)
		switch {
		case !errors.Is(err, c.want):
			t.Errorf("%s: %+v, %v; want an error wrapping %v", c.name, d, err, c.want)
		case !strings.Contains(err.Error(), c.field):
			t.Errorf("%s: %v does not name %s", c.name, err, c.field)
		case d != ratelimit.PermitDecision{}:
			t.Errorf("%s: decision %+v with the error; want none", c.name, d)
		}
	}
	e.psteps(t, key, []pstep{{lim: lim, req: inspectPermits(), want: granted(2, 1)}})
}

// testPermitContext: a call whose context is done returns its error,
// never a store failure, and takes nothing.
func testPermitContext(t *testing.T, e *env) {
	key := e.key("k")
	lim := ratelimit.InFlight(2, day)
	e.psteps(t, key, []pstep{{lim: lim, req: acquire("a", 1), want: granted(2, 1)}})
	for _, c := range doneContexts(t) {
		for _, req := range []ratelimit.PermitRequest{acquire("b", 1), release("a"), renew("a"), inspectPermits()} {
			d, err := e.permits(t).DoPermit(c.ctx, key, lim, req)
			what := fmt.Sprintf("%s: %v", c.name, req.Op)
			switch {
			case !errors.Is(err, c.want):
				t.Errorf("%s: %+v, %v; want an error wrapping %v", what, d, err, c.want)
			case errors.Is(err, ratelimit.ErrTimeout), errors.Is(err, ratelimit.ErrBackendUnavailable):
				t.Errorf("%s: %v wraps a store failure: the caller gave up, the store did not fail", what, err)
			case d != ratelimit.PermitDecision{}:
				t.Errorf("%s: decision %+v with the error; want none", what, d)
			}
		}
		if _, _, err := e.limiter().TryAcquire(c.ctx, key, lim, 1); !errors.Is(err, c.want) {
			t.Errorf("%s: TryAcquire: %v; want an error wrapping %v", c.name, err, c.want)
		}
	}
	e.psteps(t, key, []pstep{{lim: lim, req: inspectPermits(), want: granted(2, 1)}})
}

// testPermitConcurrent: goroutines that acquire and release in turn never
// hold more than the limit at once, counted by each holder from its grant
// to its release, and leave nothing held.
func testPermitConcurrent(t *testing.T, e *env) {
	const limit, rounds = 3, 50
	key := e.key("k")
	lim := ratelimit.InFlight(limit, day)
	l := e.limiter()
	var held, most, grants atomic.Int64
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range rounds {
				p, _, err := l.TryAcquire(context.Background(), key, lim, 1)
				if err != nil {
					t.Errorf("TryAcquire: %v", err)
					return
				}
				if p == nil {
					continue
				}
				grants.Add(1)
				n := held.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				held.Add(-1)
				if err := p.Release(context.Background()); err != nil {
					t.Errorf("Release: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if most.Load() > limit {
		t.Errorf("%d permits were held at once; the limit is %d", most.Load(), limit)
	}
	if grants.Load() < limit {
		t.Errorf("%d grants in %d tries; want at least %d", grants.Load(), goroutines*rounds, limit)
	}
	e.psteps(t, key, []pstep{{lim: lim, req: inspectPermits(), want: granted(limit, 0)}})
}

// testPermitKeys: keys are independent, of each other and of the bucket
// of the same key.
func testPermitKeys(t *testing.T, e *env) {
	lim := ratelimit.InFlight(1, day)
	a, b := e.key("a"), e.key("b")
	e.psteps(t, a, []pstep{
		{lim: lim, req: acquire("h", 1), want: granted(1, 1)},
		{lim: lim, req: acquire("i", 1), want: full(1, 1, day)},
	})
	e.psteps(t, b, []pstep{{lim: lim, req: acquire("i", 1), want: granted(1, 1)}})
	cfg := config(ratelimit.PerHour(1).WithBurst(2))
	e.steps(t, a, cfg, []step{{req: consume(2), want: dec{Allowed: true, Limit: 2, Remaining: 0, Consumed: 2, ResetAfter: 2 * time.Hour, Bandwidth: "0"}}})
	e.psteps(t, a, []pstep{
		{lim: lim, req: release("h"), want: granted(1, 0)},
		{lim: lim, req: inspectPermits(), want: granted(1, 0)},
	})
	e.steps(t, a, cfg, []step{{req: inspect(), want: dec{Limit: 2, Remaining: 0, RetryAfter: time.Hour, ResetAfter: 2 * time.Hour, Bandwidth: "0"}}})
}

// testPermitHandles: the Limiter's Permit: TryAcquire returns none when
// full, Release frees once, and a permit whose lease ended is lost.
func testPermitHandles(t *testing.T, e *env) {
	ctx := context.Background()
	key := e.key("k")
	lim := ratelimit.InFlight(1, day)
	l := e.limiter()
	p, d, err := l.TryAcquire(ctx, key, lim, 1)
	if err != nil || p == nil || d != granted(1, 1) || p.Weight() != 1 || p.Decision() != d || p.Holder() == "" {
		t.Fatalf("TryAcquire = %v, %+v, %v; want a permit of weight 1", p, d, err)
	}
	q, d, err := l.TryAcquire(ctx, key, lim, 1)
	if err != nil || q != nil || d.Granted || d.InFlight != 1 {
		t.Fatalf("TryAcquire on a full key = %v, %+v, %v; want no permit", q, d, err)
	}
	if err := p.Renew(ctx); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatalf("second Release: %v; want nil, with no call", err)
	}
	if err := p.Renew(ctx); !errors.Is(err, ratelimit.ErrPermitLost) {
		t.Fatalf("Renew after Release: %v; want ErrPermitLost", err)
	}
	e.psteps(t, key, []pstep{{lim: lim, req: inspectPermits(), want: granted(1, 0)}})

	lease := shortLease
	if e.fake() {
		lease = time.Minute
	}
	short := ratelimit.InFlight(1, lease)
	p, _, err = l.TryAcquire(ctx, key, short, 1)
	if err != nil || p == nil {
		t.Fatalf("TryAcquire = %v, %v; want a permit", p, err)
	}
	e.advance(lease + lease/4)
	if err := p.Renew(ctx); !errors.Is(err, ratelimit.ErrPermitLost) {
		t.Fatalf("Renew after the lease: %v; want ErrPermitLost", err)
	}
	if err := p.Release(ctx); !errors.Is(err, ratelimit.ErrPermitLost) {
		t.Fatalf("Release after the lease: %v; want ErrPermitLost", err)
	}

	s := l.Semaphore(key, func(context.Context) (ratelimit.Concurrency, error) { return ratelimit.InFlight(2, day), nil })
	p, d, err = s.TryAcquire(ctx, 2)
	if err != nil || p == nil || d != granted(2, 2) {
		t.Fatalf("Semaphore.TryAcquire = %v, %+v, %v; want a permit of weight 2", p, d, err)
	}
	if d, err := s.InFlight(ctx); err != nil || d != notGranted(2, 2) {
		t.Fatalf("Semaphore.InFlight = %+v, %v; want 2 of 2 held", d, err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// testPermitWait: Acquire waits for a release, and gives up, holding
// nothing, when its context ends first.
func testPermitWait(t *testing.T, e *env) {
	ctx := context.Background()
	key := e.key("k")
	lim := ratelimit.InFlight(1, day)
	l := e.limiter()
	p, err := l.Acquire(ctx, key, lim, 1)
	if err != nil {
		t.Fatalf("Acquire on an empty key: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if q, err := l.Acquire(short, key, lim, 1); !errors.Is(err, context.DeadlineExceeded) || q != nil {
		t.Fatalf("Acquire on a full key = %v, %v; want none and DeadlineExceeded", q, err)
	}
	got := make(chan error, 1)
	waiting, stop := context.WithTimeout(ctx, time.Minute)
	defer stop()
	go func() {
		q, err := l.Acquire(waiting, key, lim, 1)
		if err == nil {
			err = q.Release(ctx)
		}
		got <- err
	}()
	if err := p.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("a waiting Acquire, once released: %v", err)
	}
	e.psteps(t, key, []pstep{{lim: lim, req: inspectPermits(), want: granted(1, 0)}})
}
