package failpolicy_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
)

// tenAMinute is a limit of 10 permits, each leased for a minute.
var tenAMinute = ratelimit.InFlight(10, time.Minute)

func acquireReq(holder string, weight int64) ratelimit.PermitRequest {
	return ratelimit.PermitRequest{Op: ratelimit.PermitAcquire, Holder: holder, Weight: weight}
}

func releaseReq(holder string) ratelimit.PermitRequest {
	return ratelimit.PermitRequest{Op: ratelimit.PermitRelease, Holder: holder, Weight: 1}
}

func renewReq(holder string) ratelimit.PermitRequest {
	return ratelimit.PermitRequest{Op: ratelimit.PermitRenew, Holder: holder, Weight: 1}
}

var inspectReq = ratelimit.PermitRequest{Op: ratelimit.PermitInspect}

// permitStep is one permit call on key "k" and the decision it must get,
// with calls more calls reaching the store (-1: any number).
type permitStep struct {
	req   ratelimit.PermitRequest
	want  ratelimit.PermitDecision
	calls int64
}

// permitSteps makes each step's call with p under lim, and checks it.
func permitSteps(t *testing.T, p *failpolicy.Backend, s *store, lim ratelimit.Concurrency, steps []permitStep) {
	t.Helper()
	for i, st := range steps {
		before := s.calls.Load()
		d, err := p.DoPermit(context.Background(), "k", lim, st.req)
		if err != nil {
			t.Fatalf("step %d, %v %q: %v", i, st.req.Op, st.req.Holder, err)
		}
		if d != st.want {
			t.Errorf("step %d, %v %q:\n got %+v\nwant %+v", i, st.req.Op, st.req.Holder, d, st.want)
		}
		if got := s.calls.Load() - before; st.calls >= 0 && got != st.calls {
			t.Errorf("step %d, %v %q: %d calls reached the store; want %d", i, st.req.Op, st.req.Holder, got, st.calls)
		}
	}
}

// TestConformanceLocal: a healthy store behind the Local mode passes the
// suite, permits included: a Release or Renew the local store does not
// hold goes to the store.
func TestConformanceLocal(t *testing.T) {
	ratelimittest.Run(t, ratelimittest.Harness{
		Permits: true,
		New: func(t *testing.T, c ratelimit.Clock) ratelimit.Backend {
			return newPolicy(t, newStore(t, c), failpolicy.Local, failpolicy.WithTimeout(time.Minute), failpolicy.WithClock(c), failpolicy.WithInstances(3))
		},
	})
}

// TestPermitModes: what each mode decides for each permit op while the
// store fails, which calls reach the store, and what the hook is told.
func TestPermitModes(t *testing.T) {
	granted := func(limit, inFlight int64) ratelimit.PermitDecision {
		return ratelimit.PermitDecision{Granted: true, Degraded: true, Limit: limit, InFlight: inFlight}
	}
	denied := func(limit, inFlight int64, retry time.Duration) ratelimit.PermitDecision {
		return ratelimit.PermitDecision{Degraded: true, Limit: limit, InFlight: inFlight, RetryAfter: retry}
	}
	for _, tc := range []struct {
		name string
		err  error
	}{{"Unavailable", errDown}, {"Timeout", errTimeout}} {
		for _, mc := range []struct {
			mode  failpolicy.Mode
			steps []permitStep
			hooks int // the Degraded hook's calls
		}{
			{failpolicy.Open, []permitStep{
				{acquireReq("a", 3), granted(10, 0), 1},
				{renewReq("a"), granted(10, 0), 1},
				{inspectReq, granted(10, 0), 1},
				{releaseReq("a"), denied(10, 0, 0), 1},
			}, 4},
			{failpolicy.Closed, []permitStep{
				{acquireReq("a", 3), denied(10, 0, 2*time.Second), 1},
				{renewReq("a"), denied(10, 0, 0), 1},
				{inspectReq, denied(10, 0, 0), 1},
				{releaseReq("a"), denied(10, 0, 0), 1},
			}, 4},
			// WithInstances(3): a share of 10/3, rounded up, 4.
			{failpolicy.Local, []permitStep{
				{acquireReq("a", 2), granted(4, 2), 1},
				{acquireReq("b", 2), granted(4, 4), 1},
				{acquireReq("c", 1), denied(4, 4, time.Minute), 1},   // the share is full until a's lease ends
				{acquireReq("d", 5), denied(4, 0, 2*time.Second), 1}, // more than the share holds: Closed's denial
				{inspectReq, denied(4, 4, 0), 1},
				// Held locally: decided there, with no store call and no hook.
				{releaseReq("a"), granted(4, 2), 0},
				{renewReq("b"), granted(4, 2), 0},
				{releaseReq("a"), denied(4, 2, 0), 1}, // no longer held there: the store's, which fails
				{renewReq("stranger"), denied(4, 2, 0), 1},
				{acquireReq("c", 1), granted(4, 3), 1},
			}, 8},
		} {
			t.Run(tc.name+"/"+mc.mode.String(), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					s := newStore(t, nil)
					s.fail(tc.err)
					var log hookLog
					p := newPolicy(t, s, mc.mode, failpolicy.WithInstances(3), failpolicy.WithRetryAfter(2*time.Second),
						failpolicy.WithBreaker(100, time.Hour), failpolicy.WithHooks(log.hooks()))
					permitSteps(t, p, s, tenAMinute, mc.steps)
					if len(log.degraded) != mc.hooks || countIs(log.degraded, tc.err) != mc.hooks {
						t.Errorf("Degraded told %d times, of %v; want %d, each of the store's error", len(log.degraded), log.degraded, mc.hooks)
					}
				})
			})
		}
	}
}

