package ratelimittest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// versionScenarios check that a versioned config changes a bucket forward
// only (see [ratelimit.Config.Version]): calls that bring an older version
// than the bucket holds are decided on the bucket's newer config, so a
// rollout in which replicas disagree cannot create tokens.
var versionScenarios = append(rolloutScenarios(), []scenario{
	{name: "StaleCallDecidedOnNewer", fakeClock: true, run: testStaleDecidedOnNewer},
	{name: "StaleReplaceChangesNothing", fakeClock: true, run: testStaleReplace},
	{name: "StaleOtherAlgorithmDenied", fakeClock: true, run: testStaleOtherAlgorithm},
	{name: "StaleTooManyTokensDenied", fakeClock: true, run: testStaleTooManyTokens},
	{name: "NewVersionSameLimitsKeepsTokens", fakeClock: true, run: testNewVersionSameLimits},
	{name: "ExpiredBucketForgetsVersion", fakeClock: true, run: testExpiredForgetsVersion},
	{name: "UnversionedAfterVersioned", fakeClock: true, run: testUnversionedAfterVersioned},
}...)

// versioned returns cfg at version v.
func versioned(cfg ratelimit.Config, v uint64) ratelimit.Config {
	cfg.Version = v
	return cfg
}

// rolloutCalls is how many calls alternate between the two versions.
const rolloutCalls = 200

// rolloutScenarios take 5 tokens from a bucket on version 1 of a plan,
// then alternate calls between Limiters on version 2 and version 1, as
// replicas do while a plan change rolls out, for every algorithm, every
// strategy, an upgrade (10 to 100 a minute) and a downgrade (the reverse).
// On the frozen clock each call must be decided exactly as if every
// replica already had version 2: decision for decision the same as on a
// bucket that sees only version 2 after the first 5.
func rolloutScenarios() []scenario {
	var out []scenario
	algs := []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA, ratelimit.LeakyBucket, ratelimit.FixedWindow, ratelimit.SlidingWindowLog, ratelimit.SlidingWindowCounter}
	for _, alg := range algs {
		for _, s := range []ratelimit.Inheritance{ratelimit.AsIs, ratelimit.ResetTokens, ratelimit.Proportionally, ratelimit.Additive} {
			for _, c := range []struct {
				name     string
				from, to int64
			}{{"Upgrade", 10, 100}, {"Downgrade", 100, 10}} {
				out = append(out, scenario{name: fmt.Sprintf("Rollout/%v/%v/%s", alg, s, c.name), fakeClock: true, run: func(t *testing.T, e *env) {
					v1 := versioned(algo(alg, ratelimit.PerMinute(c.from).WithID("main")), 1)
					v2 := versioned(algo(alg, ratelimit.PerMinute(c.to).WithID("main")), 2)
					testRollout(t, e, s, v1, v2)
				}})
			}
		}
	}
	return out
}

// testRollout runs one rollout scenario and its reference side by side.
func testRollout(t *testing.T, e *env, s ratelimit.Inheritance, v1, v2 ratelimit.Config) {
	ctx := context.Background()
	l := e.limiter(ratelimit.WithInheritance(s))
	rollout, reference := e.key("rollout"), e.key("reference")
	for _, key := range []string{rollout, reference} {
		for range 5 {
			if d, err := l.Allow(ctx, key, v1); err != nil || !d.Allowed {
				t.Fatalf("Allow on version 1 of a new bucket: %s, %v", format(d), err)
			}
		}
	}
	admitted := 0
	for i := range rolloutCalls {
		cfg := v2
		if i%2 == 1 {
			cfg = v1
		}
		got, err := l.Allow(ctx, rollout, cfg)
		if err != nil {
			t.Fatalf("call %d, version %d: %v", i, cfg.Version, err)
		}
		want, err := l.Allow(ctx, reference, v2)
		if err != nil {
			t.Fatalf("call %d on the reference: %v", i, err)
		}
		if got != want {
			t.Fatalf("call %d, version %d (%d admitted so far):\n got %s\nwant %s (as every call on version 2 would)", i, cfg.Version, admitted, format(got), format(want))
		}
		if got.Allowed {
			admitted++
		}
	}
	t.Logf("%d of %d alternating calls admitted, as on version 2 alone", admitted, rolloutCalls)
}

