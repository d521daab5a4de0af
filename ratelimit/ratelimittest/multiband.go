package ratelimittest

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// multiBandwidthScenarios check configs of several bandwidths: a request
// passes only when every bandwidth has the tokens, and the decision reports
// the binding one (see [ratelimit.Decision.Bandwidth]).
var multiBandwidthScenarios = []scenario{
	{name: "BurstBinds", run: testBurstBinds},
	{name: "SustainedBinds", fakeClock: true, run: testSustainedBinds},
	{name: "NamedByIndex", run: testNamedByIndex},
	{name: "TiesBindFirst", run: testTiesBindFirst},
}

// burstAndHourly is a burst of 4 refilled in a minute (a token every 15s)
// over 6 an hour (a token every 10 minutes).
var burstAndHourly = config(
	ratelimit.Every(time.Minute, 4).WithID("burst"),
	ratelimit.Every(time.Hour, 6).WithID("hourly"),
)

// burstSteps drain the burst: it binds while it has the fewest tokens, and
// when it denies.
var burstSteps = []step{
	{req: consume(1), want: dec{Allowed: true, Limit: 4, Remaining: 3, Consumed: 1, ResetAfter: 10 * time.Minute, Bandwidth: "burst"}},
	{req: consume(3), want: dec{Allowed: true, Limit: 4, Remaining: 0, Consumed: 3, ResetAfter: 40 * time.Minute, Bandwidth: "burst"}},
	{req: consume(1), want: dec{Limit: 4, RetryAfter: 15 * time.Second, ResetAfter: 40 * time.Minute, Bandwidth: "burst"}},
	{req: estimate(1), want: dec{Limit: 4, RetryAfter: 15 * time.Second, ResetAfter: 40 * time.Minute, Bandwidth: "burst"}},
}

func testBurstBinds(t *testing.T, e *env) {
	e.steps(t, e.key("k"), burstAndHourly, burstSteps)
}

// testSustainedBinds: once the burst has refilled, the hourly bandwidth runs
// out first and binds, with a tenth of a token already refilled.
func testSustainedBinds(t *testing.T, e *env) {
	steps := append([]step{}, burstSteps...)
	steps = append(steps,
		step{advance: time.Minute, req: consume(2),
			want: dec{Allowed: true, Limit: 6, Remaining: 0, Consumed: 2, ResetAfter: 59 * time.Minute, Bandwidth: "hourly"}},
		step{req: consume(1), want: dec{Limit: 6, RetryAfter: 9 * time.Minute, ResetAfter: 59 * time.Minute, Bandwidth: "hourly"}},
		step{advance: 9 * time.Minute, req: consume(1),
			want: dec{Allowed: true, Limit: 6, Remaining: 0, Consumed: 1, ResetAfter: time.Hour, Bandwidth: "hourly"}},
	)
	e.steps(t, e.key("k"), burstAndHourly, steps)
}

// testNamedByIndex: a bandwidth without an ID is named by its index.
func testNamedByIndex(t *testing.T, e *env) {
	denied := dec{Limit: 5, RetryAfter: 12 * time.Minute, ResetAfter: time.Hour, Bandwidth: "1"}
	e.steps(t, e.key("k"), config(ratelimit.PerHour(10), ratelimit.PerHour(5)), []step{
		{req: consume(5), want: dec{Allowed: true, Limit: 5, Remaining: 0, Consumed: 5, ResetAfter: time.Hour, Bandwidth: "1"}},
		{req: consume(1), want: denied},
		{req: upTo(3), want: denied},
	})
}

// testTiesBindFirst pins the tie-breaks, so that backends agree decision for
// decision: among bandwidths with equally few tokens the first in the config
// binds; among equally slow ones, too.
func testTiesBindFirst(t *testing.T, e *env) {
	e.steps(t, e.key("fewest"), config(ratelimit.PerHour(3).WithID("a"), ratelimit.Every(2*time.Hour, 3).WithID("b")), []step{
		{req: consume(3), want: dec{Allowed: true, Limit: 3, Consumed: 3, ResetAfter: 2 * time.Hour, Bandwidth: "a"}},
		{req: consume(1), want: dec{Limit: 3, RetryAfter: 40 * time.Minute, ResetAfter: 2 * time.Hour, Bandwidth: "b"}},
	})
	e.steps(t, e.key("equal"), config(ratelimit.PerHour(2).WithID("x"), ratelimit.PerHour(2).WithID("y")), []step{
		{req: consume(2), want: dec{Allowed: true, Limit: 2, Consumed: 2, ResetAfter: time.Hour, Bandwidth: "x"}},
		{req: consume(1), want: dec{Limit: 2, RetryAfter: 30 * time.Minute, ResetAfter: time.Hour, Bandwidth: "x"}},
	})
}
