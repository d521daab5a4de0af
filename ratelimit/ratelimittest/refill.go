package ratelimittest

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// refillScenarios check how tokens return as time passes, for each
// [ratelimit.RefillKind]: exactly on the fake clock, and within bounds on a
// real one (the *Bounds scenarios, which run under both).
var refillScenarios = []scenario{
	{name: "Greedy", fakeClock: true, run: testGreedy},
	{name: "Interval", fakeClock: true, run: testInterval},
	{name: "IntervalAligned", fakeClock: true, run: testIntervalAligned},
	{name: "IntervalAlignedPartial", fakeClock: true, run: testIntervalAlignedPartial},
	{name: "GreedyBounds", run: testGreedyBounds},
	{name: "IntervalBounds", run: testIntervalBounds},
	{name: "IntervalAlignedBounds", run: testIntervalAlignedBounds},
}

// testGreedy: 10 tokens per 10 minutes return one a minute, continuously,
// fractions included, and never beyond capacity.
func testGreedy(t *testing.T, e *env) {
	const bw = "0"
	e.steps(t, e.key("k"), config(ratelimit.Every(10*time.Minute, 10)), []step{
		{req: consume(10), want: dec{Allowed: true, Limit: 10, Consumed: 10, ResetAfter: 10 * time.Minute, Bandwidth: bw}},
		{advance: 30 * time.Second, req: consume(1),
			want: dec{Limit: 10, RetryAfter: 30 * time.Second, ResetAfter: 9*time.Minute + 30*time.Second, Bandwidth: bw}},
		{advance: 30 * time.Second, req: consume(1),
			want: dec{Allowed: true, Limit: 10, Consumed: 1, ResetAfter: 10 * time.Minute, Bandwidth: bw}},
		{advance: 5 * time.Minute, req: estimate(5),
			want: dec{Allowed: true, Limit: 10, Remaining: 5, ResetAfter: 5 * time.Minute, Bandwidth: bw}},
		{req: estimate(6), want: dec{Limit: 10, Remaining: 5, RetryAfter: time.Minute, ResetAfter: 5 * time.Minute, Bandwidth: bw}},
		// 6.5 tokens: the half token stays in the bucket.
		{advance: 90 * time.Second, req: consume(6),
			want: dec{Allowed: true, Limit: 10, Consumed: 6, ResetAfter: 9*time.Minute + 30*time.Second, Bandwidth: bw}},
		{advance: time.Hour, req: inspect(), want: dec{Allowed: true, Limit: 10, Remaining: 10, Bandwidth: bw}},
		{req: consume(10), want: dec{Allowed: true, Limit: 10, Consumed: 10, ResetAfter: 10 * time.Minute, Bandwidth: bw}},
	})
}

// testInterval: 5 tokens come back at once at the end of each 10-minute
// period, none before; the first period starts when the bucket is first
// drawn below capacity, and the periods follow back to back.
func testInterval(t *testing.T, e *env) {
	const bw = "0"
	cfg := config(ratelimit.Every(10*time.Minute, 5).WithBurst(10).WithRefill(ratelimit.Interval))
	e.steps(t, e.key("k"), cfg, []step{
		{req: consume(10), want: dec{Allowed: true, Limit: 10, Consumed: 10, ResetAfter: 20 * time.Minute, Bandwidth: bw}},
		{advance: 9*time.Minute + 59*time.Second, req: consume(1),
			want: dec{Limit: 10, RetryAfter: time.Second, ResetAfter: 10*time.Minute + time.Second, Bandwidth: bw}},
		{advance: time.Second, req: consume(1),
			want: dec{Allowed: true, Limit: 10, Remaining: 4, Consumed: 1, ResetAfter: 20 * time.Minute, Bandwidth: bw}},
		// Halfway through the second period: still 4, where greedy refill
		// would have given 6.5.
		{advance: 5 * time.Minute, req: consume(5),
			want: dec{Limit: 10, Remaining: 4, RetryAfter: 5 * time.Minute, ResetAfter: 15 * time.Minute, Bandwidth: bw}},
		{advance: 5 * time.Minute, req: consume(5),
			want: dec{Allowed: true, Limit: 10, Remaining: 4, Consumed: 5, ResetAfter: 20 * time.Minute, Bandwidth: bw}},
		{advance: 25 * time.Minute, req: inspect(), want: dec{Allowed: true, Limit: 10, Remaining: 10, Bandwidth: bw}},
		// Full again, so the next period starts with this draw.
		{req: consume(1), want: dec{Allowed: true, Limit: 10, Remaining: 9, Consumed: 1, ResetAfter: 10 * time.Minute, Bandwidth: bw}},
	})
}

// testIntervalAligned: with periods anchored 25 minutes before the clock's
// start, an hourly refill comes at 35 minutes past, not an hour after the
// first draw.
func testIntervalAligned(t *testing.T, e *env) {
	const bw = "0"
	anchor := epoch.Add(-25 * time.Minute)
	e.steps(t, e.key("k"), config(ratelimit.Every(time.Hour, 4).AlignedTo(anchor)), []step{
		{req: consume(4), want: dec{Allowed: true, Limit: 4, Consumed: 4, ResetAfter: 35 * time.Minute, Bandwidth: bw}},
		{req: consume(1), want: dec{Limit: 4, RetryAfter: 35 * time.Minute, ResetAfter: 35 * time.Minute, Bandwidth: bw}},
		{advance: 34*time.Minute + 59*time.Second, req: consume(1),
			want: dec{Limit: 4, RetryAfter: time.Second, ResetAfter: time.Second, Bandwidth: bw}},
		{advance: time.Second, req: consume(1),
			want: dec{Allowed: true, Limit: 4, Remaining: 3, Consumed: 1, ResetAfter: time.Hour, Bandwidth: bw}},
		{advance: 30 * time.Minute, req: consume(3),
			want: dec{Allowed: true, Limit: 4, Consumed: 3, ResetAfter: 30 * time.Minute, Bandwidth: bw}},
		{advance: 30 * time.Minute, req: inspect(), want: dec{Allowed: true, Limit: 4, Remaining: 4, Bandwidth: bw}},
	})
}

