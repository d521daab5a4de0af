package ratelimit

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"
)

// us is one microsecond: the tables read in the unit the math counts in.
const us = time.Microsecond

// step is one call on a bucket driven by a fake clock.
type step struct {
	at   int64   // µs on the fake clock
	cfg  *Config // nil: the case's config
	req  Request
	want Decision
}

// allowed is an allowed decision that waits for nothing.
func allowed(limit, remaining, consumed, resetUs int64, band string) Decision {
	return Decision{Allowed: true, Limit: limit, Remaining: remaining, Consumed: consumed, ResetAfter: time.Duration(resetUs) * us, Bandwidth: band}
}

// reserved is an allowed Reserve whose tokens are due in retryUs.
func reserved(limit, remaining, consumed, retryUs, resetUs int64, band string) Decision {
	d := allowed(limit, remaining, consumed, resetUs, band)
	d.RetryAfter = time.Duration(retryUs) * us
	return d
}

// denied is a denied decision.
func denied(limit, remaining, retryUs, resetUs int64, band string) Decision {
	return Decision{Limit: limit, Remaining: remaining, RetryAfter: time.Duration(retryUs) * us, ResetAfter: time.Duration(resetUs) * us, Bandwidth: band}
}

func consume(n int64) Request     { return Request{Op: Consume, Tokens: n} }
func estimate(n int64) Request    { return Request{Op: Estimate, Tokens: n} }
func consumeUpTo(n int64) Request { return Request{Op: ConsumeUpTo, Tokens: n} }
func add(n int64) Request         { return Request{Op: Add, Tokens: n} }
func inspect() Request            { return Request{Op: Inspect} }

func reserve(n int64, maxWait time.Duration) Request {
	return Request{Op: Reserve, Tokens: n, MaxWait: maxWait}
}

func cfgOf(bws ...Bandwidth) Config { return Config{Bandwidths: bws} }

// runSteps applies steps in order to one bucket and checks every decision
// field but RefillAfter, which the tables leave out: the naive models
// check it on every decision of their random sequences
// (TestApplyMatchesReference and each algorithm's), and TestRefillAfter
// by hand. Each request must pass CheckRequest, as Apply demands.
func runSteps(t *testing.T, cfg Config, steps []step) *State {
	t.Helper()
	var s State
	for i, st := range steps {
		c := cfg
		if st.cfg != nil {
			c = *st.cfg
		}
		if err := CheckRequest("key", c, st.req); err != nil {
			t.Fatalf("step %d: the table is wrong: %v", i, err)
		}
		got := Apply(&s, c, st.req, st.at)
		if got.RefillAfter = 0; got != st.want {
			t.Errorf("step %d: %v %d at %dµs:\n got %+v\nwant %+v", i, st.req.Op, st.req.Tokens, st.at, got, st.want)
		}
	}
	return &s
}

// Bandwidths used by several tables. Every(1000µs, 1) counts 1000 scaled
// units to a token and gains one a microsecond.
var (
	oneMs = Every(1000*us, 1)
	tenth = Every(100*us, 1)
)

func TestApplyGreedy(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{{
		// 3 per second: a token every 333333.3µs. A wait is rounded up, never
		// down: at 333333µs the bucket holds 0.999999 of a token.
		name: "3 per second, waits rounded up",
		cfg:  cfgOf(PerSecond(3)),
		steps: []step{
			{at: 0, req: consume(1), want: allowed(3, 2, 1, 333334, "0")},
			{at: 0, req: consume(2), want: allowed(3, 0, 2, 1000000, "0")},
			{at: 0, req: consume(1), want: denied(3, 0, 333334, 1000000, "0")},
			{at: 333333, req: consume(1), want: denied(3, 0, 1, 666667, "0")},
			{at: 333334, req: consume(1), want: allowed(3, 0, 1, 1000000, "0")},
			{at: 333334, req: consume(1), want: denied(3, 0, 333333, 1000000, "0")},
			{at: 2000000, req: inspect(), want: allowed(3, 3, 0, 0, "0")},
		},
	}, {
		name: "100 per minute, several tokens at once",
		cfg:  cfgOf(PerMinute(100)),
		steps: []step{
			{at: 0, req: consume(100), want: allowed(100, 0, 100, 60000000, "0")},
			{at: 0, req: consume(5), want: denied(100, 0, 3000000, 60000000, "0")},
			{at: 1, req: estimate(5), want: denied(100, 0, 2999999, 59999999, "0")},
			{at: 3000000, req: consume(5), want: allowed(100, 0, 5, 60000000, "0")},
			{at: 3600000, req: consume(2), want: denied(100, 1, 600000, 59400000, "0")},
		},
	}, {
		name: "burst above the rate",
		cfg:  cfgOf(PerSecond(10).WithBurst(50)),
		steps: []step{
			{at: 0, req: consume(50), want: allowed(50, 0, 50, 5000000, "0")},
			{at: 250000, req: consume(3), want: denied(50, 2, 50000, 4750000, "0")},
			{at: 300000, req: consume(3), want: allowed(50, 0, 3, 5000000, "0")},
			{at: 300000, req: consume(1), want: denied(50, 0, 100000, 5000000, "0")},
			{at: 60000000, req: inspect(), want: allowed(50, 50, 0, 0, "0")},
		},
	}, {
		// A rate of one token a microsecond is the fastest Validate accepts.
		name: "one token a microsecond",
		cfg:  cfgOf(Every(us, 1).WithBurst(4)),
		steps: []step{
			{at: 10, req: consume(4), want: allowed(4, 0, 4, 4, "0")},
			{at: 12, req: consume(3), want: denied(4, 2, 1, 2, "0")},
			{at: 13, req: consume(3), want: allowed(4, 0, 3, 4, "0")},
		},
	}, {
		// A clock that steps back (a store failing over to a replica) does
		// not move a token's arrival: it stays due at the same instant.
		name: "clock stepping back",
		cfg:  cfgOf(PerSecond(1)),
		steps: []step{
			{at: 1000, req: consume(1), want: allowed(1, 0, 1, 1000000, "0")},
			{at: 500, req: inspect(), want: denied(1, 0, 1000500, 1000500, "0")},
			{at: 1001000, req: inspect(), want: allowed(1, 1, 0, 0, "0")},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, tt.cfg, tt.steps) })
	}
}

func TestApplyInterval(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{{
		// The first period starts at 500, when the bandwidth is first drawn
		// below capacity, not at 0, when the bucket was created.
		name: "first period starts when first drawn",
		cfg:  cfgOf(Every(1000*us, 10).WithRefill(Interval)),
		steps: []step{
			{at: 0, req: inspect(), want: allowed(10, 10, 0, 0, "0")},
			{at: 500, req: consume(4), want: allowed(10, 6, 4, 1000, "0")},
			{at: 1000, req: consume(6), want: allowed(10, 0, 6, 500, "0")},
			{at: 1000, req: consume(1), want: denied(10, 0, 500, 500, "0")},
			{at: 1499, req: estimate(1), want: denied(10, 0, 1, 1, "0")},
			{at: 1500, req: consume(10), want: allowed(10, 0, 10, 1000, "0")},
			{at: 2499, req: consume(1), want: denied(10, 0, 1, 1, "0")},
			{at: 2500, req: inspect(), want: allowed(10, 10, 0, 0, "0")},
		},
	}, {
		name: "refill smaller than capacity",
		cfg:  cfgOf(Every(1000*us, 2).WithBurst(5).WithRefill(Interval)),
		steps: []step{
			{at: 0, req: consume(5), want: allowed(5, 0, 5, 3000, "0")},
			{at: 999, req: consume(1), want: denied(5, 0, 1, 2001, "0")},
			{at: 2000, req: inspect(), want: allowed(5, 4, 0, 1000, "0")},
			{at: 2999, req: consume(4), want: allowed(5, 0, 4, 2001, "0")},
			{at: 2999, req: consume(3), want: denied(5, 0, 1001, 2001, "0")},
			{at: 3000, req: consume(3), want: denied(5, 2, 1000, 2000, "0")},
			// Full from 5000 on; drawn again at 10300, so the next tokens
			// come at 11300, not on the old 1000µs grid.
			{at: 10300, req: consume(1), want: allowed(5, 4, 1, 1000, "0")},
			{at: 11299, req: estimate(5), want: denied(5, 4, 1, 1, "0")},
			{at: 11300, req: estimate(5), want: allowed(5, 5, 0, 0, "0")},
		},
	}, {
		// Boundaries at 250 + k×1000, whenever the bandwidth is drawn.
		name: "aligned",
		cfg:  cfgOf(Every(1000*us, 10).AlignedTo(time.UnixMicro(250))),
		steps: []step{
			{at: 600, req: consume(10), want: allowed(10, 0, 10, 650, "0")},
			{at: 1249, req: consume(1), want: denied(10, 0, 1, 1, "0")},
			{at: 1250, req: consume(1), want: allowed(10, 9, 1, 1000, "0")},
			{at: 5000, req: consume(1), want: allowed(10, 9, 1, 250, "0")},
			{at: 5249, req: consume(9), want: allowed(10, 0, 9, 1, "0")},
			{at: 5250, req: inspect(), want: allowed(10, 10, 0, 0, "0")},
		},
	}, {
		// An anchor after now still fixes the grid: 2000250 - 2×10^6 = 250.
		name: "aligned to a future start",
		cfg:  cfgOf(Every(1000*us, 10).AlignedTo(time.UnixMicro(2000250))),
		steps: []step{
			{at: 600, req: consume(10), want: allowed(10, 0, 10, 650, "0")},
			{at: 1250, req: inspect(), want: allowed(10, 10, 0, 0, "0")},
		},
	}, {
		name: "aligned, several periods to fill",
		cfg:  cfgOf(Every(1000*us, 3).WithBurst(10).AlignedTo(time.UnixMicro(0))),
		steps: []step{
			{at: 1700, req: consume(10), want: allowed(10, 0, 10, 3300, "0")},
			{at: 3999, req: inspect(), want: allowed(10, 6, 0, 1001, "0")},
			{at: 4000, req: estimate(10), want: denied(10, 9, 1000, 1000, "0")},
			{at: 5000, req: estimate(10), want: allowed(10, 10, 0, 0, "0")},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, tt.cfg, tt.steps) })
	}
}

