package redistest

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// Advance moves the clock, in µs: mostly a little; with big, sometimes far
// ahead and now and then back; always within 0 and 2^52.
func Advance(r *rand.Rand, now int64, big bool) int64 {
	switch k := r.IntN(10); {
	case k < 4:
		now += r.Int64N(60)
	case k < 5:
		now += r.Int64N(400)
	case k < 6 && big:
		now += r.Int64N(1 << 50)
	case k < 7 && big:
		now -= r.Int64N(1 << 30)
	}
	return min(max(now, 0), 1<<52-1)
}

// RandConfig returns a valid config for alg of 1 to 3 bandwidths of every
// kind alg takes: small numbers that refill within a few steps, or (big)
// numbers near the limits of the accepted range, where Lua's doubles would
// first go wrong.
func RandConfig(r *rand.Rand, alg ratelimit.Algorithm, big bool) ratelimit.Config {
	for {
		cfg := ratelimit.Config{Algorithm: alg}
		ids := []string{"", "", "a", "b", "c"}
		for range 1 + r.IntN(3) {
			id := ids[r.IntN(len(ids))]
			for _, b := range cfg.Bandwidths {
				if b.ID == id {
					id = ""
				}
			}
			b := ratelimit.Bandwidth{ID: id, Refill: ratelimit.RefillKind(r.IntN(3))}
			period := 1 + r.Int64N(40)
			b.Capacity = 1 + r.Int64N(8)
			if big {
				period = 1 + r.Int64N(int64(ratelimit.MaxRefillPeriod/time.Microsecond))
				b.Capacity = 1 + r.Int64N(ratelimit.MaxCapacity)>>r.IntN(50)
			}
			b.RefillPeriod = time.Duration(period) * time.Microsecond
			b.RefillTokens = 1 + r.Int64N(period)>>r.IntN(40)
			if b.Refill == ratelimit.IntervalAligned {
				b.AlignedStart = time.UnixMicro(r.Int64N(1 << 51))
			}
			if r.IntN(3) == 0 {
				b = b.WithInitialTokens(r.Int64N(b.Capacity + 1))
			}
			cfg.Bandwidths = append(cfg.Bandwidths, fitBandwidth(r, alg, b))
		}
		if cfg.Validate() == nil {
			return cfg
		}
	}
}

// RandVersions gives half the time each config a random version from 0 to
// 2, so that sequences switching between them run into buckets built for
// a later version than the call's (see [ratelimit.Config.Version]).
func RandVersions(r *rand.Rand, cfgs []ratelimit.Config) {
	if r.IntN(2) == 0 {
		return
	}
	for i := range cfgs {
		cfgs[i].Version = r.Uint64N(3)
	}
}

// fitBandwidth bends a random token-bucket bandwidth into one alg takes.
func fitBandwidth(r *rand.Rand, alg ratelimit.Algorithm, b ratelimit.Bandwidth) ratelimit.Bandwidth {
	switch alg {
	case ratelimit.GCRA, ratelimit.LeakyBucket:
		b.Refill, b.AlignedStart = ratelimit.Greedy, time.Time{}
	case ratelimit.FixedWindow, ratelimit.SlidingWindowLog, ratelimit.SlidingWindowCounter:
		if alg != ratelimit.FixedWindow || b.Refill != ratelimit.IntervalAligned {
			b.Refill, b.AlignedStart = ratelimit.Greedy, time.Time{}
		}
		b.InitialTokens = nil
		period := b.PeriodMicros()
		switch alg {
		case ratelimit.SlidingWindowLog:
			// Logs of a few hundred entries: the cap is about memory, not math.
			b.Capacity = 1 + b.Capacity%min(period, 300)
		case ratelimit.SlidingWindowCounter:
			b.Capacity = 1 + b.Capacity%min(period, (1<<53)/period)
		default:
			b.Capacity = 1 + b.Capacity%period
		}
		b.RefillTokens = b.Capacity
	}
	return b
}

// RandRequest returns a valid request for cfg, mostly ones that take.
func RandRequest(r *rand.Rand, cfg ratelimit.Config) ratelimit.Request {
	limit := int64(ratelimit.MaxCapacity)
	for _, b := range cfg.Bandwidths {
		limit = min(limit, b.Capacity)
	}
	req := ratelimit.Request{Tokens: 1 + r.Int64N(limit)>>r.IntN(50), Strategy: ratelimit.Inheritance(r.IntN(4))}
	switch k := r.IntN(20); {
	case k < 6:
		req.Op = ratelimit.Consume
	case k < 8:
		req.Op = ratelimit.Estimate
	case k < 11:
		req.Op = ratelimit.Reserve
		req.MaxWait = time.Duration(r.Int64N(200)) * time.Microsecond
		switch r.IntN(6) {
		case 0:
			req.MaxWait = time.Duration(math.MaxInt64)
		case 1:
			req.MaxWait = time.Duration(r.Int64N(math.MaxInt64))
		}
	case k < 13:
		req.Op = ratelimit.ConsumeUpTo
		if r.IntN(4) == 0 {
			req.Tokens = math.MaxInt64
		}
	case k < 15:
		req.Op = ratelimit.Add
		if r.IntN(4) == 0 {
			req.Tokens = math.MaxInt64 - r.Int64N(3)
		}
	case k < 16:
		req.Op = ratelimit.Reset
	case k < 17:
		req.Op = ratelimit.Replace
	default:
		req.Op = ratelimit.Inspect
	}
	if !cfg.Algorithm.Supports(req.Op) {
		req.Op, req.MaxWait = ratelimit.Consume, 0
	}
	return req
}
