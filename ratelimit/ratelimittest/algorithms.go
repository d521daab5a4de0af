package ratelimittest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// algorithmScenarios check each algorithm other than the token bucket: its
// exact counts, its burst behaviour at a window boundary, several
// bandwidths, the ops it refuses, and a change of algorithm. The suite's
// fake clock starts on a whole hour, so the sliding window counter's
// epoch-aligned windows start with the scenarios.
var algorithmScenarios = []scenario{
	{name: "HourlyCounts", run: testHourlyCounts},
	{name: "FixedWindowExactPerWindow", fakeClock: true, run: testFixedWindowExact},
	{name: "FixedWindowStartsOnFirstTake", fakeClock: true, run: testFixedWindowFirstTake},
	{name: "FixedWindowAligned", fakeClock: true, run: testFixedWindowAligned},
	{name: "BoundaryBurstFixedWindow", fakeClock: true, run: testBoundaryBurstFixed},
	{name: "BoundaryBurstSlidingLog", fakeClock: true, run: testBoundaryBurstLog},
	{name: "SlidingLogRolls", fakeClock: true, run: testSlidingLogRolls},
	{name: "SlidingLogSameMicrosecond", fakeClock: true, run: testSlidingLogSameMicrosecond},
	{name: "SlidingCounterWeighs", fakeClock: true, run: testSlidingCounterWeighs},
	{name: "LeakyBucketNeverAboveCapacity", fakeClock: true, run: testLeakyNeverAboveCapacity},
	{name: "GCRAMatchesTokenBucket", fakeClock: true, run: testGCRAMatchesTokenBucket},
	{name: "WindowsMultiBandwidth", fakeClock: true, run: testWindowsMultiBandwidth},
	{name: "UnsupportedOps", run: testUnsupportedOps},
	{name: "AlgorithmChangeStartsAfresh", run: testAlgorithmChange},
}

// algo builds a Config of alg over the given bandwidths.
func algo(alg ratelimit.Algorithm, bws ...ratelimit.Bandwidth) ratelimit.Config {
	return ratelimit.Config{Algorithm: alg, Bandwidths: bws}
}

// testHourlyCounts: every algorithm admits exactly 5 of 5 an hour and then
// denies, with its own RetryAfter and ResetAfter. It runs on the server's
// clock too, for all but the sliding window counter, whose windows are
// aligned to the epoch and so depend on the hour it runs in.
func testHourlyCounts(t *testing.T, e *env) {
	const min = time.Minute
	for _, c := range []struct {
		alg ratelimit.Algorithm
		// resetAfter is ResetAfter after the i-th request (1-based).
		resetAfter     func(i int64) time.Duration
		retry, deniedR time.Duration
	}{
		{ratelimit.TokenBucket, func(i int64) time.Duration { return time.Duration(i) * 12 * min }, 12 * min, time.Hour},
		{ratelimit.GCRA, func(i int64) time.Duration { return time.Duration(i) * 12 * min }, 12 * min, time.Hour},
		{ratelimit.LeakyBucket, func(i int64) time.Duration { return time.Duration(i) * 12 * min }, 12 * min, time.Hour},
		{ratelimit.FixedWindow, func(int64) time.Duration { return time.Hour }, time.Hour, time.Hour},
		{ratelimit.SlidingWindowLog, func(int64) time.Duration { return time.Hour }, time.Hour, time.Hour},
		// Next window: 4 more pass once the previous window's 5, weighted,
		// drop to 1: 48 minutes into it.
		{ratelimit.SlidingWindowCounter, func(int64) time.Duration { return 2 * time.Hour }, time.Hour + 12*min, 2 * time.Hour},
	} {
		t.Run(c.alg.String(), func(t *testing.T) {
			if c.alg == ratelimit.SlidingWindowCounter && !e.fake() {
				t.Skip("epoch-aligned windows: exact only on the fake clock")
			}
			var steps []step
			for i := range int64(5) {
				steps = append(steps, step{req: consume(1), want: dec{Allowed: true, Limit: 5, Remaining: 4 - i, Consumed: 1, ResetAfter: c.resetAfter(i + 1), Bandwidth: "0"}})
			}
			denied := dec{Limit: 5, RetryAfter: c.retry, ResetAfter: c.deniedR, Bandwidth: "0"}
			steps = append(steps, step{req: consume(1), want: denied}, step{req: estimate(1), want: denied}, step{req: consume(1), want: denied})
			e.steps(t, e.key(c.alg.String()), algo(c.alg, ratelimit.PerHour(5)), steps)
		})
	}
}