// TestPermitHandles: a Limiter's Permit through each mode while the store
// fails: Open and Local hand one out, whose Renew and Release return nil;
// Closed hands none out.
func TestPermitHandles(t *testing.T) {
	for _, mode := range []failpolicy.Mode{failpolicy.Open, failpolicy.Closed, failpolicy.Local} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newStore(t, nil)
				s.fail(errDown)
				l := ratelimit.New(newPolicy(t, s, mode))
				ctx := context.Background()
				pm, d, err := l.TryAcquire(ctx, "k", tenAMinute, 1)
				if err != nil || !d.Degraded || (pm != nil) != (mode != failpolicy.Closed) {
					t.Fatalf("TryAcquire: %v, %+v, %v; want a degraded decision, a permit but in Closed mode", pm, d, err)
				}
				if pm == nil {
					return
				}
				if err := pm.Renew(ctx); err != nil {
					t.Errorf("Renew: %v", err)
				}
				if err := pm.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
				}
			})
		})
	}
}

// TestPermitLocalBound: two instances of a fleet, each with a share of 2 of
// a limit of 3, one holding the store's 3 when it fails. While it is
// away, each admits its share, and no more: 3 + 2×2 held at once. Once it
// is back, permits come from the store again, and the local ones are
// released where they were taken, with no store call; once they are, the
// fleet holds at most the limit.
func TestPermitLocalBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit, instances = 3, 2
		lim := ratelimit.InFlight(limit, time.Hour)
		s := newStore(t, nil)
		var fleet []*ratelimit.Limiter
		for range instances {
			fleet = append(fleet, ratelimit.New(newPolicy(t, s, failpolicy.Local, failpolicy.WithInstances(instances))))
		}
		ctx := context.Background()
		// acquire takes permits with l until one is denied, and returns
		// them; each must be Degraded as want says.
		acquire := func(l *ratelimit.Limiter, degraded bool) []*ratelimit.Permit {
			t.Helper()
			var held []*ratelimit.Permit
			for {
				pm, d, err := l.TryAcquire(ctx, "k", lim, 1)
				if err != nil || d.Degraded != degraded {
					t.Fatalf("TryAcquire: %+v, %v; want Degraded %v", d, err, degraded)
				}
				if pm == nil {
					return held
				}
				held = append(held, pm)
			}
		}
		release := func(held []*ratelimit.Permit, calls int64) {
			t.Helper()
			before := s.calls.Load()
			for _, pm := range held {
				if err := pm.Release(ctx); err != nil {
					t.Fatalf("Release: %v", err)
				}
			}
			if got := s.calls.Load() - before; got != calls {
				t.Errorf("%d releases made %d store calls; want %d", len(held), got, calls)
			}
		}

		fromStore := acquire(fleet[0], false)
		s.fail(errDown)
		var local [][]*ratelimit.Permit
		for _, l := range fleet {
			local = append(local, acquire(l, true))
		}
		share := failpolicy.PermitShare(lim, instances).Limit
		held := len(fromStore)
		for _, h := range local {
			if len(h) != int(share) {
				t.Errorf("an instance admitted %d locally; want its share, %d", len(h), share)
			}
			held += len(h)
		}
		if held != limit+instances*int(share) {
			t.Errorf("%d held during the outage; want the limit and each instance's share, %d", held, limit+instances*int(share))
		}

		s.heal()
		if more := acquire(fleet[1], false); len(more) != 0 {
			t.Errorf("the store back, holding 3 of 3: %d more admitted", len(more))
		}
		release(local[0], 0)
		release(fromStore, int64(len(fromStore)))
		// The store's permits are free; the second instance's local ones
		// are still out, until it releases them.
		again := acquire(fleet[0], false)
		if len(again) != limit {
			t.Errorf("the store, its permits released: %d admitted; want %d", len(again), limit)
		}
		release(local[1], 0)
		release(again, int64(len(again)))
		d, err := fleet[1].Semaphore("k", func(context.Context) (ratelimit.Concurrency, error) { return lim, nil }).InFlight(ctx)
		if err != nil || d.InFlight != 0 || d.Degraded {
			t.Errorf("InFlight at the end: %+v, %v; want 0, from the store", d, err)
		}
	})
}