func TestApplySeveralBandwidths(t *testing.T) {
	burst := tenth.WithBurst(10).WithID("burst")
	hour := oneMs.WithBurst(20).WithID("hour")
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{{
		name: "binding bandwidth",
		cfg:  cfgOf(burst, hour),
		steps: []step{
			// Allowed: bound to the fewest tokens left.
			{at: 0, req: consume(8), want: allowed(10, 2, 8, 8000, "burst")},
			// Denied: bound to the bandwidth that needs longest.
			{at: 0, req: consume(3), want: denied(10, 2, 100, 8000, "burst")},
			{at: 1000, req: consume(10), want: allowed(10, 0, 10, 17000, "burst")},
			{at: 1000, req: consume(5), want: denied(20, 3, 2000, 17000, "hour")},
			{at: 3000, req: consume(5), want: allowed(20, 0, 5, 20000, "hour")},
			// Add returns tokens to every bandwidth, each up to its capacity.
			{at: 3000, req: add(4), want: allowed(20, 4, 0, 16000, "hour")},
			{at: 3000, req: consumeUpTo(20), want: allowed(20, 0, 4, 20000, "hour")},
			{at: 3000, req: consumeUpTo(1), want: Decision{Limit: 20, RetryAfter: 1000 * us, ResetAfter: 20000 * us, Bandwidth: "hour"}},
			{at: 5500, req: consumeUpTo(9), want: allowed(20, 0, 2, 19500, "hour")},
		},
	}, {
		// Ties go to the first bandwidth; bandwidths without an ID are named
		// by their index.
		name: "ties and index names",
		cfg:  cfgOf(tenth.WithBurst(4), oneMs.WithBurst(4)),
		steps: []step{
			{at: 0, req: consume(4), want: allowed(4, 0, 4, 4000, "0")},
			{at: 4000, req: consume(1), want: allowed(4, 3, 1, 1000, "0")},
			{at: 4000, req: estimate(4), want: denied(4, 3, 1000, 1000, "1")},
		},
	}, {
		name: "greedy with interval",
		cfg:  cfgOf(oneMs.WithBurst(5).WithID("g"), Every(10000*us, 10).WithRefill(Interval).WithID("i")),
		steps: []step{
			{at: 0, req: consume(3), want: allowed(5, 2, 3, 10000, "g")},
			{at: 0, req: consume(3), want: denied(5, 2, 1000, 10000, "g")},
			{at: 4000, req: consume(5), want: allowed(5, 0, 5, 6000, "g")},
			{at: 5000, req: consume(3), want: denied(10, 2, 5000, 5000, "i")},
			{at: 10000, req: consume(3), want: allowed(5, 2, 3, 10000, "g")},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, tt.cfg, tt.steps) })
	}
}

func TestApplyOps(t *testing.T) {
	five := PerSecond(4).WithBurst(5) // a token every 250000µs
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{{
		name: "Estimate takes nothing",
		cfg:  cfgOf(PerSecond(2)),
		steps: []step{
			{at: 0, req: estimate(2), want: allowed(2, 2, 0, 0, "0")},
			{at: 0, req: estimate(2), want: allowed(2, 2, 0, 0, "0")},
			{at: 0, req: consume(2), want: allowed(2, 0, 2, 1000000, "0")},
			{at: 0, req: estimate(1), want: denied(2, 0, 500000, 1000000, "0")},
			{at: 250000, req: estimate(1), want: denied(2, 0, 250000, 750000, "0")},
			{at: 250000, req: estimate(1), want: denied(2, 0, 250000, 750000, "0")},
			{at: 500000, req: estimate(1), want: allowed(2, 1, 0, 500000, "0")},
		},
	}, {
		name: "Reserve within MaxWait, on credit",
		cfg:  cfgOf(oneMs.WithBurst(2)),
		steps: []step{
			{at: 0, req: reserve(2, 0), want: reserved(2, 0, 2, 0, 2000, "0")},
			{at: 0, req: reserve(1, 999*us), want: denied(2, 0, 1000, 2000, "0")},
			// MaxWait counts whole microseconds: 999.999µs is 999µs.
			{at: 0, req: reserve(1, 1000*us-time.Nanosecond), want: denied(2, 0, 1000, 2000, "0")},
			{at: 0, req: reserve(1, 1000*us), want: reserved(2, 0, 1, 1000, 3000, "0")},
			// 3 tokens short now: the bucket is in debt.
			{at: 0, req: reserve(2, 3000*us), want: reserved(2, 0, 2, 3000, 5000, "0")},
			{at: 0, req: consume(1), want: denied(2, 0, 4000, 5000, "0")},
			{at: 0, req: inspect(), want: denied(2, 0, 4000, 5000, "0")},
			{at: 3999, req: consume(1), want: denied(2, 0, 1, 1001, "0")},
			{at: 4000, req: consume(1), want: allowed(2, 0, 1, 2000, "0")},
			{at: 4000, req: inspect(), want: denied(2, 0, 1000, 2000, "0")},
			{at: 4000, req: reserve(2, time.Duration(math.MaxInt64)), want: reserved(2, 0, 2, 2000, 4000, "0")},
		},
	}, {
		name: "ConsumeUpTo",
		cfg:  cfgOf(five),
		steps: []step{
			{at: 0, req: consumeUpTo(3), want: allowed(5, 2, 3, 750000, "0")},
			{at: 0, req: consumeUpTo(10), want: allowed(5, 0, 2, 1250000, "0")},
			{at: 0, req: consumeUpTo(1), want: Decision{Limit: 5, RetryAfter: 250000 * us, ResetAfter: 1250000 * us, Bandwidth: "0"}},
			{at: 600000, req: consumeUpTo(math.MaxInt64), want: allowed(5, 0, 2, 1150000, "0")},
		},
	}, {
		name: "Add up to capacity",
		cfg:  cfgOf(five),
		steps: []step{
			{at: 0, req: consume(4), want: allowed(5, 1, 4, 1000000, "0")},
			{at: 0, req: add(2), want: allowed(5, 3, 0, 500000, "0")},
			{at: 0, req: add(100), want: allowed(5, 5, 0, 0, "0")},
			{at: 0, req: add(math.MaxInt64), want: allowed(5, 5, 0, 0, "0")},
			{at: 0, req: consume(5), want: allowed(5, 0, 5, 1250000, "0")},
			// Fractions of a token stay: 0.4 + 1 = 1.4.
			{at: 100000, req: add(1), want: allowed(5, 1, 0, 900000, "0")},
		},
	}, {
		// Tokens added to a bucket in debt first pay the debt; a large
		// count still fills it to capacity.
		name: "Add in debt",
		cfg:  cfgOf(five),
		steps: []step{
			{at: 0, req: reserve(5, 0), want: reserved(5, 0, 5, 0, 1250000, "0")},
			{at: 0, req: reserve(5, 2*time.Second), want: reserved(5, 0, 5, 1250000, 2500000, "0")},
			{at: 0, req: add(7), want: allowed(5, 2, 0, 750000, "0")},
			{at: 0, req: reserve(5, 2*time.Second), want: reserved(5, 0, 5, 750000, 2000000, "0")},
			{at: 0, req: add(100), want: allowed(5, 5, 0, 0, "0")},
			{at: 0, req: reserve(5, 0), want: reserved(5, 0, 5, 0, 1250000, "0")},
			{at: 0, req: reserve(5, 2*time.Second), want: reserved(5, 0, 5, 1250000, 2500000, "0")},
			{at: 0, req: add(math.MaxInt64), want: allowed(5, 5, 0, 0, "0")},
		},
	}, {
		name: "Reset",
		cfg:  cfgOf(five.WithInitialTokens(2)),
		steps: []step{
			{at: 0, req: consume(2), want: allowed(5, 0, 2, 1250000, "0")},
			{at: 750000, req: consume(3), want: allowed(5, 0, 3, 1250000, "0")},
			{at: 1000010, req: Request{Op: Reset}, want: allowed(5, 2, 0, 750000, "0")},
			{at: 1000010, req: Request{Op: Reset, Tokens: -1, MaxWait: -1}, want: allowed(5, 2, 0, 750000, "0")},
		},
	}, {
		name: "Inspect",
		cfg:  cfgOf(five),
		steps: []step{
			{at: 0, req: inspect(), want: allowed(5, 5, 0, 0, "0")},
			{at: 0, req: consume(5), want: allowed(5, 0, 5, 1250000, "0")},
			{at: 10, req: inspect(), want: denied(5, 0, 249990, 1249990, "0")},
			{at: 250000, req: Request{Op: Inspect, Tokens: 5}, want: allowed(5, 1, 0, 1000000, "0")},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, tt.cfg, tt.steps) })
	}
}