// testFixedWindowExact: 5 a minute, then denied until the window ends, to
// the microsecond; then a new window of 5.
func testFixedWindowExact(t *testing.T, e *env) {
	var steps []step
	for i := range int64(5) {
		steps = append(steps, step{req: consume(1), want: dec{Allowed: true, Limit: 5, Remaining: 4 - i, Consumed: 1, ResetAfter: time.Minute, Bandwidth: "0"}})
	}
	steps = append(steps,
		step{req: consume(1), want: dec{Limit: 5, RetryAfter: time.Minute, ResetAfter: time.Minute, Bandwidth: "0"}},
		step{advance: time.Minute - time.Microsecond, req: consume(1), want: dec{Limit: 5, RetryAfter: time.Microsecond, ResetAfter: time.Microsecond, Bandwidth: "0"}},
		step{advance: time.Microsecond, req: consume(5), want: dec{Allowed: true, Limit: 5, Consumed: 5, ResetAfter: time.Minute, Bandwidth: "0"}},
	)
	e.steps(t, e.key("k"), algo(ratelimit.FixedWindow, ratelimit.PerMinute(5)), steps)
}

// testFixedWindowFirstTake: the window starts with the first request that
// takes, not with an Estimate or Inspect, nor with the bucket's creation.
func testFixedWindowFirstTake(t *testing.T, e *env) {
	e.steps(t, e.key("k"), algo(ratelimit.FixedWindow, ratelimit.PerMinute(5)), []step{
		{req: estimate(5), want: dec{Allowed: true, Limit: 5, Remaining: 5, Bandwidth: "0"}},
		{advance: 40 * time.Second, req: inspect(), want: dec{Allowed: true, Limit: 5, Remaining: 5, Bandwidth: "0"}},
		{advance: 40 * time.Second, req: consume(2), want: dec{Allowed: true, Limit: 5, Remaining: 3, Consumed: 2, ResetAfter: time.Minute, Bandwidth: "0"}},
		{advance: 50 * time.Second, req: consume(4), want: dec{Limit: 5, Remaining: 3, RetryAfter: 10 * time.Second, ResetAfter: 10 * time.Second, Bandwidth: "0"}},
		{advance: 10 * time.Second, req: consume(4), want: dec{Allowed: true, Limit: 5, Remaining: 1, Consumed: 4, ResetAfter: time.Minute, Bandwidth: "0"}},
	})
}

// testFixedWindowAligned: with IntervalAligned refill the windows are the
// anchor's, whenever the first request comes.
func testFixedWindowAligned(t *testing.T, e *env) {
	bw := ratelimit.PerMinute(5).AlignedTo(epoch.Add(15 * time.Second))
	e.steps(t, e.key("k"), algo(ratelimit.FixedWindow, bw), []step{
		// The window is [epoch-45s, epoch+15s).
		{req: consume(5), want: dec{Allowed: true, Limit: 5, Consumed: 5, ResetAfter: 15 * time.Second, Bandwidth: "0"}},
		{advance: 10 * time.Second, req: consume(1), want: dec{Limit: 5, RetryAfter: 5 * time.Second, ResetAfter: 5 * time.Second, Bandwidth: "0"}},
		{advance: 5 * time.Second, req: consume(1), want: dec{Allowed: true, Limit: 5, Remaining: 4, Consumed: 1, ResetAfter: time.Minute, Bandwidth: "0"}},
	})
}

