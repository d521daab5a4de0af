package ratelimittest

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// refillAfterScenarios check [ratelimit.Decision.RefillAfter], which the
// other tables leave out: the time until the binding bandwidth holds more
// than Remaining, on its own, whatever the other bandwidths do; for a
// denial, RetryAfter; 0 for a full bandwidth. What httplimit sends as the
// RateLimit field's reset parameter rests on it.
var refillAfterScenarios = []scenario{
	{name: "NextToken", fakeClock: true, run: testRefillNextToken},
	{name: "BindingBandwidthOwn", fakeClock: true, run: testRefillBindingOwn},
	{name: "Reserved", fakeClock: true, run: testRefillReserved},
	{name: "Windows", fakeClock: true, run: testRefillWindows},
	{name: "Full", run: testRefillFull},
}

// refillSteps runs steps as [env.steps] does, checking RefillAfter too, on
// the fake clock.
func (e *env) refillSteps(t *testing.T, key string, cfg ratelimit.Config, steps []step) {
	t.Helper()
	for i, s := range steps {
		e.advance(s.advance)
		if got := e.do(t, key, cfg, s.req); got != s.want {
			t.Fatalf("step %d (after %v more): %s:\n got %s\nwant %s", i, s.advance, describe(s.req), format(got), format(s.want))
		}
	}
}

// testRefillNextToken: 3 tokens, one back every 7 s, on the token bucket
// and the algorithms that decide as it does. Each token taken is back 7 s
// later, however many are missing: RefillAfter stays 7 s while ResetAfter
// grows, and a denial's RetryAfter is the same moment.
func testRefillNextToken(t *testing.T, e *env) {
	s := 7 * time.Second
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA, ratelimit.LeakyBucket} {
		slow := algo(alg, ratelimit.Bandwidth{ID: "slow", Capacity: 3, RefillTokens: 1, RefillPeriod: s})
		e.refillSteps(t, e.key(alg.String()), slow, []step{
			{req: consume(1), want: dec{Allowed: true, Limit: 3, Remaining: 2, Consumed: 1, ResetAfter: s, RefillAfter: s, Bandwidth: "slow"}},
			{req: consume(1), want: dec{Allowed: true, Limit: 3, Remaining: 1, Consumed: 1, ResetAfter: 2 * s, RefillAfter: s, Bandwidth: "slow"}},
			{req: consume(1), want: dec{Allowed: true, Limit: 3, Consumed: 1, ResetAfter: 3 * s, RefillAfter: s, Bandwidth: "slow"}},
			{req: consume(1), want: dec{Limit: 3, RetryAfter: s, ResetAfter: 3 * s, RefillAfter: s, Bandwidth: "slow"}},
			{advance: 3 * time.Second, req: consume(1),
				want: dec{Limit: 3, RetryAfter: 4 * time.Second, ResetAfter: 18 * time.Second, RefillAfter: 4 * time.Second, Bandwidth: "slow"}},
			{advance: 4 * time.Second, req: consume(1), want: dec{Allowed: true, Limit: 3, Consumed: 1, ResetAfter: 3 * s, RefillAfter: s, Bandwidth: "slow"}},
			{advance: 8 * time.Second, req: inspect(),
				want: dec{Allowed: true, Limit: 3, Remaining: 1, ResetAfter: 13 * time.Second, RefillAfter: 6 * time.Second, Bandwidth: "slow"}},
		})
	}
}

// testRefillBindingOwn: a burst of 5 a second over 8 an hour. RefillAfter
// is the binding bandwidth's, the burst's 200 ms while it has the fewest
// tokens, though ResetAfter waits for the hourly one; then the hourly
// one's, once it binds.
func testRefillBindingOwn(t *testing.T, e *env) {
	cfg := config(ratelimit.PerSecond(5).WithID("burst"), ratelimit.PerHour(8).WithID("hourly"))
	ms200 := 200 * time.Millisecond
	e.refillSteps(t, e.key("k"), cfg, []step{
		{req: consume(1), want: dec{Allowed: true, Limit: 5, Remaining: 4, Consumed: 1, ResetAfter: 450 * time.Second, RefillAfter: ms200, Bandwidth: "burst"}},
		{req: consume(4), want: dec{Allowed: true, Limit: 5, Consumed: 4, ResetAfter: 2250 * time.Second, RefillAfter: ms200, Bandwidth: "burst"}},
		{req: consume(1), want: dec{Limit: 5, RetryAfter: ms200, ResetAfter: 2250 * time.Second, RefillAfter: ms200, Bandwidth: "burst"}},
		// A second on, the burst is full and the hourly bandwidth has 3 and
		// 1/450 of a token: 3 taken leave it 449 s short of the next.
		{advance: time.Second, req: consume(3),
			want: dec{Allowed: true, Limit: 8, Consumed: 3, ResetAfter: 3599 * time.Second, RefillAfter: 449 * time.Second, Bandwidth: "hourly"}},
		{req: consume(1), want: dec{Limit: 8, RetryAfter: 449 * time.Second, ResetAfter: 3599 * time.Second, RefillAfter: 449 * time.Second, Bandwidth: "hourly"}},
	})
}

