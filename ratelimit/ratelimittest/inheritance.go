package ratelimittest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// inheritanceScenarios check how a bucket's tokens carry over when the
// config passed for its key changes (see [ratelimit.Inheritance]).
var inheritanceScenarios = append(strategyScenarios(), []scenario{
	{name: "UnchangedConfigKeepsState", run: testUnchangedConfigKeepsState},
	{name: "MatchByID", run: testMatchByID},
	{name: "MatchByPosition", run: testMatchByPosition},
	{name: "NoMatchStartsFresh", run: testNoMatchStartsFresh},
	{name: "RefillsAtNewRate", fakeClock: true, run: testRefillsAtNewRate},
	{name: "ProportionallyExact", run: testProportionallyExact},
	{name: "ProportionallyKeepsTheFraction", fakeClock: true, run: testProportionallyKeepsTheFraction},
}...)

// strategyScenarios convert a bucket of 10 holding 6 tokens to a capacity of
// 20 and of 4 with every strategy, both on the next call through a Limiter
// (as a plan change would) and with an explicit Replace.
func strategyScenarios() []scenario {
	cases := []struct {
		strategy ratelimit.Inheritance
		capacity int64
		tenths   int64 // what the 6 tokens become, in tenths of a token
	}{
		{ratelimit.AsIs, 20, 60},
		{ratelimit.AsIs, 4, 40},
		{ratelimit.ResetTokens, 20, 200},
		{ratelimit.ResetTokens, 4, 40},
		{ratelimit.Proportionally, 20, 120},
		{ratelimit.Proportionally, 4, 24}, // 2.4: the fraction is kept
		{ratelimit.Additive, 20, 160},     // 6 + the 10 gained
		{ratelimit.Additive, 4, 40},
	}
	var out []scenario
	for _, c := range cases {
		name := fmt.Sprintf("%v/To%d", c.strategy, c.capacity)
		out = append(out,
			scenario{name: name + "/Limiter", run: func(t *testing.T, e *env) {
				testStrategyViaLimiter(t, e, c.strategy, c.capacity, c.tenths)
			}},
			scenario{name: name + "/Replace", run: func(t *testing.T, e *env) {
				testStrategyViaReplace(t, e, c.strategy, c.capacity, c.tenths)
			}},
		)
	}
	return out
}

// sixOfTen leaves 6 tokens in a new bucket of 10 an hour named "main".
func sixOfTen(t *testing.T, e *env, key string) {
	t.Helper()
	e.check(t, "Consume(4) on a new bucket of 10", e.do(t, key, config(ratelimit.PerHour(10).WithID("main")), consume(4)),
		dec{Allowed: true, Limit: 10, Remaining: 6, Consumed: 4, ResetAfter: 24 * time.Minute, Bandwidth: "main"})
}

// tenthsDecision is the decision on a bucket of capacity an hour named
// "main" that holds tenths tenths of a token.
func tenthsDecision(capacity, tenths int64) dec {
	return dec{Allowed: true, Limit: capacity, Remaining: tenths / 10,
		ResetAfter: time.Duration(10*capacity-tenths) * (time.Hour / time.Duration(10*capacity)), Bandwidth: "main"}
}

// testStrategyViaLimiter: a Limiter with the strategy (the default one for
// AsIs) converts the bucket in the call that brings the new config, and
// only in that one.
func testStrategyViaLimiter(t *testing.T, e *env, s ratelimit.Inheritance, capacity, tenths int64) {
	key := e.key("k")
	sixOfTen(t, e, key)
	l := e.limiter(ratelimit.WithInheritance(s))
	if s == ratelimit.DefaultInheritance {
		l = e.limiter()
	}
	cfg := config(ratelimit.PerHour(capacity).WithID("main"))
	for i := range int64(2) {
		d, err := l.Allow(context.Background(), key, cfg)
		if err != nil {
			t.Fatalf("Allow with a capacity of %d: %v", capacity, err)
		}
		want := tenthsDecision(capacity, tenths-10*(1+i))
		want.Consumed = 1
		e.check(t, fmt.Sprintf("Allow call %d with a capacity of %d", i, capacity), d, want)
	}
}

// testStrategyViaReplace: a Replace converts with the strategy it names,
// and later calls with the same config keep the result.
func testStrategyViaReplace(t *testing.T, e *env, s ratelimit.Inheritance, capacity, tenths int64) {
	key := e.key("k")
	sixOfTen(t, e, key)
	want := tenthsDecision(capacity, tenths)
	e.steps(t, key, config(ratelimit.PerHour(capacity).WithID("main")), []step{
		{req: replace(s), want: want},
		{req: inspect(), want: want},
	})
}

// testUnchangedConfigKeepsState: the strategy applies only when the config
// changes; ResetTokens does not refill a bucket called with its own config.
func testUnchangedConfigKeepsState(t *testing.T, e *env) {
	l := e.limiter(ratelimit.WithInheritance(ratelimit.ResetTokens))
	cfg := config(ratelimit.PerHour(10))
	for i := range int64(3) {
		d, err := l.Allow(context.Background(), e.key("k"), cfg)
		if err != nil {
			t.Fatalf("Allow: %v", err)
		}
		e.check(t, fmt.Sprintf("Allow call %d", i), d,
			dec{Allowed: true, Limit: 10, Remaining: 9 - i, Consumed: 1, ResetAfter: time.Duration(i+1) * 6 * time.Minute, Bandwidth: "0"})
	}
}