// boundaryBurst opens a window with one request, then at one microsecond
// before the window of a minute ends sends capacity requests, and one
// microsecond later capacity more, one token each. It returns how many of
// the last 2 × capacity passed: all within 2µs.
func boundaryBurst(t *testing.T, e *env, alg ratelimit.Algorithm, capacity int64) int64 {
	t.Helper()
	cfg := algo(alg, ratelimit.PerMinute(capacity))
	key := e.key("k")
	e.do(t, key, cfg, consume(1))
	var passed int64
	for _, gap := range []time.Duration{time.Minute - time.Microsecond, time.Microsecond} {
		e.advance(gap)
		for range capacity {
			if e.do(t, key, cfg, consume(1)).Allowed {
				passed++
			}
		}
	}
	return passed
}

// testBoundaryBurstFixed: a fixed window lets nearly twice its capacity
// through around a window boundary: 9 at its end, 10 at the next one's
// start.
func testBoundaryBurstFixed(t *testing.T, e *env) {
	if got := boundaryBurst(t, e, ratelimit.FixedWindow, 10); got != 19 {
		t.Fatalf("a fixed window of 10 passed %d in 2µs around its boundary; want 19", got)
	}
}

// testBoundaryBurstLog: a sliding log never lets more than its capacity
// through in any window: 9 at the end, then 1 once the first request is a
// minute old.
func testBoundaryBurstLog(t *testing.T, e *env) {
	if got := boundaryBurst(t, e, ratelimit.SlidingWindowLog, 10); got != 10 {
		t.Fatalf("a sliding log of 10 passed %d in 2µs around a minute boundary; want 10", got)
	}
}

// testSlidingLogRolls: each request frees its slot exactly a window after
// it was made, and a denial's RetryAfter points at that moment.
func testSlidingLogRolls(t *testing.T, e *env) {
	const s = time.Second
	e.steps(t, e.key("k"), algo(ratelimit.SlidingWindowLog, ratelimit.PerMinute(3)), []step{
		{req: consume(1), want: dec{Allowed: true, Limit: 3, Remaining: 2, Consumed: 1, ResetAfter: 60 * s, Bandwidth: "0"}},
		{advance: 20 * s, req: consume(1), want: dec{Allowed: true, Limit: 3, Remaining: 1, Consumed: 1, ResetAfter: 60 * s, Bandwidth: "0"}},
		{advance: 20 * s, req: consume(1), want: dec{Allowed: true, Limit: 3, Consumed: 1, ResetAfter: 60 * s, Bandwidth: "0"}},
		{advance: 10 * s, req: consume(1), want: dec{Limit: 3, RetryAfter: 10 * s, ResetAfter: 50 * s, Bandwidth: "0"}},
		{req: consume(2), want: dec{Limit: 3, RetryAfter: 30 * s, ResetAfter: 50 * s, Bandwidth: "0"}},
		{advance: 10 * s, req: consume(1), want: dec{Allowed: true, Limit: 3, Consumed: 1, ResetAfter: 60 * s, Bandwidth: "0"}},
		{req: add(1), want: dec{Allowed: true, Limit: 3, Remaining: 1, ResetAfter: 40 * s, Bandwidth: "0"}},
	})
}

// testSlidingLogSameMicrosecond: requests in the same microsecond each
// count.
func testSlidingLogSameMicrosecond(t *testing.T, e *env) {
	var steps []step
	for i := range int64(4) {
		steps = append(steps, step{req: consume(1), want: dec{Allowed: true, Limit: 4, Remaining: 3 - i, Consumed: 1, ResetAfter: time.Minute, Bandwidth: "0"}})
	}
	steps = append(steps, step{req: consume(1), want: dec{Limit: 4, RetryAfter: time.Minute, ResetAfter: time.Minute, Bandwidth: "0"}})
	e.steps(t, e.key("k"), algo(ratelimit.SlidingWindowLog, ratelimit.PerMinute(4)), steps)
}

