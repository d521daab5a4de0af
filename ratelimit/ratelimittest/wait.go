package ratelimittest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// waitScenarios check [ratelimit.Bucket.Wait]. Wait sleeps on the real
// clock for the RetryAfter its reservation returns, so these scenarios keep
// every real sleep to a few milliseconds: they check the paths that return
// at once, one short sleep, and a cancelled wait, whose tokens go back.
var waitScenarios = []scenario{
	{name: "TokensAvailable", run: testWaitTokensAvailable},
	{name: "SleepsUntilDue", run: testWaitSleepsUntilDue},
	{name: "ExceedsDeadline", run: testWaitExceedsDeadline},
	{name: "CancelGivesTokensBack", run: testWaitCancelGivesTokensBack},
}

// twoAnHour is a bucket of 2 tokens, one back every 30 minutes.
var twoAnHour = config(ratelimit.PerHour(2))

// drainedTwoAnHour is what Inspect says of a drained twoAnHour bucket.
var drainedTwoAnHour = dec{Limit: 2, RetryAfter: 30 * time.Minute, ResetAfter: time.Hour, Bandwidth: "0"}

// testWaitTokensAvailable: with the tokens there, Wait takes them and
// returns at once, with or without a deadline.
func testWaitTokensAvailable(t *testing.T, e *env) {
	b := e.bucket(e.key("k"), twoAnHour)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.Wait(ctx, 1); err != nil {
		t.Fatalf("Wait(1) with a deadline on a full bucket: %v", err)
	}
	if err := b.Wait(context.Background(), 1); err != nil {
		t.Fatalf("Wait(1) without a deadline: %v", err)
	}
	d, err := b.Inspect(context.Background())
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	e.check(t, "Inspect after two Waits", d, drainedTwoAnHour)
}

// testWaitSleepsUntilDue: with a token due in 5ms, Wait reserves it and
// sleeps until it is due (at least 5ms on the fake clock, which does not
// move).
func testWaitSleepsUntilDue(t *testing.T, e *env) {
	b := e.bucket(e.key("k"), config(ratelimit.Every(5*time.Millisecond, 1), keeper))
	ctx := context.Background()
	if d, err := b.TryConsume(ctx, 1); err != nil || !d.Allowed {
		t.Fatalf("TryConsume(1) on a new bucket: %s, %v; want allowed", format(d), err)
	}
	start := time.Now()
	if err := b.Wait(ctx, 1); err != nil {
		t.Fatalf("Wait(1) for a token due in 5ms: %v", err)
	}
	if slept := time.Since(start); e.fake() && slept < 5*time.Millisecond {
		t.Fatalf("Wait(1) returned after %v; want at least 5ms", slept)
	}
}

// testWaitExceedsDeadline: when the tokens would come after the deadline,
// Wait fails at once with ErrWaitExceedsDeadline and takes nothing.
func testWaitExceedsDeadline(t *testing.T, e *env) {
	b := e.bucket(e.key("k"), twoAnHour)
	if _, err := b.TryConsume(context.Background(), 2); err != nil {
		t.Fatalf("TryConsume(2): %v", err)
	}
	// A short deadline, so that a backend that ignores MaxWait fails in
	// seconds rather than sleeping.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := b.Wait(ctx, 1); !errors.Is(err, ratelimit.ErrWaitExceedsDeadline) {
		t.Fatalf("Wait(1) for a token due in 30m with a deadline in 2s: %v; want ErrWaitExceedsDeadline", err)
	}
	if ctx.Err() != nil {
		t.Fatalf("Wait(1) returned only after the deadline; want at once")
	}
	d, err := b.Inspect(context.Background())
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	e.check(t, "Inspect after the failed Wait", d, drainedTwoAnHour)
}

// testWaitCancelGivesTokensBack: a Wait cancelled while it sleeps returns
// the context's error and gives back the token it reserved. The scenario
// cancels once the Wait's reservation has returned to it (a backend that
// notices cancellation may otherwise drop the reply of a reservation the
// store made), so it needs no sleep of its own.
func testWaitCancelGivesTokensBack(t *testing.T, e *env) {
	reserved := make(chan struct{}, 1)
	b := ratelimit.New(reservations{e.backend, reserved}).Bucket(e.key("k"), func(context.Context) (ratelimit.Config, error) { return twoAnHour, nil })
	if _, err := b.TryConsume(context.Background(), 2); err != nil {
		t.Fatalf("TryConsume(2): %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- b.Wait(ctx, 1) }()

	select {
	case <-reserved:
	case err := <-done:
		t.Fatalf("Wait(1) for a token due in 30m returned before it was cancelled: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Wait(1) did not reserve a token within 10s")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Wait(1): %v; want context.Canceled", err)
	}
	d, err := b.Inspect(context.Background())
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	e.check(t, "Inspect after the cancelled Wait", d, drainedTwoAnHour)
}

// reservations is a Backend that signals each Reserve it returns allowed.
type reservations struct {
	ratelimit.Backend
	reserved chan<- struct{}
}

func (r reservations) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	d, err := r.Backend.Do(ctx, key, cfg, req)
	if req.Op == ratelimit.Reserve && err == nil && d.Allowed {
		select {
		case r.reserved <- struct{}{}:
		default:
		}
	}
	return d, err
}