func TestApplyInitialTokens(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{{
		name:  "greedy",
		cfg:   cfgOf(PerSecond(10).WithInitialTokens(3)),
		steps: []step{{at: 0, req: inspect(), want: allowed(10, 3, 0, 700000, "0")}},
	}, {
		name: "greedy, empty",
		cfg:  cfgOf(PerSecond(10).WithInitialTokens(0)),
		steps: []step{
			// Inspect builds the bucket, empty at 7, so the token it says
			// comes at 100007 does.
			{at: 7, req: inspect(), want: denied(10, 0, 100000, 1000000, "0")},
			{at: 100006, req: consume(1), want: denied(10, 0, 1, 900001, "0")},
			{at: 100007, req: consume(1), want: allowed(10, 0, 1, 1000000, "0")},
			{at: 200007, req: consume(1), want: allowed(10, 0, 1, 1000000, "0")},
		},
	}, {
		// Below capacity from the start, so the first period starts at
		// creation.
		name: "interval, empty",
		cfg:  cfgOf(Every(1000*us, 5).WithRefill(Interval).WithInitialTokens(0)),
		steps: []step{
			{at: 100, req: consume(1), want: denied(5, 0, 1000, 1000, "0")},
			{at: 1099, req: inspect(), want: denied(5, 0, 1, 1, "0")},
			{at: 1100, req: inspect(), want: allowed(5, 5, 0, 0, "0")},
			// A client that waited for the full bucket gets it; the state
			// expires into a new, empty bucket a fill time after it is full
			// again. (Inspect at 2100 finds it full, so leaves its expiry
			// at 3100; a look later than 2100 would move it.)
			{at: 1100, req: consume(5), want: allowed(5, 0, 5, 1000, "0")},
			{at: 2100, req: inspect(), want: allowed(5, 5, 0, 0, "0")},
			{at: 3100, req: inspect(), want: denied(5, 0, 1000, 1000, "0")},
		},
	}, {
		name: "aligned, part full",
		cfg:  cfgOf(Every(1000*us, 2).WithBurst(6).AlignedTo(time.UnixMicro(0)).WithInitialTokens(3)),
		steps: []step{
			// The first period began at the boundary before creation, 0:
			// the missing tokens start returning at 1000, not 1100.
			{at: 100, req: inspect(), want: allowed(6, 3, 0, 1900, "0")},
			{at: 100, req: consume(1), want: allowed(6, 2, 1, 1900, "0")},
			{at: 1000, req: inspect(), want: allowed(6, 4, 0, 1000, "0")},
		},
	}, {
		name:  "several bandwidths",
		cfg:   cfgOf(oneMs.WithBurst(10).WithInitialTokens(7), tenth.WithBurst(10).WithInitialTokens(2)),
		steps: []step{{at: 0, req: consume(2), want: allowed(10, 0, 2, 5000, "1")}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, tt.cfg, tt.steps) })
	}
}

// TestApplyRetryAfterExact checks that a denied request retried exactly
// RetryAfter later passes, and one microsecond earlier does not, for rates
// whose token interval is no whole number of microseconds.
func TestApplyRetryAfterExact(t *testing.T) {
	for _, bw := range []Bandwidth{
		PerSecond(3), PerSecond(7), PerMinute(7), PerHour(11), Every(7*us, 3).WithBurst(10),
		Every(1000*us, 3).WithBurst(10).WithRefill(Interval),
		Every(999*us, 4).WithBurst(9).AlignedTo(time.UnixMicro(13)),
	} {
		cfg := cfgOf(bw)
		for n := int64(1); n <= min(bw.Capacity, 3); n++ {
			t.Run(fmt.Sprintf("%v per %v %v n=%d", bw.RefillTokens, bw.RefillPeriod, bw.Refill, n), func(t *testing.T) {
				var s State
				now := int64(12345)
				for range 5 {
					// Take every whole token, leaving at most a fraction.
					Apply(&s, cfg, consumeUpTo(math.MaxInt64), now)
					d := Apply(&s, cfg, consume(n), now)
					if d.Allowed {
						t.Fatalf("Consume(%d) at %d allowed, want denied", n, now)
					}
					if d.RetryAfter <= 0 || d.RetryAfter%us != 0 {
						t.Fatalf("RetryAfter = %v, want a positive whole number of µs", d.RetryAfter)
					}
					wait := int64(d.RetryAfter / us)
					early := cloneState(&s)
					if e := Apply(&early, cfg, estimate(n), now+wait-1); e.Allowed {
						t.Fatalf("Estimate(%d) allowed 1µs before RetryAfter %v", n, d.RetryAfter)
					}
					if d := Apply(&s, cfg, consume(n), now+wait); !d.Allowed {
						t.Fatalf("Consume(%d) denied at RetryAfter %v: %+v", n, d.RetryAfter, d)
					}
					now += wait
				}
			})
		}
	}
}