// testSlidingCounterWeighs: 8 in the previous minute, 30s into this one
// they weigh 4; with 3 of this minute's, 3 more pass, and the next waits
// until the 8 weigh 3: 37.5s into the minute (8 × 22.5/60).
func testSlidingCounterWeighs(t *testing.T, e *env) {
	const s, us = time.Second, time.Microsecond
	e.steps(t, e.key("k"), algo(ratelimit.SlidingWindowCounter, ratelimit.PerMinute(10)), []step{
		{req: consume(8), want: dec{Allowed: true, Limit: 10, Remaining: 2, Consumed: 8, ResetAfter: 120 * s, Bandwidth: "0"}},
		{advance: 90 * s, req: consume(3), want: dec{Allowed: true, Limit: 10, Remaining: 3, Consumed: 3, ResetAfter: 90 * s, Bandwidth: "0"}},
		{req: consume(3), want: dec{Allowed: true, Limit: 10, Consumed: 3, ResetAfter: 90 * s, Bandwidth: "0"}},
		{req: consume(1), want: dec{Limit: 10, RetryAfter: 7500 * time.Millisecond, ResetAfter: 90 * s, Bandwidth: "0"}},
		{advance: 7500*time.Millisecond - us, req: consume(1), want: dec{Limit: 10, RetryAfter: us, ResetAfter: 82500*time.Millisecond + us, Bandwidth: "0"}},
		{advance: us, req: consume(1), want: dec{Allowed: true, Limit: 10, Consumed: 1, ResetAfter: 82500 * time.Millisecond, Bandwidth: "0"}},
	})
}

// testLeakyNeverAboveCapacity: a leaky bucket of 5 leaking one every 200ms
// admits 5 of a burst of 10, then one per leak, whatever the bursts.
func testLeakyNeverAboveCapacity(t *testing.T, e *env) {
	cfg := algo(ratelimit.LeakyBucket, ratelimit.PerSecond(5))
	key := e.key("k")
	burst := func(n int) (passed int64) {
		for range n {
			if e.do(t, key, cfg, consume(1)).Allowed {
				passed++
			}
		}
		return passed
	}
	for _, c := range []struct {
		advance time.Duration
		burst   int
		want    int64
	}{
		{0, 10, 5},
		{200 * time.Millisecond, 10, 1},
		{100 * time.Millisecond, 10, 0},
		{500 * time.Millisecond, 10, 3},
		{10 * time.Second, 20, 5},
	} {
		e.advance(c.advance)
		if got := burst(c.burst); got != c.want {
			t.Fatalf("after %v, a burst of %d passed %d; want %d", c.advance, c.burst, got, c.want)
		}
	}
}

// testGCRAMatchesTokenBucket: GCRA decides as a greedy token bucket does,
// reservations included, while the clock moves forward.
func testGCRAMatchesTokenBucket(t *testing.T, e *env) {
	bws := []ratelimit.Bandwidth{ratelimit.Every(10*time.Second, 3).WithBurst(5).WithID("burst"), ratelimit.PerHour(40).WithID("hourly")}
	gcra, tb := algo(ratelimit.GCRA, bws...), algo(ratelimit.TokenBucket, bws...)
	reqs := []ratelimit.Request{consume(2), consume(3), consume(1), reserve(2, 10*time.Second), estimate(1), upTo(9), add(1), inspect(), consume(5), reserve(5, time.Minute), consume(1)}
	for i := range 40 {
		req := reqs[i%len(reqs)]
		got, want := e.do(t, e.key("gcra"), gcra, req), e.do(t, e.key("tb"), tb, req)
		e.check(t, describe(req), got, want)
		e.advance(time.Duration(i%7) * 1100 * time.Millisecond)
	}
}

