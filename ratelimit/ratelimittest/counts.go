package ratelimittest

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// countScenarios check that a bucket admits exactly what its config allows
// and says exactly when to retry.
var countScenarios = []scenario{
	{name: "BurstThenDenied", run: testBurstThenDenied},
	{name: "Batches", run: testBatches},
	{name: "DeniedTakesNothing", run: testDeniedTakesNothing},
	{name: "DeniedTakesNothingFromAnyBandwidth", run: testDeniedTakesNothingMulti},
	{name: "RetryAfterRoundsUp", fakeClock: true, run: testRetryAfterRoundsUp},
	{name: "InitialTokens", run: testInitialTokens},
	{name: "InitialTokensZero", run: testInitialTokensZero},
	{name: "RefilledBucketStartsFromInitialTokens", fakeClock: true, run: testRefilledStartsFromInitial},
	{name: "LargeInterval", run: testLargeInterval},
	{name: "LargeGreedy", fakeClock: true, run: testLargeGreedy},
}

// testBurstThenDenied: a bucket of 10 admits 10 single requests, each
// reporting what is left and when it will be full again, then denies the
// 11th with the exact wait for one token (6 minutes at 10 an hour).
func testBurstThenDenied(t *testing.T, e *env) {
	var steps []step
	for i := range int64(10) {
		steps = append(steps, step{req: consume(1), want: dec{Allowed: true, Limit: 10, Remaining: 9 - i, Consumed: 1,
			ResetAfter: time.Duration(i+1) * 6 * time.Minute, Bandwidth: "0"}})
	}
	denied := dec{Limit: 10, RetryAfter: 6 * time.Minute, ResetAfter: time.Hour, Bandwidth: "0"}
	steps = append(steps, step{req: consume(1), want: denied}, step{req: consume(1), want: denied})
	e.steps(t, e.key("k"), config(ratelimit.PerHour(10)), steps)
}

// testBatches: requests for several tokens pass only whole; a denied batch
// waits for its shortfall.
func testBatches(t *testing.T, e *env) {
	e.steps(t, e.key("k"), config(ratelimit.PerHour(10)), []step{
		{req: consume(4), want: dec{Allowed: true, Limit: 10, Remaining: 6, Consumed: 4, ResetAfter: 24 * time.Minute, Bandwidth: "0"}},
		{req: consume(7), want: dec{Limit: 10, Remaining: 6, RetryAfter: 6 * time.Minute, ResetAfter: 24 * time.Minute, Bandwidth: "0"}},
		{req: consume(6), want: dec{Allowed: true, Limit: 10, Remaining: 0, Consumed: 6, ResetAfter: time.Hour, Bandwidth: "0"}},
		{req: consume(10), want: dec{Limit: 10, RetryAfter: time.Hour, ResetAfter: time.Hour, Bandwidth: "0"}},
	})
}

// testDeniedTakesNothing: denied Consume and Reserve calls leave the bucket
// as it was, so the tokens it had are still there.
func testDeniedTakesNothing(t *testing.T, e *env) {
	denied := dec{Limit: 5, Remaining: 2, RetryAfter: 12 * time.Minute, ResetAfter: 36 * time.Minute, Bandwidth: "0"}
	e.steps(t, e.key("k"), config(ratelimit.PerHour(5)), []step{
		{req: consume(3), want: dec{Allowed: true, Limit: 5, Remaining: 2, Consumed: 3, ResetAfter: 36 * time.Minute, Bandwidth: "0"}},
		{req: consume(3), want: denied},
		{req: consume(3), want: denied},
		{req: reserve(3, 11*time.Minute), want: denied},
		{req: consume(2), want: dec{Allowed: true, Limit: 5, Remaining: 0, Consumed: 2, ResetAfter: time.Hour, Bandwidth: "0"}},
	})
}