// TestApplyReserveDebtLimit checks that Reserve never leaves a bandwidth
// more than maxHorizon (2^51µs) from full, nor a greedy one below -MaxScaled
// (-2^51) scaled units, and that it stops exactly there.
func TestApplyReserveDebtLimit(t *testing.T) {
	forever := time.Duration(math.MaxInt64)
	run := func(t *testing.T, cfg Config, steps []step, level int64) {
		t.Helper()
		s := runSteps(t, cfg, steps)
		if got := s.Bands[0].Level; got != level {
			t.Errorf("Level = %d, want %d", got, level)
		}
	}
	t.Run("interval", func(t *testing.T) {
		// 366 days a token: 2^51µs is 71.2 periods, so the bandwidth may
		// be 71 tokens short of full, its level as low as 1 - 71.
		const period = int64(MaxRefillPeriod / us)
		var steps []step
		for k := range int64(71) {
			steps = append(steps, step{at: 0, req: reserve(1, forever), want: reserved(1, 0, 1, k*period, (k+1)*period, "0")})
		}
		steps = append(steps,
			step{at: 0, req: reserve(1, forever), want: denied(1, 0, 71*period, 71*period, "0")},
			// Until a period has passed, still 71 tokens short.
			step{at: period - 1, req: reserve(1, forever), want: denied(1, 0, 70*period+1, 70*period+1, "0")},
			step{at: period, req: reserve(1, forever), want: reserved(1, 0, 1, 70*period, 71*period, "0")},
		)
		run(t, cfgOf(Every(MaxRefillPeriod, 1).WithRefill(Interval)), steps, -70)
	})
	t.Run("greedy, time", func(t *testing.T) {
		// 2^40 scaled units a token, one a µs, 1024 tokens: full is 2^50
		// units, 2^50µs from empty, so the level may fall to 2^50 - 2^51 =
		// -2^50, one full bucket of debt, though -MaxScaled would allow
		// two.
		run(t, cfgOf(Every(1<<40*us, 1).WithBurst(1024)), []step{
			{at: 0, req: reserve(1024, forever), want: reserved(1024, 0, 1024, 0, 1<<50, "0")},
			{at: 0, req: reserve(1024, forever), want: reserved(1024, 0, 1024, 1<<50, 1<<51, "0")},
			{at: 0, req: reserve(1, forever), want: denied(1024, 0, 1<<50+1<<40, 1<<51, "0")},
			// A token needs 2^40µs of refill to fit: 1µs short, it would
			// leave the bandwidth 2^51+1µs from full.
			{at: 1<<40 - 1, req: reserve(1, forever), want: denied(1024, 0, 1<<50+1, 1<<51-1<<40+1, "0")},
			{at: 1 << 40, req: reserve(1, forever), want: reserved(1024, 0, 1, 1<<50, 1<<51, "0")},
		}, -1<<50)
	})
	t.Run("greedy, scaled units", func(t *testing.T) {
		// 4 scaled units a token, 3 a µs, 2^49 tokens: full is 2^51 units,
		// and -2^51 binds long before 2^51µs of refill (⌈2^52/3⌉µs from
		// there). One more token, 4 units, fits once 4 units have
		// returned: at 2µs, not at 1µs.
		run(t, cfgOf(Every(4*us, 3).WithBurst(1<<49)), []step{
			{at: 0, req: reserve(1<<49, forever), want: reserved(1<<49, 0, 1<<49, 0, 750599937895083, "0")},
			{at: 0, req: reserve(1<<49, forever), want: reserved(1<<49, 0, 1<<49, 750599937895083, 1501199875790166, "0")},
			{at: 0, req: reserve(1, forever), want: denied(1<<49, 0, 750599937895084, 1501199875790166, "0")},
			{at: 1, req: reserve(1, forever), want: denied(1<<49, 0, 750599937895083, 1501199875790165, "0")},
			{at: 2, req: reserve(1, forever), want: reserved(1<<49, 0, 1, 750599937895082, 1501199875790165, "0")},
		}, -MaxScaled+2)
	})
}

// cloneState returns a copy of s that shares nothing with it.
func cloneState(s *State) State {
	c := *s
	c.Bands, c.Log = slices.Clone(s.Bands), slices.Clone(s.Log)
	return c
}

// refilled returns s as a request that takes nothing leaves it at now:
// built anew if absent or expired, else refilled, with its expiry
// recomputed. Inspect is exactly that.
func refilled(s *State, cfg Config, now int64) State {
	c := cloneState(s)
	Apply(&c, cfg, inspect(), now)
	return c
}

// refilledPastExpiry is refilled as if s never expired: its own bands
// brought up to now.
func refilledPastExpiry(s *State, cfg Config, now int64) State {
	c := cloneState(s)
	c.ExpiresAt = math.MaxInt64
	Apply(&c, cfg, inspect(), now)
	return c
}

// newBucket is the state of a bucket created at now.
func newBucket(cfg Config, now int64) State {
	var s State
	Apply(&s, cfg, inspect(), now)
	return s
}

func equalStates(a, b State) bool {
	return a.Fingerprint == b.Fingerprint && a.Algorithm == b.Algorithm && a.ExpiresAt == b.ExpiresAt &&
		slices.Equal(a.Bands, b.Bands) && slices.Equal(a.Log, b.Log) && a.Version == b.Version &&
		(a.Config == nil) == (b.Config == nil) && (a.Config == nil || a.Config.Version == b.Config.Version &&
		a.Config.Algorithm == b.Config.Algorithm && a.Config.Fingerprint() == b.Config.Fingerprint())
}

// TestApplyDeniedChangesNothing checks that Estimate, Inspect and a denied
// Consume, Reserve or ConsumeUpTo leave the state exactly as refilling
// alone would, expiry included: they take nothing, though they write back
// the refill.
func TestApplyDeniedChangesNothing(t *testing.T) {
	configs := map[string]Config{
		"greedy":   cfgOf(PerSecond(7)),
		"interval": cfgOf(Every(1000*us, 3).WithBurst(7).WithRefill(Interval)),
		"aligned":  cfgOf(Every(1000*us, 3).WithBurst(7).AlignedTo(time.UnixMicro(77))),
		"several":  cfgOf(PerSecond(7).WithID("s"), Every(1000*us, 3).WithBurst(9).WithRefill(Interval).WithID("i")),
		"initial":  cfgOf(PerSecond(7).WithInitialTokens(0), Every(1000*us, 3).WithBurst(9).WithRefill(Interval).WithInitialTokens(4)),
	}
	reqs := []Request{
		consume(7), reserve(7, 0), reserve(7, 1000*us), consumeUpTo(1),
		estimate(7), estimate(1), inspect(), {Op: Inspect, Tokens: 7, Strategy: ResetTokens},
	}
	// The state each run starts from: part used, empty, in debt.
	setups := []Request{consume(6), consumeUpTo(7), reserve(7, time.Second)}
	for name, cfg := range configs {
		for _, setup := range setups {
			t.Run(fmt.Sprintf("%s after %v %d", name, setup.Op, setup.Tokens), func(t *testing.T) {
				var s State
				Apply(&s, cfg, setup, 1000)
				denials := map[Op]int{}
				for _, at := range []int64{1000, 1001, 1500, 2000, 2999, 143000, 1 << 40} {
					for _, req := range reqs {
						got := cloneState(&s)
						d := Apply(&got, cfg, req, at)
						if req.Op != Estimate && req.Op != Inspect {
							if d.Allowed {
								continue
							}
							denials[req.Op]++
						}
						if want := refilled(&s, cfg, at); !equalStates(got, want) {
							t.Errorf("%+v at %d = %+v changed more than refilling:\n got %+v\nwant %+v", req, at, d, got, want)
						}
					}
				}
				// Only the part-used bucket always has a token for ConsumeUpTo.
				if denials[Consume] == 0 || denials[Reserve] == 0 || denials[ConsumeUpTo] == 0 && setup.Op != Consume {
					t.Errorf("denials by op = %v: want some of each", denials)
				}
			})
		}
	}
}

// TestApplyNoDrift takes a token and advances the clock 10,000 times at 7
// tokens a second, a rate whose token interval (142857.142…µs) is no whole
// number of microseconds, and checks the end state against the closed form.
func TestApplyNoDrift(t *testing.T) {
	const (
		steps = 10000
		dt    = 100001 // µs per step: 0.700007 tokens
		rate  = 7      // scaled units (10^-6 tokens) per µs
		unit  = 1000000
	)
	cfg := cfgOf(PerSecond(rate))
	var s State
	now := int64(1 << 40)
	granted := int64(0)
	for range steps {
		if d := Apply(&s, cfg, consume(1), now); d.Allowed {
			granted++
		}
		now += dt
	}
	// The bucket holds 7 tokens at the first step and is never full again,
	// so step i is granted exactly when 7 + 0.700007i - granted ≥ 1, and
	// granted tokens total min(n, 7 + ⌊0.700007(n-1)⌋).
	wantGranted := min(int64(steps), 7+rate*dt*(steps-1)/unit)
	if granted != wantGranted {
		t.Fatalf("granted %d tokens, want %d", granted, wantGranted)
	}
	level := 7*unit + rate*dt*steps - granted*unit // in 10^-6 tokens
	want := allowed(7, level/unit, 0, (7*unit-level+rate-1)/rate, "0")
	want.RefillAfter = time.Duration((unit-level%unit+rate-1)/rate) * us
	if got := Apply(&s, cfg, inspect(), now); got != want {
		t.Errorf("after %d steps: %+v, want %+v", steps, got, want)
	}
	if wantGranted != 7006 || level != 1070000 || want.ResetAfter != 847143*us {
		t.Errorf("closed form: granted %d, level %d, reset %v; want 7006, 1070000, 847.143ms", wantGranted, level, want.ResetAfter)
	}
}