// testIntervalAlignedPartial: with two tokens at each boundary, an empty
// bucket of four is full two boundaries away.
func testIntervalAlignedPartial(t *testing.T, e *env) {
	const bw = "0"
	anchor := epoch.Add(-25 * time.Minute)
	e.steps(t, e.key("k"), config(ratelimit.Every(time.Hour, 2).WithBurst(4).AlignedTo(anchor)), []step{
		{req: consume(4), want: dec{Allowed: true, Limit: 4, Consumed: 4, ResetAfter: 95 * time.Minute, Bandwidth: bw}},
		{advance: 35 * time.Minute, req: consume(1),
			want: dec{Allowed: true, Limit: 4, Remaining: 1, Consumed: 1, ResetAfter: 2 * time.Hour, Bandwidth: bw}},
	})
}

// testGreedyBounds: one token per 50ms; 120ms after draining, at least 2
// tokens are back (exactly 2 on the fake clock), and never more than 5.
func testGreedyBounds(t *testing.T, e *env) {
	cfg := config(ratelimit.Every(250*time.Millisecond, 5), keeper)
	drain(t, e, e.key("k"), cfg, 5)
	e.advance(120 * time.Millisecond)
	got := e.do(t, e.key("k"), cfg, upTo(5)).Consumed
	if e.fake() && got != 2 || got < 2 || got > 5 {
		t.Fatalf("ConsumeUpTo(5) 120ms after draining 5 tokens at one per 50ms took %d, want 2 (2 to 5 on a real clock)", got)
	}
}

// testIntervalBounds: all 5 tokens come back at the end of a 200ms period.
func testIntervalBounds(t *testing.T, e *env) {
	cfg := config(ratelimit.Every(200*time.Millisecond, 5).WithRefill(ratelimit.Interval), keeper)
	drain(t, e, e.key("k"), cfg, 5)
	checkDueWithin(t, e, e.key("k"), cfg, 200*time.Millisecond)
	e.advance(200 * time.Millisecond)
	if got := e.do(t, e.key("k"), cfg, upTo(5)).Consumed; got != 5 {
		t.Fatalf("ConsumeUpTo(5) one period after draining an Interval bucket took %d, want 5", got)
	}
}

// testIntervalAlignedBounds: all 4 tokens come back at the next 200ms
// boundary from the anchor: 150ms after the start on the fake clock, within
// 200ms on a real one.
func testIntervalAlignedBounds(t *testing.T, e *env) {
	anchor := epoch.Add(-50 * time.Millisecond)
	due := 150 * time.Millisecond
	if !e.fake() {
		anchor, due = time.Now().Truncate(time.Second), 200*time.Millisecond
	}
	cfg := config(ratelimit.Every(200*time.Millisecond, 4).AlignedTo(anchor), keeper)
	drain(t, e, e.key("k"), cfg, 4)
	checkDueWithin(t, e, e.key("k"), cfg, due)
	e.advance(200 * time.Millisecond)
	if got := e.do(t, e.key("k"), cfg, upTo(4)).Consumed; got != 4 {
		t.Fatalf("ConsumeUpTo(4) past the next aligned boundary took %d, want 4", got)
	}
}

// keeper is a second bandwidth for buckets that refill within milliseconds.
// It never binds, but it keeps the bucket from being full again, and so its
// state from expiring, for seconds: a backend on the fake clock whose store
// expires keys on the real one (a Redis TTL) must not lose the state
// between two calls.
var keeper = ratelimit.PerHour(1000).WithID("keeper")

// drain takes all n tokens of a new bucket.
func drain(t *testing.T, e *env, key string, cfg ratelimit.Config, n int64) {
	t.Helper()
	if d := e.do(t, key, cfg, consume(n)); !d.Allowed || d.Consumed != n {
		t.Fatalf("Consume(%d) on a new bucket of %d: got %s, want it allowed", n, n, format(d))
	}
}

// checkDueWithin checks that a drained bucket's next token is due in
// exactly due on the fake clock; on a real one, that it is due within due
// (or already back, if the machine is slow).
func checkDueWithin(t *testing.T, e *env, key string, cfg ratelimit.Config, due time.Duration) {
	t.Helper()
	d := e.do(t, key, cfg, estimate(1))
	switch {
	case e.fake() && (d.Allowed || d.RetryAfter != due):
		t.Fatalf("Estimate(1) on a drained bucket: got %s, want denied with RetryAfter %v", format(d), due)
	case !d.Allowed && (d.RetryAfter <= 0 || d.RetryAfter > due):
		t.Fatalf("Estimate(1) on a drained bucket: got %s, want RetryAfter in (0, %v]", format(d), due)
	}
}