// testDeniedTakesNothingMulti: a request denied by one bandwidth takes
// nothing from the others either. The bucket is then read through a config
// of bandwidth "a" alone, which keeps a's tokens (AsIs, matched by ID).
func testDeniedTakesNothingMulti(t *testing.T, e *env) {
	a := ratelimit.PerHour(10).WithID("a")
	b := ratelimit.PerHour(3).WithID("b")
	onlyA := config(a)
	denied := dec{Limit: 3, RetryAfter: 20 * time.Minute, ResetAfter: time.Hour, Bandwidth: "b"}
	e.steps(t, e.key("k"), config(a, b), []step{
		{req: consume(3), want: dec{Allowed: true, Limit: 3, Remaining: 0, Consumed: 3, ResetAfter: time.Hour, Bandwidth: "b"}},
		{req: consume(1), want: denied},
		{req: consume(2), want: dec{Limit: 3, RetryAfter: 40 * time.Minute, ResetAfter: time.Hour, Bandwidth: "b"}},
		{req: reserve(1, 10*time.Minute), want: denied},
		{cfg: &onlyA, req: estimate(7), want: dec{Allowed: true, Limit: 10, Remaining: 7, ResetAfter: 18 * time.Minute, Bandwidth: "a"}},
	})
}

// testRetryAfterRoundsUp: at 3 tokens a second a token takes 333333⅓µs;
// RetryAfter rounds the wait up to the microsecond, never down, and the
// fractions do not drift: the token is there exactly when promised.
func testRetryAfterRoundsUp(t *testing.T, e *env) {
	e.steps(t, e.key("k"), config(ratelimit.PerSecond(3)), []step{
		{req: consume(3), want: dec{Allowed: true, Limit: 3, Consumed: 3, ResetAfter: time.Second, Bandwidth: "0"}},
		{req: consume(1), want: dec{Limit: 3, RetryAfter: 333334 * time.Microsecond, ResetAfter: time.Second, Bandwidth: "0"}},
		{advance: 333333 * time.Microsecond, req: consume(1),
			want: dec{Limit: 3, RetryAfter: time.Microsecond, ResetAfter: 666667 * time.Microsecond, Bandwidth: "0"}},
		{advance: time.Microsecond, req: consume(1),
			want: dec{Allowed: true, Limit: 3, Consumed: 1, ResetAfter: time.Second, Bandwidth: "0"}},
		// The rounded-up wait left ⅔µs of refill in the bucket, and it
		// still counts: two more tokens are due in 666666µs, not 666667µs.
		{req: consume(2), want: dec{Limit: 3, RetryAfter: 666666 * time.Microsecond, ResetAfter: time.Second, Bandwidth: "0"}},
		{advance: 666666 * time.Microsecond, req: consume(2),
			want: dec{Allowed: true, Limit: 3, Consumed: 2, ResetAfter: time.Second, Bandwidth: "0"}},
	})
}

// testInitialTokens: a new bucket starts with InitialTokens, not Capacity.
func testInitialTokens(t *testing.T, e *env) {
	e.steps(t, e.key("k"), config(ratelimit.PerHour(10).WithInitialTokens(2)), []step{
		{req: inspect(), want: dec{Allowed: true, Limit: 10, Remaining: 2, ResetAfter: 48 * time.Minute, Bandwidth: "0"}},
		{req: consume(2), want: dec{Allowed: true, Limit: 10, Remaining: 0, Consumed: 2, ResetAfter: time.Hour, Bandwidth: "0"}},
		{req: consume(1), want: dec{Limit: 10, RetryAfter: 6 * time.Minute, ResetAfter: time.Hour, Bandwidth: "0"}},
	})
}

// testInitialTokensZero: a bucket may start empty.
func testInitialTokensZero(t *testing.T, e *env) {
	e.steps(t, e.key("k"), config(ratelimit.PerHour(10).WithInitialTokens(0)), []step{
		{req: inspect(), want: dec{Limit: 10, RetryAfter: 6 * time.Minute, ResetAfter: time.Hour, Bandwidth: "0"}},
		{req: consume(1), want: dec{Limit: 10, RetryAfter: 6 * time.Minute, ResetAfter: time.Hour, Bandwidth: "0"}},
	})
}

// testRefilledStartsFromInitial: a bucket whose bandwidth starts below
// capacity keeps its state, once full, for as long as a new bucket takes
// to fill ([ratelimit.State.ExpiresAt]), so a client that waited for the
// full bucket finds it full; after that it expires and starts again from
// InitialTokens. The expiry must not depend on when a backend gets round to
// dropping the state (a sweep, a TTL on a real clock).
func testRefilledStartsFromInitial(t *testing.T, e *env) {
	e.steps(t, e.key("k"), config(ratelimit.PerHour(3).WithInitialTokens(1)), []step{
		{req: consume(1), want: dec{Allowed: true, Limit: 3, Remaining: 0, Consumed: 1, ResetAfter: time.Hour, Bandwidth: "0"}},
		// Full since 0s ago; expires 40m (the warm-up from 1 to 3) later.
		{advance: time.Hour, req: consume(3),
			want: dec{Allowed: true, Limit: 3, Remaining: 0, Consumed: 3, ResetAfter: time.Hour, Bandwidth: "0"}},
		// Full again at 2h; expired at 2h40m: a new bucket, back at 1.
		{advance: time.Hour + 40*time.Minute, req: inspect(),
			want: dec{Allowed: true, Limit: 3, Remaining: 1, ResetAfter: 40 * time.Minute, Bandwidth: "0"}},
	})
}