// TestApplyConfigChange checks the fingerprint rule: a config that differs
// from the one that built the state converts it with req.Strategy, and
// Replace converts even when it does not differ.
func TestApplyConfigChange(t *testing.T) {
	old := cfgOf(oneMs.WithBurst(10).WithID("a"))
	up := cfgOf(oneMs.WithBurst(20).WithID("a"))
	down := cfgOf(oneMs.WithBurst(3).WithID("a"))
	down7 := cfgOf(oneMs.WithBurst(7).WithID("a"))
	down5 := cfgOf(oneMs.WithBurst(5).WithID("a"))
	faster := cfgOf(Every(1000*us, 2).WithBurst(20).WithID("a"))
	with := func(s Inheritance) Request { return Request{Op: Inspect, Strategy: s} }
	used4 := step{at: 0, req: consume(6), want: allowed(10, 4, 6, 6000, "a")}
	indebt := []step{
		{at: 0, req: consume(10), want: allowed(10, 0, 10, 10000, "a")},
		{at: 0, req: reserve(3, 3000*us), want: reserved(10, 0, 3, 3000, 13000, "a")},
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"AsIs, capacity up", []step{used4, {at: 0, cfg: &up, req: with(AsIs), want: allowed(20, 4, 0, 16000, "a")}}},
		{"ResetTokens, capacity up", []step{used4, {at: 0, cfg: &up, req: with(ResetTokens), want: allowed(20, 20, 0, 0, "a")}}},
		{"Proportionally, capacity up", []step{used4, {at: 0, cfg: &up, req: with(Proportionally), want: allowed(20, 8, 0, 12000, "a")}}},
		{"Additive, capacity up", []step{used4, {at: 0, cfg: &up, req: with(Additive), want: allowed(20, 14, 0, 6000, "a")}}},
		{"AsIs, capacity down", []step{used4, {at: 0, cfg: &down, req: with(AsIs), want: allowed(3, 3, 0, 0, "a")}}},
		{"ResetTokens, capacity down", []step{used4, {at: 0, cfg: &down, req: with(ResetTokens), want: allowed(3, 3, 0, 0, "a")}}},
		{"Proportionally, capacity down", []step{used4, {at: 0, cfg: &down, req: with(Proportionally), want: allowed(3, 1, 0, 1800, "a")}}}, // 1.2
		{"Additive, capacity down", []step{used4, {at: 0, cfg: &down, req: with(Additive), want: allowed(3, 3, 0, 0, "a")}}},
		{"Proportionally keeps the fraction", []step{
			{at: 0, req: consume(2), want: allowed(10, 8, 2, 2000, "a")},
			{at: 0, cfg: &down7, req: with(Proportionally), want: allowed(7, 5, 0, 1400, "a")}, // 5.6
		}},
		{"AsIs in debt", append(indebt[:2:2], step{at: 0, cfg: &up, req: with(AsIs), want: denied(20, 0, 4000, 23000, "a")})},
		{"Proportionally in debt", append(indebt[:2:2], step{at: 0, cfg: &up, req: with(Proportionally), want: denied(20, 0, 7000, 26000, "a")})},
		{"Proportionally in debt keeps the fraction", append(indebt[:2:2], step{at: 0, cfg: &down5, req: with(Proportionally), want: denied(5, 0, 2500, 6500, "a")})}, // -1.5
		{"Additive in debt", append(indebt[:2:2], step{at: 0, cfg: &up, req: with(Additive), want: allowed(20, 7, 0, 13000, "a")})},
		{"ResetTokens in debt", append(indebt[:2:2], step{at: 0, cfg: &up, req: with(ResetTokens), want: allowed(20, 20, 0, 0, "a")})},
		{
			// The 500µs since the bucket was last touched refill at the new
			// rate: 4 tokens + 500µs × 2/1000µs = 5, where the old rate
			// would give 4.5.
			"time since last touch refills at the new rate",
			[]step{used4, {at: 500, cfg: &faster, req: with(AsIs), want: allowed(20, 5, 0, 7500, "a")}},
		},
		{
			"any op converts, with its Strategy",
			[]step{used4, {at: 0, cfg: &up, req: Request{Op: Consume, Tokens: 1, Strategy: Additive}, want: allowed(20, 13, 1, 7000, "a")}},
		},
		{
			"the same config does not convert, whatever the Strategy",
			[]step{
				used4,
				{at: 500, req: inspect(), want: allowed(10, 4, 0, 5500, "a")},
				{at: 500, req: Request{Op: Inspect, Strategy: ResetTokens}, want: allowed(10, 4, 0, 5500, "a")},
			},
		},
		{
			// Replace converts even an unchanged config. It carries the
			// whole tokens the last call left, 4 at 0, and refills from
			// there. It then changed the bucket at 500, so a second Replace
			// drops the half token refilled since 0.
			"Replace with the same config",
			[]step{
				used4,
				{at: 500, req: Request{Op: Replace, Strategy: AsIs}, want: allowed(10, 4, 0, 5500, "a")},
				{at: 500, req: Request{Op: Replace, Strategy: AsIs}, want: allowed(10, 4, 0, 6000, "a")},
				{at: 500, req: Request{Op: Replace, Strategy: Additive}, want: allowed(10, 4, 0, 6000, "a")},
				{at: 500, req: Request{Op: Replace, Strategy: ResetTokens}, want: allowed(10, 10, 0, 0, "a")},
			},
		},
		{
			// Inspect writes back its refill: 4.5 tokens at 500, of which
			// Replace keeps the whole 4.
			"Replace after Inspect",
			[]step{
				used4,
				{at: 500, req: inspect(), want: allowed(10, 4, 0, 5500, "a")},
				{at: 500, req: Request{Op: Replace, Strategy: AsIs}, want: allowed(10, 4, 0, 6000, "a")},
			},
		},
		{
			"Replace on an absent bucket builds a new one",
			[]step{{at: 0, req: Request{Op: Replace, Strategy: Proportionally}, want: allowed(10, 10, 0, 0, "a")}},
		},
		{
			// An interval bandwidth keeps its period: the 600µs already run
			// count toward the first refill after the change.
			"interval keeps its period",
			[]step{
				{at: 0, cfg: ptr(cfgOf(Every(1000*us, 5).WithBurst(10).WithRefill(Interval).WithID("a"))), req: consume(10), want: allowed(10, 0, 10, 2000, "a")},
				{at: 600, cfg: ptr(cfgOf(Every(1000*us, 5).WithBurst(20).WithRefill(Interval).WithID("a"))), req: Request{Op: Replace, Strategy: Additive}, want: allowed(20, 10, 0, 1400, "a")},
				{at: 1000, cfg: ptr(cfgOf(Every(1000*us, 5).WithBurst(20).WithRefill(Interval).WithID("a"))), req: inspect(), want: allowed(20, 15, 0, 1000, "a")},
			},
		},
		{
			// Add fills the bandwidth at 590 and so ends the period that
			// began at 0: the new config refills from 590, and no boundary
			// has passed by 1500.
			"Add that fills an interval bandwidth ends its period",
			[]step{
				{at: 0, cfg: ptr(cfgOf(Every(1000*us, 10).WithRefill(Interval).WithID("a"))), req: consume(10), want: allowed(10, 0, 10, 1000, "a")},
				{at: 590, cfg: ptr(cfgOf(Every(1000*us, 10).WithRefill(Interval).WithID("a"))), req: add(10), want: allowed(10, 10, 0, 0, "a")},
				{at: 1500, cfg: ptr(cfgOf(Every(1000*us, 20).WithRefill(Interval).WithID("a"))), req: inspect(), want: allowed(20, 20, 0, 0, "a")},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, old, tt.steps) })
	}
}

func ptr[T any](v T) *T { return &v }

// tokensOf is the whole tokens of every bandwidth in s.
func tokensOf(s *State) []int64 {
	var out []int64
	for _, b := range s.Bands {
		out = append(out, floorDiv(b.Level, b.Scale))
	}
	return out
}

