package ratelimittest

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// agoScenarios check [ratelimit.Request.Ago]: a request decided as of a
// while ago on the store's clock.
var agoScenarios = []scenario{
	{name: "AsIfMadeThen", fakeClock: true, run: testAgoAsIfMadeThen},
	{name: "LongAgo", run: testAgoLongAgo},
}

// agoConfigs is a config of two bandwidths for every algorithm.
func agoConfigs() []ratelimit.Config {
	var cfgs []ratelimit.Config
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA, ratelimit.LeakyBucket, ratelimit.FixedWindow, ratelimit.SlidingWindowLog, ratelimit.SlidingWindowCounter} {
		cfgs = append(cfgs, algo(alg,
			ratelimit.Bandwidth{ID: "burst", Capacity: 4, RefillTokens: 4, RefillPeriod: 10 * time.Second},
			ratelimit.Bandwidth{ID: "hourly", Capacity: 9, RefillTokens: 9, RefillPeriod: time.Hour}))
	}
	return cfgs
}

// testAgoAsIfMadeThen: on every algorithm, the same requests made on one
// bucket at their times and on another later, each with Ago back to its
// time, get the same decisions, and leave buckets that then decide alike.
func testAgoAsIfMadeThen(t *testing.T, e *env) {
	reqs := []struct {
		at  time.Duration // after the start
		req ratelimit.Request
	}{
		{0, consume(3)},
		{2 * time.Second, upTo(4)},
		{7 * time.Second, consume(2)},
		{25 * time.Second, reserve(4, time.Minute)},
		{26 * time.Second, upTo(9)},
	}
	const later = 40 * time.Second // when the second bucket gets them all
	for _, cfg := range agoConfigs() {
		then, ago := e.key("then:"+cfg.Algorithm.String()), e.key("ago:"+cfg.Algorithm.String())
		start := e.clock.Now()
		var want []ratelimit.Decision
		for _, r := range reqs {
			if r.req.Op == ratelimit.Reserve && !cfg.Algorithm.Supports(ratelimit.Reserve) {
				continue
			}
			e.clock.Advance(start.Add(r.at).Sub(e.clock.Now()))
			want = append(want, e.do(t, then, cfg, r.req))
		}
		e.clock.Advance(start.Add(later).Sub(e.clock.Now()))
		i := 0
		for _, r := range reqs {
			if r.req.Op == ratelimit.Reserve && !cfg.Algorithm.Supports(ratelimit.Reserve) {
				continue
			}
			req := r.req
			req.Ago = later - r.at
			e.check(t, fmt.Sprintf("%v: %s, %v ago", cfg.Algorithm, describe(req), req.Ago), e.do(t, ago, cfg, req), want[i])
			i++
		}
		for _, step := range []time.Duration{0, 5 * time.Second, time.Hour} {
			e.clock.Advance(step)
			e.check(t, fmt.Sprintf("%v: Inspect %v after", cfg.Algorithm, e.clock.Now().Sub(start)), e.do(t, ago, cfg, inspect()), e.do(t, then, cfg, inspect()))
		}
	}
}

// testAgoLongAgo: tokens taken two hours ago, on buckets that refill
// within an hour, are all back, on the fake clock and the store's own.
func testAgoLongAgo(t *testing.T, e *env) {
	for _, cfg := range agoConfigs() {
		key := e.key(cfg.Algorithm.String())
		req := upTo(4)
		req.Ago = 2*time.Hour + time.Second
		if d := e.do(t, key, cfg, req); !d.Allowed || d.Consumed != 4 {
			t.Fatalf("%v: %s: got %s; want 4 taken", cfg.Algorithm, describe(req), format(d))
		}
		if d := e.do(t, key, cfg, inspect()); d.Remaining != 4 {
			t.Fatalf("%v: Inspect after 4 taken %v ago: got %s; want 4 remaining, every token back", cfg.Algorithm, req.Ago, format(d))
		}
		if d := e.do(t, key, cfg, upTo(4)); d.Consumed != 4 {
			t.Fatalf("%v: ConsumeUpTo(4) now: got %s; want 4 taken", cfg.Algorithm, format(d))
		}
		if d := e.do(t, key, cfg, inspect()); d.Remaining != 0 {
			t.Fatalf("%v: Inspect after 4 taken now: got %s; want 0 remaining", cfg.Algorithm, format(d))
		}
	}
}
