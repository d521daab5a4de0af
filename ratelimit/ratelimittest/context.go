package ratelimittest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// contextScenarios check that a caller's context is the caller's: a call
// whose context is done, before or during the call, returns the context's
// error, never a store failure nor a Degraded decision, and a call whose
// context was done before it takes nothing.
var contextScenarios = []scenario{
	{name: "DoneBefore", run: testContextDoneBefore},
	{name: "DoneBeforeThroughBucket", run: testContextDoneBeforeThroughBucket},
	{name: "CancelledDuring", run: testContextCancelledDuring},
}

// doneContexts are contexts already done, each with the error Do must
// wrap.
func doneContexts(t *testing.T) []struct {
	name string
	ctx  context.Context
	want error
} {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, stop := context.WithDeadline(context.Background(), time.Unix(1, 0))
	t.Cleanup(stop)
	return []struct {
		name string
		ctx  context.Context
		want error
	}{{"Cancelled", cancelled, context.Canceled}, {"Expired", expired, context.DeadlineExceeded}}
}

// checkCallerError fails the test unless err is the caller's context error
// want, wrapping no store sentinel, with an empty decision.
func checkCallerError(t *testing.T, what string, d ratelimit.Decision, err, want error) {
	t.Helper()
	switch {
	case !errors.Is(err, want):
		t.Errorf("%s: %+v, %v; want an error wrapping %v", what, d, err, want)
	case errors.Is(err, ratelimit.ErrTimeout), errors.Is(err, ratelimit.ErrBackendUnavailable):
		t.Errorf("%s: %v wraps a store failure: the caller gave up, the store did not fail", what, err)
	case d != ratelimit.Decision{}:
		t.Errorf("%s: decision %s with the error; want none", what, format(d))
	}
}

// testContextDoneBefore: every op with a context already cancelled or
// past its deadline fails with the context's error and changes nothing.
func testContextDoneBefore(t *testing.T, e *env) {
	cfg := config(ratelimit.PerHour(1).WithBurst(5))
	key := e.key("k")
	e.steps(t, key, cfg, []step{{req: consume(2), want: dec{Allowed: true, Limit: 5, Remaining: 3, Consumed: 2, ResetAfter: 2 * time.Hour, Bandwidth: "0"}}})
	reqs := []ratelimit.Request{consume(1), estimate(1), reserve(5, time.Hour), upTo(5), add(1), reset(), replace(ratelimit.ResetTokens), inspect()}
	for _, c := range doneContexts(t) {
		for _, req := range reqs {
			d, err := e.backend.Do(c.ctx, key, cfg, req)
			checkCallerError(t, c.name+": "+describe(req), d, err, c.want)
		}
		// A new key stays absent too.
		d, err := e.backend.Do(c.ctx, e.key("new"), cfg, consume(1))
		checkCallerError(t, c.name+": Consume on a new key", d, err, c.want)
	}
	e.steps(t, key, cfg, []step{{req: inspect(), want: dec{Allowed: true, Limit: 5, Remaining: 3, ResetAfter: 2 * time.Hour, Bandwidth: "0"}}})
	e.steps(t, e.key("new"), cfg, []step{{req: inspect(), want: dec{Allowed: true, Limit: 5, Remaining: 5, Bandwidth: "0"}}})
}

// testContextDoneBeforeThroughBucket: the Limiter and a Bucket pass the
// context's error back as Do returns it.
func testContextDoneBeforeThroughBucket(t *testing.T, e *env) {
	cfg := config(ratelimit.PerHour(1).WithBurst(5))
	key := e.key("k")
	b := e.bucket(key, cfg)
	for _, c := range doneContexts(t) {
		d, err := e.limiter().Allow(c.ctx, key, cfg)
		checkCallerError(t, c.name+": Limiter.Allow", d, err, c.want)
		d, err = b.TryConsume(c.ctx, 1)
		checkCallerError(t, c.name+": Bucket.TryConsume", d, err, c.want)
		if err := b.AddTokens(c.ctx, 1); !errors.Is(err, c.want) {
			t.Errorf("%s: Bucket.AddTokens: %v; want %v", c.name, err, c.want)
		}
	}
	e.steps(t, key, cfg, []step{{req: inspect(), want: dec{Allowed: true, Limit: 5, Remaining: 5, Bandwidth: "0"}}})
}

// testContextCancelledDuring: calls whose context is cancelled while they
// run each return either a decision or the context's error; the bucket
// has lost at least the tokens of the decisions that allowed, and at most
// those and one for each call that returned the error (which may have
// been applied before the caller gave up).
func testContextCancelledDuring(t *testing.T, e *env) {
	const capacity, calls = 50, 40
	cfg := config(ratelimit.PerHour(1).WithBurst(capacity))
	key := e.key("k")
	ctx, cancel := context.WithCancel(context.Background())
	var (
		wg                sync.WaitGroup
		mu                sync.Mutex
		allowed, errored  int
		start             = make(chan struct{})
		startedGoroutines sync.WaitGroup
	)
	startedGoroutines.Add(calls)
	for range calls {
		wg.Go(func() {
			startedGoroutines.Done()
			<-start
			d, err := e.backend.Do(ctx, key, cfg, consume(1))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errored++
				checkCallerError(t, "Consume cancelled during the call", d, err, context.Canceled)
			case d.Degraded || !d.Allowed:
				t.Errorf("Consume cancelled during the call: %s; want allowed, not Degraded, from a bucket of %d", format(d), capacity)
			default:
				allowed++
			}
		})
	}
	startedGoroutines.Wait()
	close(start)
	cancel()
	wg.Wait()
	d := e.do(t, key, cfg, inspect())
	taken := int(capacity - d.Remaining)
	if taken < allowed || taken > allowed+errored {
		t.Errorf("%d allowed and %d cancelled calls took %d tokens; want %d to %d", allowed, errored, taken, allowed, allowed+errored)
	}
	t.Logf("%d calls: %d decided, %d cancelled; %d tokens taken", calls, allowed, errored, taken)
}
