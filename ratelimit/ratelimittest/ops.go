package ratelimittest

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// opScenarios check each [ratelimit.Op], through Backend.Do and through the
// [ratelimit.Bucket] method that sends it.
var opScenarios = []scenario{
	{name: "Estimate", run: testEstimate},
	{name: "EstimateKeepsANewBucket", fakeClock: true, run: testEstimateKeepsANewBucket},
	{name: "Reserve", run: testReserve},
	{name: "ConsumeUpTo", run: testConsumeUpTo},
	{name: "Add", run: testAdd},
	{name: "Reset", run: testReset},
	{name: "Replace", run: testReplace},
	{name: "Inspect", run: testInspect},
}

// testEstimate: Estimate says what Consume would decide and takes nothing.
func testEstimate(t *testing.T, e *env) {
	cfg := config(ratelimit.PerHour(3))
	last := dec{Limit: 3, RetryAfter: 20 * time.Minute, ResetAfter: time.Hour, Bandwidth: "0"}
	e.steps(t, e.key("k"), cfg, []step{
		{req: estimate(2), want: dec{Allowed: true, Limit: 3, Remaining: 3, Bandwidth: "0"}},
		{req: estimate(3), want: dec{Allowed: true, Limit: 3, Remaining: 3, Bandwidth: "0"}},
		{req: consume(1), want: dec{Allowed: true, Limit: 3, Remaining: 2, Consumed: 1, ResetAfter: 20 * time.Minute, Bandwidth: "0"}},
		{req: estimate(2), want: dec{Allowed: true, Limit: 3, Remaining: 2, ResetAfter: 20 * time.Minute, Bandwidth: "0"}},
		{req: estimate(3), want: dec{Limit: 3, Remaining: 2, RetryAfter: 20 * time.Minute, ResetAfter: 20 * time.Minute, Bandwidth: "0"}},
		{req: consume(2), want: dec{Allowed: true, Limit: 3, Consumed: 2, ResetAfter: time.Hour, Bandwidth: "0"}},
		{req: estimate(1), want: last},
	})
	d, err := e.bucket(e.key("k"), cfg).Estimate(context.Background(), 1)
	if err != nil {
		t.Fatalf("Bucket.Estimate: %v", err)
	}
	e.check(t, "Bucket.Estimate(1)", d, last)
}

// testEstimateKeepsANewBucket: Estimate takes nothing but keeps the bucket
// it had to build (one that starts below capacity), so the wait it reports
// comes true: a client that only asks, then waits, then consumes, passes.
func testEstimateKeepsANewBucket(t *testing.T, e *env) {
	cfg := config(ratelimit.PerHour(3).WithInitialTokens(0))
	e.steps(t, e.key("k"), cfg, []step{
		{req: estimate(2), want: dec{Limit: 3, RetryAfter: 40 * time.Minute, ResetAfter: time.Hour, Bandwidth: "0"}},
		{advance: 40 * time.Minute, req: consume(2), want: dec{Allowed: true, Limit: 3, Consumed: 2, ResetAfter: time.Hour, Bandwidth: "0"}},
	})
}

// testReserve: Reserve takes tokens on credit when they arrive within
// MaxWait, and says how long to wait; beyond MaxWait it takes nothing.
func testReserve(t *testing.T, e *env) {
	e.steps(t, e.key("k"), config(ratelimit.PerHour(2)), []step{
		{req: reserve(1, 0), want: dec{Allowed: true, Limit: 2, Remaining: 1, Consumed: 1, ResetAfter: 30 * time.Minute, Bandwidth: "0"}},
		{req: consume(1), want: dec{Allowed: true, Limit: 2, Consumed: 1, ResetAfter: time.Hour, Bandwidth: "0"}},
		{req: reserve(1, 29*time.Minute), want: dec{Limit: 2, RetryAfter: 30 * time.Minute, ResetAfter: time.Hour, Bandwidth: "0"}},
		{req: reserve(1, 30*time.Minute),
			want: dec{Allowed: true, Limit: 2, Consumed: 1, RetryAfter: 30 * time.Minute, ResetAfter: 90 * time.Minute, Bandwidth: "0"}},
		// One token is owed: the next is an hour away.
		{req: consume(1), want: dec{Limit: 2, RetryAfter: time.Hour, ResetAfter: 90 * time.Minute, Bandwidth: "0"}},
		{req: inspect(), want: dec{Limit: 2, RetryAfter: time.Hour, ResetAfter: 90 * time.Minute, Bandwidth: "0"}},
		{req: reserve(2, 2*time.Hour),
			want: dec{Allowed: true, Limit: 2, Consumed: 2, RetryAfter: 90 * time.Minute, ResetAfter: 150 * time.Minute, Bandwidth: "0"}},
	})
}

