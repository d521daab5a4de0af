// Package ratelimittest is the conformance suite that every
// [ratelimit.Backend] must pass, as gocloud's drivertest is for its drivers.
// The memory backend, the Redis backends (standalone and cluster) and any
// decorator run the same scenarios and must agree decision for decision:
// every [ratelimit.Decision] field, durations to the microsecond
// (RefillAfter in the scenarios of its own group).
//
// A backend's test hands [Run] a [Harness] that builds it:
//
//	func TestConformance(t *testing.T) {
//		ratelimittest.Run(t, ratelimittest.Harness{
//			New: func(t *testing.T, clock ratelimit.Clock) ratelimit.Backend {
//				b := memory.New(memory.WithClock(clock))
//				t.Cleanup(func() { b.Close() })
//				return b
//			},
//		})
//	}
//
// # Scenarios
//
// Each scenario is a subtest with its own backend (one call to
// Harness.New) and its own [Clock], starting at 2030-01-01T00:00:00Z. The
// groups are:
//
//   - Counts: a burst of the capacity is allowed and the next request
//     denied with the exact RetryAfter; denied requests take nothing;
//     InitialTokens; waits rounded up to the microsecond; counts near
//     [ratelimit.MaxCapacity].
//   - Refill: Greedy, Interval and IntervalAligned refill as the clock
//     advances.
//   - MultiBandwidth: a burst over a sustained rate, and which bandwidth
//     the decision reports as binding, ties included.
//   - Ops: every [ratelimit.Op], through Backend.Do and through
//     [ratelimit.Bucket].
//   - Inheritance: every [ratelimit.Inheritance] on a config change, on the
//     next call through a [ratelimit.Limiter] and with Replace; matching by
//     ID and by position; exact Proportionally at 2^50, and with the
//     fraction of a token kept (Bucket4j's 1.8 tokens × 20 = 36).
//   - BadInput: bad keys, configs and requests fail with errors wrapping
//     [ratelimit.ErrInvalidKey], [ratelimit.ErrInvalidConfig] or
//     [ratelimit.ErrInvalidRequest], and leave the bucket unchanged.
//   - Keys: keys are independent and compared byte for byte.
//   - Wait: [ratelimit.Bucket.Wait] returns at once, sleeps a few
//     milliseconds, fails at once past the deadline, or gives its tokens back
//     when cancelled.
//   - Concurrency: concurrent callers on one key are admitted exactly the
//     capacity. Run the suite with -race.
//   - Context: a call whose context is already cancelled or past its
//     deadline returns an error wrapping the context's, with no decision,
//     and takes nothing, through Do, a Limiter and a Bucket; calls
//     cancelled while they run return a decision or the context's error.
//     Neither error wraps [ratelimit.ErrTimeout] or
//     [ratelimit.ErrBackendUnavailable].
//   - Algorithms: every algorithm besides the token bucket: exact counts
//     per window, the boundary burst a fixed window allows and a sliding log
//     does not, the sliding counter's weighing, a leaky bucket that never
//     passes its capacity, GCRA deciding as the token bucket, several
//     bandwidths, Reserve refused where it makes no sense, and a change of
//     algorithm starting the bucket afresh.
//   - RefillAfter: [ratelimit.Decision.RefillAfter], which the other
//     groups' tables leave out: the binding bandwidth's own next token on
//     the token algorithms, with several bandwidths and reserved ahead, the
//     window algorithms' next request out of the window, and 0 when full.
//   - Ago: a request with [ratelimit.Request.Ago] is decided as one made
//     that long before, on every algorithm, and tokens taken long enough
//     ago are all back; Ago out of range or on another op is refused.
//
// Scenarios reach the backend only through [ratelimit.Backend.Do],
// [ratelimit.Limiter] and [ratelimit.Bucket], and assume nothing kept in
// the process: the backend may store buckets in a server that outlives the
// test. Keys start with "ratelimittest:", then a random run ID and the
// subtest's name, so runs against a shared server do not meet; they hold no
// braces except where a scenario tests braces.
//
// # Clocks
//
// By default the backend must read time only from the clock passed to New,
// which the scenarios advance by hand: a Redis backend passes it to its
// script as an argument. A backend whose store keeps the time (Redis TIME)
// sets [Harness.ServerClock]. The suite then passes a real-time clock the
// backend may ignore and:
//
//   - skips the scenarios that step the clock by minutes or check a wait to
//     the microsecond (Counts/RetryAfterRoundsUp, Counts/LargeGreedy,
//     Counts/RefilledBucketStartsFromInitialTokens,
//     Ops/EstimateKeepsANewBucket, Refill/Greedy,
//     Refill/Interval, Refill/IntervalAligned, Refill/IntervalAlignedPartial,
//     MultiBandwidth/SustainedBinds, Inheritance/RefillsAtNewRate, and
//     every RefillAfter scenario but RefillAfter/Full, and Ago/AsIfMadeThen);
//   - runs Refill/*Bounds by sleeping (about half a second in all) and
//     checks token counts against bounds;
//   - checks every RetryAfter and ResetAfter as at most the exact value and
//     short of it by no more than the time the scenario has run. Token
//     counts stay exact: those scenarios refill too slowly for a token to
//     return while they run.
//
// Wait sleeps on the real clock whichever the backend reads, so the Wait
// scenarios keep every sleep to a few milliseconds.
package ratelimittest
