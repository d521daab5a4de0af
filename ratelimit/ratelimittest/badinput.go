package ratelimittest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// badInputScenarios check that bad keys, configs and requests get the
// documented error and change nothing: each is sent to a bucket that holds
// 3 of 5 tokens, which must still hold them afterwards.
var badInputScenarios = badInputs()

// goodBandwidth is the bandwidth of the bucket the bad calls aim at.
var goodBandwidth = ratelimit.PerHour(5)

// threeOfFive is what Inspect says of that bucket, before and after.
var threeOfFive = dec{Allowed: true, Limit: 5, Remaining: 3, ResetAfter: 24 * time.Minute, Bandwidth: "0"}

type badCall struct {
	name string
	key  func(e *env) string // nil: the live bucket's key
	cfg  *ratelimit.Config   // nil: the live bucket's config
	req  ratelimit.Request
	want error
}

func badInputs() []scenario {
	var calls []badCall
	emptyKey := func(*env) string { return "" }
	calls = append(calls,
		badCall{name: "EmptyKey", key: emptyKey, req: consume(1), want: ratelimit.ErrInvalidKey},
		badCall{name: "KeyTooLong", key: tooLongKey, req: consume(1), want: ratelimit.ErrInvalidKey},
	)
	for _, c := range badConfigs() {
		calls = append(calls, badCall{name: "Config/" + c.name, cfg: &c.cfg, req: consume(1), want: ratelimit.ErrInvalidConfig})
		calls = append(calls, badCall{name: "Config/" + c.name + "/Replace", cfg: &c.cfg, req: replace(ratelimit.ResetTokens), want: ratelimit.ErrInvalidConfig})
	}
	for _, r := range badRequests() {
		calls = append(calls, badCall{name: "Request/" + r.name, req: r.req, want: ratelimit.ErrInvalidRequest})
	}
	out := make([]scenario, 0, len(calls)+1)
	for _, c := range calls {
		out = append(out, scenario{name: c.name, run: func(t *testing.T, e *env) { testBadCall(t, e, c) }})
	}
	return append(out, scenario{name: "LimiterAndBucket", run: testBadInputThroughLimiter})
}

type namedConfig struct {
	name string
	cfg  ratelimit.Config
}