// testConsumeUpTo: ConsumeUpTo takes what every bandwidth can give, up to
// the count asked for, which may exceed the capacity.
func testConsumeUpTo(t *testing.T, e *env) {
	cfg := config(ratelimit.PerHour(5))
	e.steps(t, e.key("k"), cfg, []step{
		{req: upTo(3), want: dec{Allowed: true, Limit: 5, Remaining: 2, Consumed: 3, ResetAfter: 36 * time.Minute, Bandwidth: "0"}},
		{req: upTo(10), want: dec{Allowed: true, Limit: 5, Consumed: 2, ResetAfter: time.Hour, Bandwidth: "0"}},
		{req: upTo(1), want: dec{Limit: 5, RetryAfter: 12 * time.Minute, ResetAfter: time.Hour, Bandwidth: "0"}},
	})

	e.steps(t, e.key("multi"), config(ratelimit.PerHour(10).WithID("a"), ratelimit.PerHour(3).WithID("b")), []step{
		{req: upTo(5), want: dec{Allowed: true, Limit: 3, Consumed: 3, ResetAfter: time.Hour, Bandwidth: "b"}},
	})

	b := e.bucket(e.key("bucket"), cfg)
	for i, want := range []int64{4, 1, 0} {
		got, err := b.ConsumeUpTo(context.Background(), 4)
		if err != nil || got != want {
			t.Fatalf("Bucket.ConsumeUpTo(4) call %d = %d, %v; want %d, nil", i, got, err, want)
		}
	}
}

// testAdd: Add returns tokens, never beyond any bandwidth's capacity, and
// pays back tokens reserved ahead.
func testAdd(t *testing.T, e *env) {
	cfg := config(ratelimit.PerHour(5))
	e.steps(t, e.key("k"), cfg, []step{
		{req: consume(4), want: dec{Allowed: true, Limit: 5, Remaining: 1, Consumed: 4, ResetAfter: 48 * time.Minute, Bandwidth: "0"}},
		{req: add(2), want: dec{Allowed: true, Limit: 5, Remaining: 3, ResetAfter: 24 * time.Minute, Bandwidth: "0"}},
		{req: add(100), want: dec{Allowed: true, Limit: 5, Remaining: 5, Bandwidth: "0"}},
		{req: consume(5), want: dec{Allowed: true, Limit: 5, Consumed: 5, ResetAfter: time.Hour, Bandwidth: "0"}},
		{req: reserve(2, time.Hour),
			want: dec{Allowed: true, Limit: 5, Consumed: 2, RetryAfter: 24 * time.Minute, ResetAfter: 84 * time.Minute, Bandwidth: "0"}},
		{req: add(3), want: dec{Allowed: true, Limit: 5, Remaining: 1, ResetAfter: 48 * time.Minute, Bandwidth: "0"}},
	})

	// Each bandwidth is capped at its own capacity: 1+5 → 4 and 7+5 → 10,
	// both full.
	e.steps(t, e.key("multi"), config(ratelimit.PerHour(4).WithID("a"), ratelimit.PerHour(10).WithID("b")), []step{
		{req: consume(3), want: dec{Allowed: true, Limit: 4, Remaining: 1, Consumed: 3, ResetAfter: 45 * time.Minute, Bandwidth: "a"}},
		{req: add(5), want: dec{Allowed: true, Limit: 4, Remaining: 4, Bandwidth: "a"}},
		{req: consume(4), want: dec{Allowed: true, Limit: 4, Consumed: 4, ResetAfter: time.Hour, Bandwidth: "a"}},
	})

	b := e.bucket(e.key("bucket"), cfg)
	ctx := context.Background()
	if _, err := b.TryConsume(ctx, 5); err != nil {
		t.Fatalf("Bucket.TryConsume: %v", err)
	}
	if err := b.AddTokens(ctx, 2); err != nil {
		t.Fatalf("Bucket.AddTokens: %v", err)
	}
	d, err := b.Inspect(ctx)
	if err != nil {
		t.Fatalf("Bucket.Inspect: %v", err)
	}
	e.check(t, "Bucket.Inspect after AddTokens(2)", d, dec{Allowed: true, Limit: 5, Remaining: 2, ResetAfter: 36 * time.Minute, Bandwidth: "0"})
}