// TestApplyConfigChangeMatching checks how bandwidths are matched across a
// config change: by ID, or by position when neither has an ID; an
// unmatched new bandwidth starts as in a new bucket.
func TestApplyConfigChangeMatching(t *testing.T) {
	bw := func(id string, capacity int64) Bandwidth { return oneMs.WithBurst(capacity).WithID(id) }
	// Consume 5 leaves 5, 3 and 1 tokens.
	old := cfgOf(bw("burst", 10), bw("", 8), bw("day", 6))
	tests := []struct {
		name string
		cfg  Config
		want []int64
	}{
		{"reordered, plus a new one", cfgOf(bw("day", 6), bw("", 8), bw("burst", 10), bw("new", 4).WithInitialTokens(2)), []int64{1, 3, 5, 2}},
		{"no ID where the old one had one", cfgOf(bw("", 10), bw("x", 8), bw("", 6)), []int64{10, 8, 6}},
		{"fewer", cfgOf(bw("burst", 10), bw("", 8)), []int64{5, 3}},
		{"no ID matches only at its own position", cfgOf(bw("", 8), bw("", 8)), []int64{8, 3}},
		{"more without ID", cfgOf(bw("burst", 10), bw("", 8), bw("day", 6), bw("", 4)), []int64{5, 3, 1, 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s State
			Apply(&s, old, consume(5), 0)
			Apply(&s, tt.cfg, Request{Op: Replace, Strategy: AsIs}, 0)
			if got := tokensOf(&s); !slices.Equal(got, tt.want) {
				t.Errorf("tokens = %v, want %v", got, tt.want)
			}
			if s.Fingerprint != tt.cfg.Fingerprint() {
				t.Errorf("Fingerprint = %x, want the new config's %x", s.Fingerprint, tt.cfg.Fingerprint())
			}
			for i, b := range s.Bands {
				if b.ID != tt.cfg.Bandwidths[i].ID || b.Capacity != tt.cfg.Bandwidths[i].Capacity {
					t.Errorf("Bands[%d] = %+v, want ID %q, Capacity %d", i, b, tt.cfg.Bandwidths[i].ID, tt.cfg.Bandwidths[i].Capacity)
				}
			}
		})
	}
}

func TestApplyReset(t *testing.T) {
	cfg := cfgOf(PerSecond(7).WithID("s"), Every(1000*us, 3).WithBurst(9).AlignedTo(time.UnixMicro(5)).WithInitialTokens(4))
	var s State
	Apply(&s, cfg, consume(4), 100)
	Apply(&s, cfg, Request{Op: Reset}, 123456)
	if want := newBucket(cfg, 123456); !equalStates(s, want) {
		t.Errorf("after Reset: %+v, want a new bucket's %+v", s, want)
	}
}

// TestApplyReadOnly checks that Estimate and Inspect take nothing but keep
// what they build, as every op does: a new bucket in an empty or expired
// State, a conversion to a changed config, the refill, and the expiry,
// recomputed from now. So the RetryAfter they report comes true for a later
// Consume, even for a bucket that starts below the tokens asked or one
// that a config change converted.
func TestApplyReadOnly(t *testing.T) {
	t.Run("empty", func(t *testing.T) {
		other := cfgOf(Every(100*us, 1).WithID("other"))
		for _, cfg := range []Config{
			cfgOf(PerSecond(10)),
			cfgOf(PerSecond(10).WithInitialTokens(0)),
			cfgOf(tenth.WithBurst(4).WithID("a"), Every(1000*us, 3).WithBurst(9).AlignedTo(time.UnixMicro(5)).WithInitialTokens(2)),
		} {
			for _, req := range []Request{estimate(1), estimate(cfg.MinCapacity()), inspect(), {Op: Inspect, Strategy: Additive}} {
				// What req finds, and leaves, in a bucket Reset built.
				var want State
				Apply(&want, cfg, Request{Op: Reset}, 1000)
				wantD := Apply(&want, cfg, req, 1000)
				var array [4]BandState // room the new bucket may use
				var expired State
				Apply(&expired, other, consume(1), 0) // expires at 100
				for _, s := range []State{{}, {Bands: array[:0]}, {Fingerprint: 7, Bands: []BandState{}}, expired} {
					if got := Apply(&s, cfg, req, 1000); got != wantD {
						t.Errorf("%s: %+v = %+v, want %+v", describe(cfg), req, got, wantD)
					}
					if !equalStates(s, want) {
						t.Errorf("%s: %+v left %+v, want the new bucket %+v", describe(cfg), req, s, want)
					}
				}
			}
		}
	})

	old := cfgOf(oneMs.WithBurst(10).WithID("a"))
	up := cfgOf(oneMs.WithBurst(20).WithID("a"))
	initial := cfgOf(oneMs.WithBurst(4).WithInitialTokens(1)) // ExpiresAt: 3000µs after full
	used4 := step{at: 0, req: consume(6), want: allowed(10, 4, 6, 6000, "a")}
	withMin := cfgOf(PerSecond(10).WithID("sec"), PerMinute(100).WithID("min").WithInitialTokens(0))
	daily := cfgOf(Every(24*time.Hour, 100).WithRefill(Interval).WithID("a"))
	tests := []struct {
		name    string
		cfg     Config
		steps   []step
		expires int64 // ExpiresAt after the steps
	}{{
		// Estimate builds the empty bucket at 1000000, so its first token
		// comes when Estimate said.
		name: "a new bucket's RetryAfter comes true",
		cfg:  cfgOf(PerSecond(10).WithInitialTokens(0)),
		steps: []step{
			{at: 1000000, req: estimate(1), want: denied(10, 0, 100000, 1000000, "0")},
			{at: 1100000, req: estimate(1), want: allowed(10, 1, 0, 900000, "0")},
			{at: 1100000, req: consume(1), want: allowed(10, 0, 1, 1000000, "0")},
		},
		expires: 1100000 + 1000000 + 1000000,
	}, {
		name: "a new bucket's RetryAfter for its capacity comes true",
		cfg:  cfgOf(PerSecond(10).WithInitialTokens(0)),
		steps: []step{
			{at: 0, req: estimate(10), want: denied(10, 0, 1000000, 1000000, "0")},
			{at: 999999, req: consume(10), want: denied(10, 9, 1, 1, "0")},
			{at: 1000000, req: consume(10), want: allowed(10, 0, 10, 1000000, "0")},
		},
		expires: 1000000 + 1000000 + 1000000,
	}, {
		// Estimate under the new config builds its new, empty "min"
		// bandwidth at 100000: its token comes at 700000.
		name: "a bandwidth a config change adds is kept",
		cfg:  cfgOf(PerSecond(10).WithID("sec")),
		steps: []step{
			{at: 0, req: consume(5), want: allowed(10, 5, 5, 500000, "sec")},
			{at: 100000, cfg: &withMin, req: estimate(1), want: denied(100, 0, 600000, 60000000, "min")},
			{at: 700000, cfg: &withMin, req: estimate(1), want: allowed(100, 1, 0, 59400000, "min")},
			{at: 700000, cfg: &withMin, req: consume(1), want: allowed(100, 0, 1, 60000000, "min")},
		},
		expires: 700000 + 60000000 + 60000000,
	}, {
		// The next request finds the new config's fingerprint and converts
		// no more, whatever its Strategy: it takes from the 14 tokens;
		// ResetTokens would have given 20.
		name: "a changed config seen by Inspect is kept",
		cfg:  old,
		steps: []step{
			used4,
			{at: 0, cfg: &up, req: Request{Op: Inspect, Strategy: Additive}, want: allowed(20, 14, 0, 6000, "a")},
			{at: 0, cfg: &up, req: Request{Op: Consume, Tokens: 1, Strategy: ResetTokens}, want: allowed(20, 13, 1, 7000, "a")},
		},
		expires: 7000,
	}, {
		// Back under the old config, the 20 tokens convert again: 10 of
		// them fit.
		name: "a changed config seen by Estimate is kept",
		cfg:  old,
		steps: []step{
			used4,
			{at: 0, cfg: &up, req: Request{Op: Estimate, Tokens: 10, Strategy: ResetTokens}, want: allowed(20, 20, 0, 0, "a")},
			{at: 0, req: consume(5), want: allowed(10, 5, 5, 5000, "a")},
		},
		expires: 5000,
	}, {
		// The old state would expire at 100000; the converted one, 9
		// tokens of a daily 100, lasts until the day's refill Estimate
		// reported, and the tokens come then.
		name: "a converted state's RetryAfter comes true",
		cfg:  cfgOf(PerSecond(10).WithID("a")),
		steps: []step{
			{at: 0, req: consume(1), want: allowed(10, 9, 1, 100000, "a")},
			{at: 50000, cfg: &daily, req: estimate(100), want: denied(100, 9, 86399950000, 86399950000, "a")},
			{at: 100000, cfg: &daily, req: consume(100), want: denied(100, 9, 86399900000, 86399900000, "a")},
			{at: 86399999999, cfg: &daily, req: consume(100), want: denied(100, 9, 1, 1, "a")},
			{at: 86400000000, cfg: &daily, req: consume(100), want: allowed(100, 0, 100, 86400000000, "a")},
		},
		expires: 2 * 86400000000,
	}, {
		// Consume at 7000 finds the 1 token of the bucket Inspect built.
		name: "an expired state is rebuilt",
		cfg:  initial,
		steps: []step{
			{at: 0, req: consume(1), want: allowed(4, 0, 1, 4000, "0")},
			{at: 7000, req: inspect(), want: allowed(4, 1, 0, 3000, "0")},
			{at: 7000, req: consume(2), want: denied(4, 1, 1000, 3000, "0")},
		},
		expires: 7000 + 3000 + 3000,
	}, {
		// Full since 4000 and due to expire at 7000; looked at, at 6999.
		name: "looking moves the expiry",
		cfg:  initial,
		steps: []step{
			{at: 0, req: consume(1), want: allowed(4, 0, 1, 4000, "0")},
			{at: 6999, req: inspect(), want: allowed(4, 4, 0, 0, "0")},
		},
		expires: 6999 + 0 + 3000,
	}, {
		name: "looking moves the expiry: the full bucket stays",
		cfg:  initial,
		steps: []step{
			{at: 0, req: consume(1), want: allowed(4, 0, 1, 4000, "0")},
			{at: 6999, req: estimate(4), want: allowed(4, 4, 0, 0, "0")},
			{at: 9998, req: consume(4), want: allowed(4, 0, 4, 4000, "0")},
		},
		expires: 9998 + 4000 + 3000,
	}, {
		name: "looking moves the expiry: then it expires",
		cfg:  initial,
		steps: []step{
			{at: 0, req: consume(1), want: allowed(4, 0, 1, 4000, "0")},
			{at: 6999, req: inspect(), want: allowed(4, 4, 0, 0, "0")},
			{at: 9999, req: inspect(), want: allowed(4, 1, 0, 3000, "0")},
		},
		expires: 9999 + 3000 + 3000,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if s := runSteps(t, tt.cfg, tt.steps); s.ExpiresAt != tt.expires {
				t.Errorf("ExpiresAt = %d, want %d", s.ExpiresAt, tt.expires)
			}
		})
	}
}