func badConfigs() []namedConfig {
	with := func(f func(b *ratelimit.Bandwidth)) ratelimit.Config {
		b := goodBandwidth
		f(&b)
		return config(b)
	}
	many := make([]ratelimit.Bandwidth, ratelimit.MaxBandwidths+1)
	for i := range many {
		many[i] = goodBandwidth
	}
	return []namedConfig{
		{"NoBandwidths", ratelimit.Config{}},
		{"TooManyBandwidths", config(many...)},
		{"UnknownAlgorithm", ratelimit.Config{Algorithm: 200, Bandwidths: []ratelimit.Bandwidth{goodBandwidth}}},
		{"ZeroCapacity", with(func(b *ratelimit.Bandwidth) { b.Capacity = 0 })},
		{"NegativeCapacity", with(func(b *ratelimit.Bandwidth) { b.Capacity = -5 })},
		{"CapacityOverMax", with(func(b *ratelimit.Bandwidth) { b.Capacity = ratelimit.MaxCapacity + 1 })},
		{"CapacityMaxInt64", with(func(b *ratelimit.Bandwidth) { b.Capacity = 1<<63 - 1 })},
		{"ZeroRefillTokens", with(func(b *ratelimit.Bandwidth) { b.RefillTokens = 0 })},
		{"NegativeRefillTokens", with(func(b *ratelimit.Bandwidth) { b.RefillTokens = -1 })},
		{"RefillFasterThanOnePerMicrosecond", with(func(b *ratelimit.Bandwidth) { b.RefillTokens, b.RefillPeriod = 1001, time.Millisecond })},
		{"ZeroPeriod", with(func(b *ratelimit.Bandwidth) { b.RefillPeriod = 0 })},
		{"NegativePeriod", with(func(b *ratelimit.Bandwidth) { b.RefillPeriod = -time.Hour })},
		{"PeriodOverMax", with(func(b *ratelimit.Bandwidth) { b.RefillPeriod = ratelimit.MaxRefillPeriod + time.Microsecond })},
		{"PeriodNotWholeMicroseconds", with(func(b *ratelimit.Bandwidth) { b.RefillPeriod = time.Hour + time.Nanosecond })},
		{"NegativeInitialTokens", with(func(b *ratelimit.Bandwidth) { *b = b.WithInitialTokens(-1) })},
		{"InitialTokensOverCapacity", with(func(b *ratelimit.Bandwidth) { *b = b.WithInitialTokens(6) })},
		{"UnknownRefillKind", with(func(b *ratelimit.Bandwidth) { b.Refill = 200 })},
		{"AlignedWithoutStart", with(func(b *ratelimit.Bandwidth) { b.Refill = ratelimit.IntervalAligned })},
		{"AlignedBefore1970", with(func(b *ratelimit.Bandwidth) { *b = b.AlignedTo(time.Unix(-3600, 0)) })},
		{"GreedyWithStart", with(func(b *ratelimit.Bandwidth) { b.AlignedStart = epoch })},
		{"IDTooLong", with(func(b *ratelimit.Bandwidth) { b.ID = strings.Repeat("i", ratelimit.MaxIDLen+1) })},
		{"IDWithSpace", with(func(b *ratelimit.Bandwidth) { b.ID = "per hour" })},
		{"IDWithBrace", with(func(b *ratelimit.Bandwidth) { b.ID = "{x}" })},
		{"DuplicateIDs", config(goodBandwidth.WithID("x"), ratelimit.PerMinute(5).WithID("x"))},
		// One token an hour needs 3.6e9 scaled units a token: 2^50 tokens
		// of them are far beyond 2^51.
		{"GreedyBeyondExact", with(func(b *ratelimit.Bandwidth) { b.Capacity, b.RefillTokens = ratelimit.MaxCapacity, 1 })},
		{"IntervalBeyondExact", with(func(b *ratelimit.Bandwidth) {
			b.Capacity, b.RefillTokens, b.Refill = ratelimit.MaxCapacity, 1, ratelimit.Interval
		})},
		{"SecondBandwidthBad", config(goodBandwidth, ratelimit.PerHour(0))},
	}
}

func badRequests() []struct {
	name string
	req  ratelimit.Request
} {
	return []struct {
		name string
		req  ratelimit.Request
	}{
		{"ConsumeZero", consume(0)},
		{"ConsumeNegative", consume(-1)},
		{"ConsumeOverCapacity", consume(6)},
		{"EstimateZero", estimate(0)},
		{"EstimateOverCapacity", estimate(6)},
		{"ReserveZero", reserve(0, time.Hour)},
		{"ReserveOverCapacity", reserve(6, time.Hour)},
		{"ReserveNegativeMaxWait", reserve(1, -time.Second)},
		{"ConsumeUpToZero", upTo(0)},
		{"AddZero", add(0)},
		{"AddNegative", add(-3)},
		{"UnknownOp", ratelimit.Request{Op: 200, Tokens: 1}},
		{"UnknownStrategy", ratelimit.Request{Op: ratelimit.Consume, Tokens: 1, Strategy: 200}},
		{"ReplaceUnknownStrategy", replace(200)},
		{"NegativeAgo", ratelimit.Request{Op: ratelimit.Consume, Tokens: 1, Ago: -time.Second}},
		{"AgoOverMax", ratelimit.Request{Op: ratelimit.Consume, Tokens: 1, Ago: ratelimit.MaxAgo + time.Microsecond}},
		{"AgoOnAdd", ratelimit.Request{Op: ratelimit.Add, Tokens: 1, Ago: time.Second}},
		{"AgoOnInspect", ratelimit.Request{Op: ratelimit.Inspect, Ago: time.Second}},
	}
}