// testReset: Reset makes the bucket new again, debts and all, starting from
// InitialTokens.
func testReset(t *testing.T, e *env) {
	cfg := config(ratelimit.PerHour(5))
	e.steps(t, e.key("k"), cfg, []step{
		{req: consume(5), want: dec{Allowed: true, Limit: 5, Consumed: 5, ResetAfter: time.Hour, Bandwidth: "0"}},
		{req: reserve(5, 2*time.Hour),
			want: dec{Allowed: true, Limit: 5, Consumed: 5, RetryAfter: time.Hour, ResetAfter: 2 * time.Hour, Bandwidth: "0"}},
		{req: reset(), want: dec{Allowed: true, Limit: 5, Remaining: 5, Bandwidth: "0"}},
		{req: consume(5), want: dec{Allowed: true, Limit: 5, Consumed: 5, ResetAfter: time.Hour, Bandwidth: "0"}},
	})

	e.steps(t, e.key("initial"), config(ratelimit.PerHour(5).WithInitialTokens(2)), []step{
		{req: consume(2), want: dec{Allowed: true, Limit: 5, Consumed: 2, ResetAfter: time.Hour, Bandwidth: "0"}},
		{req: reset(), want: dec{Allowed: true, Limit: 5, Remaining: 2, ResetAfter: 36 * time.Minute, Bandwidth: "0"}},
		{req: consume(2), want: dec{Allowed: true, Limit: 5, Consumed: 2, ResetAfter: time.Hour, Bandwidth: "0"}},
		{req: consume(1), want: dec{Limit: 5, RetryAfter: 12 * time.Minute, ResetAfter: time.Hour, Bandwidth: "0"}},
	})

	b := e.bucket(e.key("bucket"), cfg)
	ctx := context.Background()
	for i, want := range []bool{true, false} {
		if d, err := b.TryConsume(ctx, 5); err != nil || d.Allowed != want {
			t.Fatalf("Bucket.TryConsume(5) call %d: allowed=%v, %v; want allowed=%v", i, d.Allowed, err, want)
		}
	}
	if err := b.Reset(ctx); err != nil {
		t.Fatalf("Bucket.Reset: %v", err)
	}
	if d, err := b.TryConsume(ctx, 5); err != nil || !d.Allowed {
		t.Fatalf("Bucket.TryConsume(5) after Reset: %s, %v; want allowed", format(d), err)
	}
}

// testReplace: Replace converts the bucket with the strategy it names, even
// when the config is unchanged.
func testReplace(t *testing.T, e *env) {
	a := config(ratelimit.PerHour(10).WithID("main"))
	b := config(ratelimit.PerHour(20).WithID("main"))
	e.steps(t, e.key("k"), a, []step{
		{req: consume(4), want: dec{Allowed: true, Limit: 10, Remaining: 6, Consumed: 4, ResetAfter: 24 * time.Minute, Bandwidth: "main"}},
		{req: replace(ratelimit.ResetTokens), want: dec{Allowed: true, Limit: 10, Remaining: 10, Bandwidth: "main"}},
		{req: consume(4), want: dec{Allowed: true, Limit: 10, Remaining: 6, Consumed: 4, ResetAfter: 24 * time.Minute, Bandwidth: "main"}},
		{req: replace(ratelimit.AsIs), want: dec{Allowed: true, Limit: 10, Remaining: 6, ResetAfter: 24 * time.Minute, Bandwidth: "main"}},
		// 6 kept, plus the 10 of capacity gained; 4 short at 3 minutes each.
		{cfg: &b, req: replace(ratelimit.Additive), want: dec{Allowed: true, Limit: 20, Remaining: 16, ResetAfter: 12 * time.Minute, Bandwidth: "main"}},
		{cfg: &b, req: consume(1), want: dec{Allowed: true, Limit: 20, Remaining: 15, Consumed: 1, ResetAfter: 15 * time.Minute, Bandwidth: "main"}},
	})

	ctx := context.Background()
	if _, err := e.bucket(e.key("bucket"), a).TryConsume(ctx, 4); err != nil {
		t.Fatalf("Bucket.TryConsume: %v", err)
	}
	if err := e.bucket(e.key("bucket"), a).Replace(ctx, b, ratelimit.Proportionally); err != nil {
		t.Fatalf("Bucket.Replace: %v", err)
	}
	d, err := e.bucket(e.key("bucket"), b).Inspect(ctx)
	if err != nil {
		t.Fatalf("Bucket.Inspect: %v", err)
	}
	e.check(t, "Bucket.Inspect after Replace(Proportionally) from 6 of 10 to a capacity of 20", d,
		dec{Allowed: true, Limit: 20, Remaining: 12, ResetAfter: 24 * time.Minute, Bandwidth: "main"})
}

// testInspect: Inspect reports the state and whether one token is
// available, taking nothing.
func testInspect(t *testing.T, e *env) {
	cfg := config(ratelimit.PerHour(4))
	some := dec{Allowed: true, Limit: 4, Remaining: 1, ResetAfter: 45 * time.Minute, Bandwidth: "0"}
	none := dec{Limit: 4, RetryAfter: 15 * time.Minute, ResetAfter: time.Hour, Bandwidth: "0"}
	e.steps(t, e.key("k"), cfg, []step{
		{req: inspect(), want: dec{Allowed: true, Limit: 4, Remaining: 4, Bandwidth: "0"}},
		{req: consume(3), want: dec{Allowed: true, Limit: 4, Remaining: 1, Consumed: 3, ResetAfter: 45 * time.Minute, Bandwidth: "0"}},
		{req: inspect(), want: some},
		{req: inspect(), want: some},
		{req: consume(1), want: dec{Allowed: true, Limit: 4, Consumed: 1, ResetAfter: time.Hour, Bandwidth: "0"}},
		{req: inspect(), want: none},
	})
	d, err := e.bucket(e.key("k"), cfg).Inspect(context.Background())
	if err != nil {
		t.Fatalf("Bucket.Inspect: %v", err)
	}
	e.check(t, "Bucket.Inspect", d, none)
}