// largeInterval is the largest capacity, refilled once an hour by as many
// tokens as an hour has microseconds.
var largeInterval = ratelimit.Bandwidth{
	Capacity: ratelimit.MaxCapacity, RefillTokens: 3_600_000_000, RefillPeriod: time.Hour, Refill: ratelimit.Interval,
}

// testLargeInterval: counts near 2^50 stay exact (a Lua backend's doubles
// hold them exactly), and so do the hours to refill them.
func testLargeInterval(t *testing.T, e *env) {
	const c = ratelimit.MaxCapacity
	fill := 312750 * time.Hour // ceil(2^50 / 3.6e9) periods
	e.steps(t, e.key("k"), config(largeInterval), []step{
		{req: consume(c - 1), want: dec{Allowed: true, Limit: c, Remaining: 1, Consumed: c - 1, ResetAfter: fill, Bandwidth: "0"}},
		{req: consume(2), want: dec{Limit: c, Remaining: 1, RetryAfter: time.Hour, ResetAfter: fill, Bandwidth: "0"}},
		{req: consume(1), want: dec{Allowed: true, Limit: c, Remaining: 0, Consumed: 1, ResetAfter: fill, Bandwidth: "0"}},
		{req: consume(1), want: dec{Limit: c, RetryAfter: time.Hour, ResetAfter: fill, Bandwidth: "0"}},
		{req: add(c - 2), want: dec{Allowed: true, Limit: c, Remaining: c - 2, ResetAfter: time.Hour, Bandwidth: "0"}},
	})
}

// testLargeGreedy: greedy refill at the extremes of exact arithmetic: the
// largest capacity refilled one token a microsecond, and a capacity whose
// scaled units reach nearly 2^51.
func testLargeGreedy(t *testing.T, e *env) {
	const c = ratelimit.MaxCapacity
	fast := ratelimit.Every(time.Hour, 3_600_000_000).WithBurst(c) // one token a µs
	e.steps(t, e.key("fast"), config(fast), []step{
		{req: consume(c), want: dec{Allowed: true, Limit: c, Consumed: c, ResetAfter: c * time.Microsecond, Bandwidth: "0"}},
		{req: consume(1), want: dec{Limit: c, RetryAfter: time.Microsecond, ResetAfter: c * time.Microsecond, Bandwidth: "0"}},
		{advance: time.Hour, req: consume(3_600_000_000),
			want: dec{Allowed: true, Limit: c, Consumed: 3_600_000_000, ResetAfter: c * time.Microsecond, Bandwidth: "0"}},
		{advance: c * time.Microsecond, req: inspect(), want: dec{Allowed: true, Limit: c, Remaining: c, Bandwidth: "0"}},
	})

	// 625000 tokens at one an hour: 625000 × 3.6e9 scaled units, just
	// under 2^51.
	slow := ratelimit.PerHour(1).WithBurst(625_000)
	e.steps(t, e.key("slow"), config(slow), []step{
		{req: consume(624_999), want: dec{Allowed: true, Limit: 625_000, Remaining: 1, Consumed: 624_999, ResetAfter: 624_999 * time.Hour, Bandwidth: "0"}},
		{req: consume(2), want: dec{Limit: 625_000, Remaining: 1, RetryAfter: time.Hour, ResetAfter: 624_999 * time.Hour, Bandwidth: "0"}},
		{advance: time.Hour - time.Microsecond, req: consume(2),
			want: dec{Limit: 625_000, Remaining: 1, RetryAfter: time.Microsecond, ResetAfter: 624_998*time.Hour + time.Microsecond, Bandwidth: "0"}},
		{advance: time.Microsecond, req: consume(2),
			want: dec{Allowed: true, Limit: 625_000, Consumed: 2, ResetAfter: 625_000 * time.Hour, Bandwidth: "0"}},
	})
}