// testStaleDecidedOnNewer: once a bucket is on version 2, a call bringing
// version 1 takes from version 2's bandwidths and reports their Limit and
// Remaining, naming the caller's bandwidth of the same ID; one whose
// bandwidths have no ID matching gets the caller's first.
func testStaleDecidedOnNewer(t *testing.T, e *env) {
	v1 := versioned(config(ratelimit.PerMinute(40).WithID("sustained")), 1)
	v2 := versioned(config(ratelimit.PerSecond(50).WithID("burst"), ratelimit.PerMinute(100).WithID("sustained")), 2)
	other := versioned(config(ratelimit.PerMinute(40)), 1)
	e.steps(t, e.key("k"), v2, []step{
		{req: consume(1), want: dec{Allowed: true, Limit: 50, Remaining: 49, Consumed: 1, ResetAfter: 600 * time.Millisecond, Bandwidth: "burst"}},
		{cfg: &v1, req: consume(30), want: dec{Allowed: true, Limit: 50, Remaining: 19, Consumed: 30, ResetAfter: 31 * 600 * time.Millisecond, Bandwidth: "sustained"}},
		{cfg: &other, req: estimate(20), want: dec{Limit: 50, Remaining: 19, RetryAfter: 20 * time.Millisecond, ResetAfter: 31 * 600 * time.Millisecond, Bandwidth: "0"}},
		{req: inspect(), want: dec{Allowed: true, Limit: 50, Remaining: 19, ResetAfter: 31 * 600 * time.Millisecond, Bandwidth: "burst"}},
	})
}

// testStaleReplace: a Replace that brings an older version than the
// bucket's changes nothing, whatever its strategy, and reports as Inspect.
func testStaleReplace(t *testing.T, e *env) {
	v1 := versioned(config(ratelimit.PerHour(10).WithID("main")), 1)
	v2 := versioned(config(ratelimit.PerHour(100).WithID("main")), 2)
	left := dec{Allowed: true, Limit: 100, Remaining: 96, ResetAfter: 4 * 36 * time.Second, Bandwidth: "main"}
	e.steps(t, e.key("k"), v2, []step{
		{req: consume(4), want: dec{Allowed: true, Limit: 100, Remaining: 96, Consumed: 4, ResetAfter: 4 * 36 * time.Second, Bandwidth: "main"}},
		{cfg: &v1, req: replace(ratelimit.ResetTokens), want: left},
		{cfg: &v1, req: replace(ratelimit.AsIs), want: left},
		{req: inspect(), want: left},
	})
}

// testStaleOtherAlgorithm: when version 2 changed the algorithm, a call on
// version 1 cannot be decided on it: it is denied for StaleRetry and
// changes nothing, whatever its op.
func testStaleOtherAlgorithm(t *testing.T, e *env) {
	v1 := versioned(config(ratelimit.PerHour(10).WithID("main")), 1)
	for _, alg := range []ratelimit.Algorithm{ratelimit.GCRA, ratelimit.SlidingWindowLog} {
		t.Run(alg.String(), func(t *testing.T) {
			v2 := versioned(algo(alg, ratelimit.PerHour(100).WithID("main")), 2)
			denied := dec{Limit: 10, RetryAfter: ratelimit.StaleRetry, ResetAfter: ratelimit.StaleRetry, Bandwidth: "main"}
			resetAfter := 36 * time.Second
			if alg == ratelimit.SlidingWindowLog {
				resetAfter = time.Hour
			}
			e.steps(t, e.key(alg.String()), v2, []step{
				{req: consume(1), want: dec{Allowed: true, Limit: 100, Remaining: 99, Consumed: 1, ResetAfter: resetAfter, Bandwidth: "main"}},
				{cfg: &v1, req: consume(1), want: denied},
				{cfg: &v1, req: reset(), want: denied},
				{cfg: &v1, req: add(1), want: denied},
				{req: inspect(), want: dec{Allowed: true, Limit: 100, Remaining: 99, ResetAfter: resetAfter, Bandwidth: "main"}},
			})
		})
	}
}