// TestPermitPassedBack: bad input is CheckPermit's error before any store
// call; a caller's cancelled context and a key the store rejects are
// passed back, not Degraded, and leave the breaker closed; in every mode,
// with the breaker closed and open.
func TestPermitPassedBack(t *testing.T) {
	for _, mode := range []failpolicy.Mode{failpolicy.Open, failpolicy.Closed, failpolicy.Local} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newStore(t, nil)
				var log hookLog
				p := newPolicy(t, s, mode, failpolicy.WithBreaker(1, time.Hour), failpolicy.WithHooks(log.hooks()))
				cancelled, cancel := context.WithCancel(context.Background())
				cancel()
				check := func(state string) {
					t.Helper()
					before := s.calls.Load()
					for _, c := range []struct {
						key  string
						lim  ratelimit.Concurrency
						req  ratelimit.PermitRequest
						want error
					}{
						{"", tenAMinute, acquireReq("a", 1), ratelimit.ErrInvalidKey},
						{"k", ratelimit.InFlight(0, time.Minute), acquireReq("a", 1), ratelimit.ErrInvalidConfig},
						{"k", ratelimit.InFlight(1, 0), releaseReq("a"), ratelimit.ErrInvalidConfig},
						{"k", tenAMinute, acquireReq("", 1), ratelimit.ErrInvalidRequest},
						{"k", tenAMinute, acquireReq("a", 11), ratelimit.ErrInvalidRequest},
						{"k", tenAMinute, ratelimit.PermitRequest{Op: 9, Holder: "a"}, ratelimit.ErrInvalidRequest},
					} {
						for _, ctx := range []context.Context{context.Background(), cancelled} {
							if d, err := p.DoPermit(ctx, c.key, c.lim, c.req); !errors.Is(err, c.want) || d != (ratelimit.PermitDecision{}) {
								t.Errorf("%s: %v %q on %q: %+v, %v; want %v", state, c.req.Op, c.req.Holder, c.key, d, err, c.want)
							}
						}
					}
					for _, req := range []ratelimit.PermitRequest{acquireReq("a", 1), releaseReq("a"), renewReq("a"), inspectReq} {
						d, err := p.DoPermit(cancelled, "k", tenAMinute, req)
						if !errors.Is(err, context.Canceled) || errors.Is(err, ratelimit.ErrBackendUnavailable) || d != (ratelimit.PermitDecision{}) {
							t.Errorf("%s: %v, cancelled: %+v, %v; want context.Canceled alone", state, req.Op, d, err)
						}
					}
					if n := s.calls.Load() - before; n != 0 {
						t.Errorf("%s: %d calls reached the store", state, n)
					}
				}
				check("healthy")

				s.fail(fmt.Errorf("%w: WRONGTYPE", ratelimit.ErrKeyRejected))
				for _, req := range []ratelimit.PermitRequest{acquireReq("a", 1), releaseReq("a"), renewReq("a"), inspectReq} {
					if d, err := p.DoPermit(context.Background(), "k", tenAMinute, req); !errors.Is(err, ratelimit.ErrKeyRejected) || d.Degraded {
						t.Errorf("%v on a rejected key: %+v, %v; want ErrKeyRejected, not Degraded", req.Op, d, err)
					}
				}
				if p.Breaker() != failpolicy.BreakerClosed || len(log.degraded) != 0 {
					t.Fatalf("after bad input, cancelled calls and a rejected key: breaker %v, %d degraded; want BreakerClosed, none", p.Breaker(), len(log.degraded))
				}

				s.fail(errDown)
				if d, err := p.DoPermit(context.Background(), "k", tenAMinute, acquireReq("a", 1)); err != nil || !d.Degraded {
					t.Fatalf("with the store down: %+v, %v; want Degraded", d, err)
				}
				if p.Breaker() != failpolicy.BreakerOpen {
					t.Fatalf("after a failure with WithBreaker(1, …): %v; want BreakerOpen", p.Breaker())
				}
				check("breaker open")
			})
		})
	}
}