// testRefillReserved: a bandwidth reserved ahead has 0 left until it is out
// of debt, and RefillAfter counts to its first whole token after that, a
// token's time after RetryAfter; on both algorithms that reserve.
func testRefillReserved(t *testing.T, e *env) {
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		half := 30 * time.Second
		e.refillSteps(t, e.key(alg.String()), algo(alg, ratelimit.PerMinute(2)), []step{
			{req: consume(2), want: dec{Allowed: true, Limit: 2, Consumed: 2, ResetAfter: time.Minute, RefillAfter: half, Bandwidth: "0"}},
			{req: reserve(1, time.Minute),
				want: dec{Allowed: true, Limit: 2, Consumed: 1, RetryAfter: half, ResetAfter: 3 * half, RefillAfter: time.Minute, Bandwidth: "0"}},
			{advance: half, req: inspect(), want: dec{Limit: 2, RetryAfter: half, ResetAfter: time.Minute, RefillAfter: half, Bandwidth: "0"}},
		})
	}
}

// testRefillWindows: 3 a minute on each window algorithm, 20 s apart. A
// fixed window gives its requests back when it ends; a sliding log, each
// when it leaves the window; a sliding window counter, when the weight of
// the requests counted falls enough. Each case starts on a whole minute,
// where the counter's windows start.
func testRefillWindows(t *testing.T, e *env) {
	const s = time.Second
	for _, c := range []struct {
		alg ratelimit.Algorithm
		// refill and reset are RefillAfter and ResetAfter after the i-th
		// request; denied is RetryAfter and RefillAfter of the fourth.
		refill, reset [3]time.Duration
		denied        time.Duration
	}{
		{ratelimit.FixedWindow, [3]time.Duration{60 * s, 40 * s, 20 * s}, [3]time.Duration{60 * s, 40 * s, 20 * s}, 20 * s},
		{ratelimit.SlidingWindowLog, [3]time.Duration{60 * s, 40 * s, 20 * s}, [3]time.Duration{60 * s, 60 * s, 60 * s}, 20 * s},
		// In the next window the weight of the requests counted falls by one
		// every 60/n s for n counted: with 2 counted (at 20 s), room for 2
		// at 90 s; with 3 (at 40 s), room for 1 at 80 s.
		{ratelimit.SlidingWindowCounter, [3]time.Duration{120 * s, 70 * s, 40 * s}, [3]time.Duration{120 * s, 100 * s, 80 * s}, 40 * s},
	} {
		t.Run(c.alg.String(), func(t *testing.T) {
			if late := e.clock.Now().Sub(epoch) % time.Minute; late != 0 {
				e.advance(time.Minute - late)
			}
			var steps []step
			for i := range int64(3) {
				steps = append(steps, step{req: consume(1),
					want: dec{Allowed: true, Limit: 3, Remaining: 2 - i, Consumed: 1, ResetAfter: c.reset[i], RefillAfter: c.refill[i], Bandwidth: "0"}})
				if i > 0 {
					steps[i].advance = 20 * s
				}
			}
			steps = append(steps, step{req: consume(1), want: dec{Limit: 3, RetryAfter: c.denied, ResetAfter: c.reset[2], RefillAfter: c.denied, Bandwidth: "0"}})
			e.refillSteps(t, e.key(c.alg.String()), algo(c.alg, ratelimit.PerMinute(3)), steps)
		})
	}
}

// testRefillFull: a full bandwidth has nothing to wait for.
func testRefillFull(t *testing.T, e *env) {
	d := e.do(t, e.key("k"), config(ratelimit.PerMinute(3)), inspect())
	if !d.Allowed || d.Remaining != 3 || d.RefillAfter != 0 {
		t.Fatalf("Inspect on a new bucket: %s, want 3 left and RefillAfter 0", format(d))
	}
}