// testMatchByID: bandwidths carry their tokens to the bandwidth of the same
// ID wherever it moved; a new ID starts as in a new bucket (here from its
// InitialTokens).
func testMatchByID(t *testing.T, e *env) {
	a := ratelimit.PerHour(10).WithID("a")
	b := ratelimit.PerHour(100).WithID("b")
	next := config(b, a, ratelimit.PerHour(50).WithID("c").WithInitialTokens(7))
	e.steps(t, e.key("k"), config(a, b), []step{
		{req: consume(4), want: dec{Allowed: true, Limit: 10, Remaining: 6, Consumed: 4, ResetAfter: 24 * time.Minute, Bandwidth: "a"}},
		// b 95, a 5, c 6; c is 44 tokens short at 72s each.
		{cfg: &next, req: consume(1),
			want: dec{Allowed: true, Limit: 10, Remaining: 5, Consumed: 1, ResetAfter: 52*time.Minute + 48*time.Second, Bandwidth: "a"}},
		{cfg: &next, req: consume(5), want: dec{Allowed: true, Limit: 10, Consumed: 5, ResetAfter: time.Hour, Bandwidth: "a"}},
	})
}

// testMatchByPosition: bandwidths without IDs match by position.
func testMatchByPosition(t *testing.T, e *env) {
	next := config(ratelimit.PerHour(20), ratelimit.PerHour(100))
	e.steps(t, e.key("k"), config(ratelimit.PerHour(10), ratelimit.PerHour(100)), []step{
		{req: consume(4), want: dec{Allowed: true, Limit: 10, Remaining: 6, Consumed: 4, ResetAfter: 24 * time.Minute, Bandwidth: "0"}},
		{cfg: &next, req: consume(1), want: dec{Allowed: true, Limit: 20, Remaining: 5, Consumed: 1, ResetAfter: 45 * time.Minute, Bandwidth: "0"}},
	})
}

// testNoMatchStartsFresh: a bandwidth whose ID matches nothing, or that has
// an ID where the old one had none (or the reverse), starts as in a new
// bucket, whatever the strategy.
func testNoMatchStartsFresh(t *testing.T, e *env) {
	configs := []ratelimit.Config{
		config(ratelimit.PerHour(10)),
		config(ratelimit.PerHour(10).WithID("x")),
		config(ratelimit.PerHour(10).WithID("y")),
		config(ratelimit.PerHour(10)),
	}
	var steps []step
	for i := range configs {
		name := "0"
		if id := configs[i].Bandwidths[0].ID; id != "" {
			name = id
		}
		steps = append(steps, step{cfg: &configs[i], req: consume(4),
			want: dec{Allowed: true, Limit: 10, Remaining: 6, Consumed: 4, ResetAfter: 24 * time.Minute, Bandwidth: name}})
	}
	e.steps(t, e.key("k"), configs[0], steps)
}

// testRefillsAtNewRate: tokens carry over as they were when the bucket was
// last touched, and the time since refills at the new config's rate: half an
// hour at 20 an hour is 10 tokens (the old rate would have given 5).
func testRefillsAtNewRate(t *testing.T, e *env) {
	next := config(ratelimit.PerHour(20).WithID("main"))
	e.steps(t, e.key("k"), config(ratelimit.PerHour(10).WithID("main")), []step{
		{req: consume(10), want: dec{Allowed: true, Limit: 10, Consumed: 10, ResetAfter: time.Hour, Bandwidth: "main"}},
		{advance: 30 * time.Minute, cfg: &next, req: consume(1),
			want: dec{Allowed: true, Limit: 20, Remaining: 9, Consumed: 1, ResetAfter: 33 * time.Minute, Bandwidth: "main"}},
	})
}

// testProportionallyExact: Proportionally computes floor(tokens × new / old)
// exactly even where the product needs 99 bits. With doubles,
// (2^50−3)(2^49+1)/(2^50−1) comes out as 2^49; the exact answer is 2^49−1.
func testProportionallyExact(t *testing.T, e *env) {
	big := func(capacity int64) ratelimit.Bandwidth {
		return ratelimit.Bandwidth{ID: "main", Capacity: capacity, RefillTokens: 3_600_000_000, RefillPeriod: time.Hour, Refill: ratelimit.Interval}
	}
	const oldCap, newCap = 1<<50 - 1, 1<<49 + 1
	next := config(big(newCap))
	e.steps(t, e.key("k"), config(big(oldCap)), []step{
		{req: consume(2), want: dec{Allowed: true, Limit: oldCap, Remaining: oldCap - 2, Consumed: 2, ResetAfter: time.Hour, Bandwidth: "main"}},
		{cfg: &next, req: replace(ratelimit.Proportionally),
			want: dec{Allowed: true, Limit: newCap, Remaining: 1<<49 - 1, ResetAfter: time.Hour, Bandwidth: "main"}},
	})
}

// testProportionallyKeepsTheFraction: Proportionally scales the exact level,
// fraction included, and rounds down once. Bucket4j's example: 1.8 tokens
// left when the capacity grows 20 times become 36 (not 1 × 20).
func testProportionallyKeepsTheFraction(t *testing.T, e *env) {
	next := config(ratelimit.PerHour(200).WithID("main"))
	e.steps(t, e.key("k"), config(ratelimit.PerHour(10).WithID("main")), []step{
		{req: consume(9), want: dec{Allowed: true, Limit: 10, Remaining: 1, Consumed: 9, ResetAfter: 54 * time.Minute, Bandwidth: "main"}},
		// A token every 6 minutes: 4m48s later the bucket holds 1.8, as this
		// Inspect records.
		{advance: 4*time.Minute + 48*time.Second, req: inspect(), want: tenthsDecision(10, 18)},
		{cfg: &next, req: replace(ratelimit.Proportionally), want: tenthsDecision(200, 360)},
		{cfg: &next, req: inspect(), want: tenthsDecision(200, 360)},
	})
}