// testWindowsMultiBandwidth: with 10 an hour and 3 a minute, the minute's
// limit binds; its denial takes nothing from the hour's, which a config of
// the hourly bandwidth alone then shows (the window algorithms keep their
// counts across a config change).
func testWindowsMultiBandwidth(t *testing.T, e *env) {
	hourly, minute := ratelimit.PerHour(10).WithID("hour"), ratelimit.PerMinute(3).WithID("minute")
	for _, c := range []struct {
		alg ratelimit.Algorithm
		// The denials' RetryAfter: of 1 and 2 while the minute's window
		// holds 3, and of 8 of the hour's after the config change.
		retry1, retry2, retry8 time.Duration
		reset                  time.Duration // after the first 3
	}{
		{ratelimit.FixedWindow, time.Minute, time.Minute, time.Hour, time.Hour},
		{ratelimit.SlidingWindowLog, time.Minute, time.Minute, time.Hour, time.Hour},
		// The next window, once the 3 weigh 2 (for 1) or 1 (for 2) of the
		// minute's, 7 of the hour's: 20s, 40s or 20 minutes into it.
		{ratelimit.SlidingWindowCounter, 80 * time.Second, 100 * time.Second, 80 * time.Minute, 2 * time.Hour},
	} {
		t.Run(c.alg.String(), func(t *testing.T) {
			cfg, onlyHourly := algo(c.alg, hourly, minute), algo(c.alg, hourly)
			e.steps(t, e.key(c.alg.String()), cfg, []step{
				{req: consume(3), want: dec{Allowed: true, Limit: 3, Consumed: 3, ResetAfter: c.reset, Bandwidth: "minute"}},
				{req: consume(1), want: dec{Limit: 3, RetryAfter: c.retry1, ResetAfter: c.reset, Bandwidth: "minute"}},
				{req: consume(2), want: dec{Limit: 3, RetryAfter: c.retry2, ResetAfter: c.reset, Bandwidth: "minute"}},
				{cfg: &onlyHourly, req: estimate(7), want: dec{Allowed: true, Limit: 10, Remaining: 7, ResetAfter: c.reset, Bandwidth: "hour"}},
				{cfg: &onlyHourly, req: estimate(8), want: dec{Limit: 10, Remaining: 7, RetryAfter: c.retry8, ResetAfter: c.reset, Bandwidth: "hour"}},
			})
		})
	}
}

// testUnsupportedOps: Reserve on an algorithm that cannot lend is refused
// before any I/O, and so is Bucket.Wait's fallback for it: it polls.
func testUnsupportedOps(t *testing.T, e *env) {
	ctx := context.Background()
	for _, alg := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindowLog, ratelimit.SlidingWindowCounter, ratelimit.LeakyBucket} {
		cfg, key := algo(alg, ratelimit.PerHour(5)), e.key(alg.String())
		_, err := e.backend.Do(ctx, key, cfg, reserve(1, time.Hour))
		if !errors.Is(err, ratelimit.ErrInvalidRequest) {
			t.Errorf("%v: Reserve: %v; want ErrInvalidRequest", alg, err)
		}
		d := e.do(t, key, cfg, estimate(5))
		if !d.Allowed || d.Remaining != 5 {
			t.Errorf("%v: after the refused Reserve: %s; want a full bucket", alg, format(d))
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		if err := e.bucket(key, cfg).Wait(wctx, 5); err != nil {
			t.Errorf("%v: Wait(5) on a full bucket: %v", alg, err)
		}
		if err := e.bucket(key, cfg).Wait(wctx, 1); !errors.Is(err, ratelimit.ErrWaitExceedsDeadline) {
			t.Errorf("%v: Wait(1) on an empty bucket, a minute to the deadline: %v; want ErrWaitExceedsDeadline", alg, err)
		}
		cancel()
	}
}

// testAlgorithmChange: a bucket whose config changes algorithm starts
// afresh, whatever the strategy, from and to every algorithm.
func testAlgorithmChange(t *testing.T, e *env) {
	key := e.key("k")
	algs := []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.SlidingWindowLog, ratelimit.FixedWindow, ratelimit.GCRA,
		ratelimit.SlidingWindowCounter, ratelimit.LeakyBucket, ratelimit.SlidingWindowLog, ratelimit.TokenBucket}
	for _, alg := range algs {
		d := e.do(t, key, algo(alg, ratelimit.PerHour(5)), consume(2))
		if !d.Allowed || d.Remaining != 3 {
			t.Fatalf("%v after another algorithm's 2: %s; want a fresh bucket, Remaining 3", alg, format(d))
		}
	}
}