// tooLongKey is one byte over MaxKeyLen, and its first MaxKeyLen bytes are
// a key of the scenario's own.
func tooLongKey(e *env) string {
	k := e.key("")
	return k + strings.Repeat("k", ratelimit.MaxKeyLen+1-len(k))
}

// liveBucket leaves 3 of 5 tokens in the bucket at key.
func liveBucket(t *testing.T, e *env, key string) {
	t.Helper()
	e.check(t, "Consume(2) on a new bucket of 5", e.do(t, key, config(goodBandwidth), consume(2)),
		dec{Allowed: true, Limit: 5, Remaining: 3, Consumed: 2, ResetAfter: 24 * time.Minute, Bandwidth: "0"})
}

func testBadCall(t *testing.T, e *env, c badCall) {
	key := e.key("k")
	liveBucket(t, e, key)
	target := key
	if c.key != nil {
		target = c.key(e)
	}
	cfg := config(goodBandwidth)
	if c.cfg != nil {
		cfg = *c.cfg
	}
	_, err := e.backend.Do(context.Background(), target, cfg, c.req)
	if !errors.Is(err, c.want) {
		t.Fatalf("Do(%.40q, %s): error %v; want one wrapping %v", target, describe(c.req), err, c.want)
	}
	e.check(t, "the live bucket afterwards", e.do(t, key, config(goodBandwidth), inspect()), threeOfFive)
	if len(target) > ratelimit.MaxKeyLen {
		// A backend must not shorten a long key into a valid one.
		e.check(t, "the key's first MaxKeyLen bytes", e.do(t, target[:ratelimit.MaxKeyLen], config(goodBandwidth), inspect()),
			dec{Allowed: true, Limit: 5, Remaining: 5, Bandwidth: "0"})
	}
}

// testBadInputThroughLimiter: the portable layer passes the backend's errors
// through, and Wait for more than the capacity fails at once.
func testBadInputThroughLimiter(t *testing.T, e *env) {
	key := e.key("k")
	liveBucket(t, e, key)
	ctx := context.Background()
	l := e.limiter()
	if _, err := l.Allow(ctx, key, config(ratelimit.PerHour(0))); !errors.Is(err, ratelimit.ErrInvalidConfig) {
		t.Errorf("Limiter.Allow with a capacity of 0: %v; want ErrInvalidConfig", err)
	}
	if _, err := l.AllowN(ctx, key, config(goodBandwidth), 6); !errors.Is(err, ratelimit.ErrInvalidRequest) {
		t.Errorf("Limiter.AllowN(6) on a bucket of 5: %v; want ErrInvalidRequest", err)
	}
	if _, err := l.Allow(ctx, "", config(goodBandwidth)); !errors.Is(err, ratelimit.ErrInvalidKey) {
		t.Errorf("Limiter.Allow with an empty key: %v; want ErrInvalidKey", err)
	}
	b := e.bucket(key, config(goodBandwidth))
	if err := b.Wait(ctx, 6); !errors.Is(err, ratelimit.ErrInvalidRequest) {
		t.Errorf("Bucket.Wait(6) on a bucket of 5: %v; want ErrInvalidRequest", err)
	}
	if err := b.AddTokens(ctx, 0); !errors.Is(err, ratelimit.ErrInvalidRequest) {
		t.Errorf("Bucket.AddTokens(0): %v; want ErrInvalidRequest", err)
	}
	if err := b.Replace(ctx, ratelimit.Config{}, ratelimit.AsIs); !errors.Is(err, ratelimit.ErrInvalidConfig) {
		t.Errorf("Bucket.Replace with no bandwidths: %v; want ErrInvalidConfig", err)
	}
	e.check(t, "the bucket afterwards", e.do(t, key, config(goodBandwidth), inspect()), threeOfFive)
}