// testStaleTooManyTokens: a stale call asking for more tokens than the
// bucket's newer config holds at most is denied for StaleRetry, taking
// nothing.
func testStaleTooManyTokens(t *testing.T, e *env) {
	v1 := versioned(config(ratelimit.PerHour(100).WithID("main")), 1)
	v2 := versioned(config(ratelimit.PerHour(10).WithID("main")), 2)
	e.steps(t, e.key("k"), v2, []step{
		{req: consume(1), want: dec{Allowed: true, Limit: 10, Remaining: 9, Consumed: 1, ResetAfter: 6 * time.Minute, Bandwidth: "main"}},
		{cfg: &v1, req: consume(50), want: dec{Limit: 100, RetryAfter: ratelimit.StaleRetry, ResetAfter: ratelimit.StaleRetry, Bandwidth: "main"}},
		{cfg: &v1, req: upTo(50), want: dec{Allowed: true, Limit: 10, Consumed: 9, ResetAfter: time.Hour, Bandwidth: "main"}},
	})
}

// testNewVersionSameLimits: a new version of the same limits is no config
// change: even ResetTokens keeps the tokens, and the older version is
// stale from then on.
func testNewVersionSameLimits(t *testing.T, e *env) {
	key := e.key("k")
	l := e.limiter(ratelimit.WithInheritance(ratelimit.ResetTokens))
	ctx := context.Background()
	bw := ratelimit.PerHour(10).WithID("main")
	for i, c := range []struct {
		version uint64
		left    int64
	}{{1, 9}, {2, 8}, {1, 7}, {3, 6}} {
		d, err := l.Allow(ctx, key, versioned(config(bw), c.version))
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		e.check(t, fmt.Sprintf("call %d on version %d", i, c.version), d,
			dec{Allowed: true, Limit: 10, Remaining: c.left, Consumed: 1, ResetAfter: time.Duration(10-c.left) * 6 * time.Minute, Bandwidth: "main"})
	}
}

// testExpiredForgetsVersion: a bucket whose state expired (full again) is
// a new bucket, whatever version built it: an older version builds it
// afresh.
func testExpiredForgetsVersion(t *testing.T, e *env) {
	v1 := versioned(config(ratelimit.PerMinute(10).WithID("main")), 1)
	v2 := versioned(config(ratelimit.PerMinute(100).WithID("main")), 2)
	e.steps(t, e.key("k"), v2, []step{
		{req: consume(1), want: dec{Allowed: true, Limit: 100, Remaining: 99, Consumed: 1, ResetAfter: 600 * time.Millisecond, Bandwidth: "main"}},
		{advance: 600 * time.Millisecond, cfg: &v1, req: consume(1), want: dec{Allowed: true, Limit: 10, Remaining: 9, Consumed: 1, ResetAfter: 6 * time.Second, Bandwidth: "main"}},
	})
}

// testUnversionedAfterVersioned: version 0 is older than every version: an
// unversioned call on a versioned bucket is a stale one.
func testUnversionedAfterVersioned(t *testing.T, e *env) {
	v0 := config(ratelimit.PerHour(10).WithID("main"))
	v5 := versioned(config(ratelimit.PerHour(20).WithID("main")), 5)
	e.steps(t, e.key("k"), v5, []step{
		{req: consume(1), want: dec{Allowed: true, Limit: 20, Remaining: 19, Consumed: 1, ResetAfter: 3 * time.Minute, Bandwidth: "main"}},
		{cfg: &v0, req: consume(1), want: dec{Allowed: true, Limit: 20, Remaining: 18, Consumed: 1, ResetAfter: 6 * time.Minute, Bandwidth: "main"}},
	})
}