// TestApplyExpiresAt checks State.ExpiresAt after each kind of change: now
// + ResetAfter, plus, when some bandwidth starts below capacity, the
// longest time a bucket created at now takes to fill.
func TestApplyExpiresAt(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		steps []step
		want  int64 // ExpiresAt after the steps
	}{{
		name:  "full again",
		cfg:   cfgOf(PerSecond(7)),
		steps: []step{{at: 1000, req: consume(6), want: allowed(7, 1, 6, 857143, "0")}},
		want:  858143,
	}, {
		name: "full after the change: at once",
		cfg:  cfgOf(PerSecond(7)),
		steps: []step{
			{at: 1000, req: consume(1), want: allowed(7, 6, 1, 142858, "0")},
			{at: 2000, req: add(1), want: allowed(7, 7, 0, 0, "0")},
		},
		want: 2000,
	}, {
		name:  "a new bucket, full",
		cfg:   cfgOf(PerSecond(7)),
		steps: []step{{at: 1000, req: Request{Op: Replace}, want: allowed(7, 7, 0, 0, "0")}},
		want:  1000,
	}, {
		name: "in debt",
		cfg:  cfgOf(oneMs.WithBurst(2)),
		steps: []step{
			{at: 10, req: reserve(2, 0), want: reserved(2, 0, 2, 0, 2000, "0")},
			{at: 10, req: reserve(2, 2000*us), want: reserved(2, 0, 2, 2000, 4000, "0")},
		},
		want: 4010,
	}, {
		// The arrival of the last token does not move with the clock.
		name: "a clock stepping back",
		cfg:  cfgOf(PerSecond(1)),
		steps: []step{
			{at: 1000, req: consume(1), want: allowed(1, 0, 1, 1000000, "0")},
			{at: 500, req: consume(1), want: denied(1, 0, 1000500, 1000500, "0")},
		},
		want: 1001000,
	}, {
		name:  "InitialTokens",
		cfg:   cfgOf(oneMs.WithBurst(4).WithInitialTokens(1)),
		steps: []step{{at: 0, req: consume(1), want: allowed(4, 0, 1, 4000, "0")}},
		want:  4000 + 3000,
	}, {
		name:  "InitialTokens, full after the change",
		cfg:   cfgOf(oneMs.WithBurst(4).WithInitialTokens(1)),
		steps: []step{{at: 50, req: add(10), want: allowed(4, 4, 0, 0, "0")}},
		want:  50 + 3000,
	}, {
		// A denied request still creates the bucket.
		name:  "InitialTokens 0, denied",
		cfg:   cfgOf(PerSecond(10).WithInitialTokens(0)),
		steps: []step{{at: 7, req: consume(1), want: denied(10, 0, 100000, 1000000, "0")}},
		want:  7 + 1000000 + 1000000,
	}, {
		name:  "interval, InitialTokens 0",
		cfg:   cfgOf(Every(1000*us, 5).WithRefill(Interval).WithInitialTokens(0)),
		steps: []step{{at: 100, req: consume(1), want: denied(5, 0, 1000, 1000, "0")}},
		want:  100 + 1000 + 1000,
	}, {
		// A new bucket at 900 would fill at the boundaries 1000 and 2000.
		name:  "aligned, InitialTokens: the warm-up counts from the boundary",
		cfg:   cfgOf(Every(1000*us, 2).WithBurst(6).AlignedTo(time.UnixMicro(0)).WithInitialTokens(3)),
		steps: []step{{at: 900, req: consume(1), want: allowed(6, 2, 1, 1100, "0")}},
		want:  900 + 1100 + 1100,
	}, {
		name:  "Reset, InitialTokens",
		cfg:   cfgOf(oneMs.WithBurst(4).WithInitialTokens(1)),
		steps: []step{{at: 0, req: consume(1), want: allowed(4, 0, 1, 4000, "0")}, {at: 10, req: Request{Op: Reset}, want: allowed(4, 1, 0, 3000, "0")}},
		want:  10 + 3000 + 3000,
	}, {
		// Warm-ups of 3000µs (a) and 800µs (b): the longer counts.
		name:  "several: the longest warm-up",
		cfg:   cfgOf(oneMs.WithBurst(10).WithInitialTokens(7).WithID("a"), tenth.WithBurst(10).WithInitialTokens(2).WithID("b")),
		steps: []step{{at: 0, req: consume(2), want: allowed(10, 0, 2, 5000, "b")}},
		want:  5000 + 3000,
	}, {
		// a fills last; only b starts below capacity.
		name:  "several: the warm-up of another bandwidth",
		cfg:   cfgOf(oneMs.WithBurst(10).WithID("a"), tenth.WithBurst(10).WithInitialTokens(2).WithID("b")),
		steps: []step{{at: 100, req: consume(2), want: allowed(10, 0, 2, 2000, "b")}},
		want:  100 + 2000 + 800,
	}, {
		name: "a config change: the new config's warm-up",
		cfg:  cfgOf(oneMs.WithBurst(10).WithID("a")),
		steps: []step{
			{at: 0, req: consume(6), want: allowed(10, 4, 6, 6000, "a")},
			{at: 0, cfg: ptr(cfgOf(oneMs.WithBurst(20).WithID("a").WithInitialTokens(5))), req: Request{Op: Replace}, want: allowed(20, 4, 0, 16000, "a")},
		},
		want: 16000 + 15000,
	}, {
		// The latest clock Apply accepts, and a bucket that starts empty
		// and takes the longest time Validate allows to fill: 2^51µs to
		// fill, plus the same warm-up, reach 2^53 and no further.
		name:  "the latest clock, the longest fill",
		cfg:   cfgOf(Every(1<<20*us, 1).WithRefill(Interval).WithBurst(1 << 31).WithInitialTokens(0)),
		steps: []step{{at: maxClock, req: inspect(), want: denied(1<<31, 0, 1<<20, 1<<51, "0")}},
		want:  1 << 53,
	}, {
		// As far in debt as it may go, at the latest clock.
		name: "the latest clock, in debt",
		cfg:  cfgOf(Every(1<<20*us, 1).WithRefill(Interval).WithBurst(1 << 30).WithInitialTokens(0)),
		steps: []step{
			{at: maxClock, req: reserve(1<<30, time.Duration(math.MaxInt64)), want: reserved(1<<30, 0, 1<<30, 1<<50, 1<<51, "0")},
			{at: maxClock, req: reserve(1, time.Duration(math.MaxInt64)), want: denied(1<<30, 0, 1<<50+1<<20, 1<<51, "0")},
		},
		want: maxClock + 1<<51 + 1<<50,
	}, {
		// A reported failure: in 2060, 25000 days to fill plus the same
		// warm-up stay under 2^53.
		name:  "a late clock, a long fill",
		cfg:   cfgOf(Every(24*time.Hour, 1).WithBurst(25000).WithRefill(Interval).WithInitialTokens(0)),
		steps: []step{{at: 2840140800000000, req: reserve(25000, time.Duration(math.MaxInt64)), want: denied(25000, 0, 2160000000000000, 2160000000000000, "0")}},
		want:  2840140800000000 + 2*2160000000000000,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if s := runSteps(t, tt.cfg, tt.steps); s.ExpiresAt != tt.want {
				t.Errorf("ExpiresAt = %d, want %d", s.ExpiresAt, tt.want)
			}
		})
	}
}