// rateOnly is a Backend that holds no permits.
type rateOnly struct{ ratelimit.Backend }

// TestPermitUnsupported: over a Backend that holds no permits, every
// permit call fails with errors.ErrUnsupported after CheckPermit, in every
// mode and with the breaker open: no mode stands in for it.
func TestPermitUnsupported(t *testing.T) {
	for _, mode := range []failpolicy.Mode{failpolicy.Open, failpolicy.Closed, failpolicy.Local} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newStore(t, nil)
				p := newPolicy(t, rateOnly{s}, mode, failpolicy.WithBreaker(1, time.Hour))
				s.fail(errDown)
				do(t, p, consume) // fails: the breaker opens
				if p.Breaker() != failpolicy.BreakerOpen {
					t.Fatalf("breaker %v; want BreakerOpen", p.Breaker())
				}
				for _, req := range []ratelimit.PermitRequest{acquireReq("a", 1), releaseReq("a"), renewReq("a"), inspectReq} {
					if d, err := p.DoPermit(context.Background(), "k", tenAMinute, req); !errors.Is(err, errors.ErrUnsupported) || d != (ratelimit.PermitDecision{}) {
						t.Errorf("%v: %+v, %v; want errors.ErrUnsupported", req.Op, d, err)
					}
				}
				if _, err := p.DoPermit(context.Background(), "", tenAMinute, acquireReq("a", 1)); !errors.Is(err, ratelimit.ErrInvalidKey) {
					t.Errorf("an empty key: %v; want ErrInvalidKey first", err)
				}
			})
		})
	}
}

// TestPermitBreaker: permit calls and decisions count to one breaker: a
// failed decision and two failed permit calls open it; while it is open
// no permit call reaches the store; after the cool-down a permit call
// probes, and closes it once the store answers.
func TestPermitBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := ratelimittest.NewClock(time.Unix(1e9, 0))
		s := newStore(t, clock)
		var log hookLog
		p := newPolicy(t, s, failpolicy.Closed, failpolicy.WithBreaker(3, time.Second), failpolicy.WithClock(clock), failpolicy.WithHooks(log.hooks()))
		s.fail(errTimeout)
		do(t, p, consume)
		denied := ratelimit.PermitDecision{Degraded: true, Limit: 10, RetryAfter: time.Second}
		permitSteps(t, p, s, tenAMinute, []permitStep{
			{acquireReq("a", 1), denied, 1},
			{acquireReq("a", 1), denied, 1}, // the third failure opens the breaker
			{acquireReq("a", 1), denied, 0},
		})
		if p.Breaker() != failpolicy.BreakerOpen {
			t.Fatalf("breaker %v; want BreakerOpen", p.Breaker())
		}
		s.heal()
		clock.Advance(time.Second)
		permitSteps(t, p, s, tenAMinute, []permitStep{
			{acquireReq("a", 1), ratelimit.PermitDecision{Granted: true, Limit: 10, InFlight: 1}, 1}, // the probe
			{releaseReq("a"), ratelimit.PermitDecision{Granted: true, Limit: 10}, 1},
		})
		want := []string{"BreakerClosed>BreakerOpen", "BreakerOpen>BreakerHalfOpen", "BreakerHalfOpen>BreakerClosed"}
		if !slices.Equal(log.changes, want) {
			t.Errorf("BreakerChanged: %v; want %v", log.changes, want)
		}
		if len(log.degraded) != 4 || countIs(log.degraded, failpolicy.ErrBreakerOpen) != 1 {
			t.Errorf("Degraded causes %v; want 4, one of them ErrBreakerOpen", log.degraded)
		}
	})
}