// TestApplyExpiry checks the boundary: at ExpiresAt-1 the stored state
// decides, at ExpiresAt a new bucket built from the config passed then,
// whatever the strategy.
func TestApplyExpiry(t *testing.T) {
	old := cfgOf(oneMs.WithBurst(10).WithID("a"))
	up := cfgOf(oneMs.WithBurst(20).WithID("a"))
	initial := cfgOf(oneMs.WithBurst(4).WithInitialTokens(1).WithID("a"))
	initialUp := cfgOf(oneMs.WithBurst(8).WithInitialTokens(2).WithID("a"))
	used4 := step{at: 0, req: consume(6), want: allowed(10, 4, 6, 6000, "a")} // expires at 6000
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{{
		// Full from 4000 on, yet kept until 7000; then new, with 1 token.
		// (A look at 6999 would find it full, and keep it 3000µs more:
		// TestApplyReadOnly.)
		name: "InitialTokens",
		cfg:  initial,
		steps: []step{
			{at: 0, req: consume(1), want: allowed(4, 0, 1, 4000, "a")},
			{at: 7000, req: inspect(), want: allowed(4, 1, 0, 3000, "a")},
			{at: 7000, req: consume(2), want: denied(4, 1, 1000, 3000, "a")},
		},
	}, {
		name: "InitialTokens, a change at ExpiresAt-1",
		cfg:  initial,
		steps: []step{
			{at: 0, req: consume(1), want: allowed(4, 0, 1, 4000, "a")},
			{at: 6999, req: consume(4), want: allowed(4, 0, 4, 4000, "a")},
		},
	}, {
		// At 5999 the 4 tokens left at 0 convert and refill at the new
		// rate to 9.999, and the conversion is kept.
		name: "a config change at ExpiresAt-1",
		cfg:  old,
		steps: []step{
			used4,
			{at: 5999, cfg: &up, req: inspect(), want: allowed(20, 9, 0, 10001, "a")},
			{at: 5999, cfg: &up, req: consume(1), want: allowed(20, 8, 1, 11001, "a")},
		},
	}, {
		name: "a config change at ExpiresAt-1, Additive",
		cfg:  old,
		steps: []step{
			used4,
			{at: 5999, cfg: &up, req: Request{Op: Inspect, Strategy: Additive}, want: allowed(20, 19, 0, 1, "a")},
		},
	}, {
		// At 6000 the old bucket is full, so it is gone, and the upgrade
		// finds the new plan's full capacity, whatever the strategy.
		name: "a config change at ExpiresAt",
		cfg:  old,
		steps: []step{
			used4,
			{at: 6000, cfg: &up, req: Request{Op: Inspect, Strategy: Additive}, want: allowed(20, 20, 0, 0, "a")},
			{at: 6000, cfg: &up, req: Request{Op: Consume, Tokens: 1, Strategy: Proportionally}, want: allowed(20, 19, 1, 1000, "a")},
		},
	}, {
		// At 6999 the old bucket converts: 0 tokens at 0, plus the 4
		// Additive gives, refill to the new capacity, 8.
		name: "a config change with InitialTokens at ExpiresAt-1",
		cfg:  initial,
		steps: []step{
			{at: 0, req: consume(1), want: allowed(4, 0, 1, 4000, "a")},
			{at: 6999, cfg: &initialUp, req: Request{Op: Inspect, Strategy: Additive}, want: allowed(8, 8, 0, 0, "a")},
		},
	}, {
		// Whatever the strategy, an expired bucket starts from the new
		// config's InitialTokens.
		name: "a config change with InitialTokens at ExpiresAt",
		cfg:  initial,
		steps: []step{
			{at: 0, req: consume(1), want: allowed(4, 0, 1, 4000, "a")},
			{at: 7000, cfg: &initialUp, req: Request{Op: Inspect, Strategy: Additive}, want: allowed(8, 2, 0, 6000, "a")},
			{at: 7000, cfg: &initialUp, req: Request{Op: Replace, Strategy: Additive}, want: allowed(8, 2, 0, 6000, "a")},
		},
	}, {
		name: "Replace at ExpiresAt-1 and at ExpiresAt",
		cfg:  old,
		steps: []step{
			used4,
			{at: 5999, req: Request{Op: Replace, Strategy: ResetTokens}, want: allowed(10, 10, 0, 0, "a")},
			{at: 5999, req: consume(10), want: allowed(10, 0, 10, 10000, "a")},
			{at: 15999, cfg: &up, req: Request{Op: Replace, Strategy: AsIs}, want: allowed(20, 20, 0, 0, "a")},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, tt.cfg, tt.steps) })
	}
}

// TestApplyNoLivelock checks why ExpiresAt adds a warm-up: a client that
// asks for the whole capacity of a bucket that starts below it, and comes
// back exactly when RetryAfter says, gets it, and 1µs earlier does not;
// both for the bucket's first fill and for later ones, and again after the
// bucket expired into a new one.
func TestApplyNoLivelock(t *testing.T) {
	for _, cfg := range []Config{
		cfgOf(PerSecond(10).WithInitialTokens(0)),
		cfgOf(PerSecond(3).WithInitialTokens(0)),
		cfgOf(Every(7*us, 3).WithBurst(10).WithInitialTokens(4)),
		cfgOf(Every(1000*us, 5).WithRefill(Interval).WithInitialTokens(0)),
		cfgOf(Every(1000*us, 2).WithBurst(5).WithRefill(Interval).WithInitialTokens(0)),
		cfgOf(Every(1000*us, 2).WithBurst(5).AlignedTo(time.UnixMicro(333)).WithInitialTokens(0)),
		cfgOf(PerSecond(10).WithInitialTokens(0), Every(1000*us, 3).WithBurst(4).WithRefill(Interval).WithInitialTokens(1)),
	} {
		n := cfg.MinCapacity()
		t.Run(describe(cfg), func(t *testing.T) {
			var s State
			now := int64(12345)
			for round := range 6 {
				d := Apply(&s, cfg, consume(n), now)
				if d.Allowed {
					t.Fatalf("round %d: Consume(%d) at %d allowed, want denied", round, n, now)
				}
				wait := int64(d.RetryAfter / us)
				early := cloneState(&s)
				if d := Apply(&early, cfg, consume(n), now+wait-1); d.Allowed {
					t.Fatalf("round %d: Consume(%d) allowed 1µs before RetryAfter %v", round, n, d.RetryAfter)
				}
				now += wait
				if d := Apply(&s, cfg, consume(n), now); !d.Allowed {
					t.Fatalf("round %d: Consume(%d) denied at RetryAfter %v: %+v", round, n, micros(wait), d)
				}
				if round%3 == 2 {
					now = s.ExpiresAt
				}
			}
		})
	}
}