// TestPermitDeadline: a permit call the store does not answer is decided
// by the mode at the policy's deadline, to the nanosecond on synctest's
// clock, and counts as a failure; a caller whose own deadline comes first
// gets its context's error, not Degraded, and the breaker is untouched.
func TestPermitDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 10 * time.Millisecond
		s := &slowStore{store: newStore(t, nil)}
		s.delay.Store(int64(time.Hour))
		p := newPolicy(t, s, failpolicy.Open, failpolicy.WithTimeout(timeout), failpolicy.WithBreaker(2, time.Hour))

		ctx, cancel := context.WithTimeout(context.Background(), timeout/2)
		defer cancel()
		start := time.Now()
		d, err := p.DoPermit(ctx, "k", tenAMinute, acquireReq("a", 1))
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ratelimit.ErrTimeout) || d.Degraded || time.Since(start) != timeout/2 {
			t.Errorf("a caller's earlier deadline: %+v, %v after %v; want context.DeadlineExceeded, no ErrTimeout, at %v", d, err, time.Since(start), timeout/2)
		}
		if p.Breaker() != failpolicy.BreakerClosed {
			t.Fatalf("breaker %v after the caller's deadline; want BreakerClosed", p.Breaker())
		}

		for range 2 {
			start := time.Now()
			d, err := p.DoPermit(context.Background(), "k", tenAMinute, renewReq("a"))
			if err != nil || d != (ratelimit.PermitDecision{Granted: true, Degraded: true, Limit: 10}) || time.Since(start) != timeout {
				t.Errorf("a Renew the store does not answer: %+v, %v after %v; want Open's degraded grant at %v", d, err, time.Since(start), timeout)
			}
		}
		if p.Breaker() != failpolicy.BreakerOpen {
			t.Errorf("breaker %v after 2 timeouts with WithBreaker(2, …); want BreakerOpen", p.Breaker())
		}
	})
}

// TestPermitNodeBreakers: a permit call on a key is judged by the breaker
// of its node: node a failing opens a's breaker, and keys on b get their
// permits from the store meanwhile.
func TestPermitNodeBreakers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newNodeStore(t, byTable)
		p := newPolicy(t, s, failpolicy.Closed, failpolicy.WithBreaker(2, time.Hour))
		// acquire wants an Acquire on key Degraded as said, with calls more
		// calls reaching its node.
		acquire := func(key string, degraded bool, calls int) {
			t.Helper()
			node := s.Node(key)
			before := s.callsTo(node)
			d, err := p.DoPermit(context.Background(), key, tenAMinute, acquireReq("h-"+fmt.Sprint(before), 1))
			if err != nil || d.Degraded != degraded || d.Granted == degraded {
				t.Fatalf("Acquire on %s: %+v, %v; want Degraded %v", key, d, err, degraded)
			}
			if got := s.callsTo(node) - before; got != calls {
				t.Fatalf("Acquire on %s: %d calls reached node %s; want %d", key, got, node, calls)
			}
		}
		s.set("a", failing)
		acquire("a1", true, 1)
		acquire("b1", false, 1)
		acquire("a2", true, 1)
		wantBreakers(t, p, map[string]failpolicy.BreakerState{"a": failpolicy.BreakerOpen, "b": failpolicy.BreakerClosed})
		acquire("a1", true, 0)
		acquire("b2", false, 1)
	})
}

func (p panicStore) DoPermit(_ context.Context, key string, _ ratelimit.Concurrency, _ ratelimit.PermitRequest) (ratelimit.PermitDecision, error) {
	p.counts[key]++ // assignment to entry in nil map
	return ratelimit.PermitDecision{}, nil
}

// TestPermitPanic: a panic in the wrapped Backend's DoPermit is raised
// again on the caller's goroutine, as a *PanicError.
func TestPermitPanic(t *testing.T) {
	p := newPolicy(t, panicStore{}, failpolicy.Open, failpolicy.WithTimeout(time.Minute))
	recovered := func() (v any) {
		defer func() { v = recover() }()
		_, _ = p.DoPermit(context.Background(), "k", tenAMinute, acquireReq("a", 1))
		return nil
	}()
	if pe, ok := recovered.(*failpolicy.PanicError); !ok || len(pe.Stack) == 0 {
		t.Fatalf("recovered %T %v; want a *failpolicy.PanicError with a stack", recovered, recovered)
	}
}

// TestPermitShare: a share is the limit divided by the instances, rounded
// up: at least 1, together at least the limit, and less than the limit
// plus the instances.
func TestPermitShare(t *testing.T) {
	for _, c := range []struct{ limit, n, want int64 }{
		{10, 1, 10}, {10, 3, 4}, {10, 4, 3}, {10, 5, 2}, {10, 20, 1}, {1, 4, 1}, {ratelimit.MaxPermits, 1000, 66},
	} {
		if got := failpolicy.PermitShare(ratelimit.InFlight(c.limit, time.Second), c.n); got != ratelimit.InFlight(c.want, time.Second) {
			t.Errorf("PermitShare(%d, %d) = %+v; want Limit %d, the Lease kept", c.limit, c.n, got, c.want)
		}
	}
	for limit := int64(1); limit <= 300; limit++ {
		for n := int64(1); n <= 40; n++ {
			share := failpolicy.PermitShare(ratelimit.InFlight(limit, time.Second), n).Limit
			if share < 1 || share*n < limit || share*n >= limit+n {
				t.Fatalf("PermitShare(%d, %d) = %d", limit, n, share)
			}
		}
	}
}
