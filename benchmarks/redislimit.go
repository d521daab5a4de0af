package benchmarks

import (
	"time"

	"github.com/go-redis/redis_rate/v10"

	"github.com/sluicehq/sluice/ratelimit"
)

// The Redis benchmarks measure what one decision costs, state update
// included, so every timed decision must be allowed and must find its key's
// state stored. [RedisConfig] and [RedisRateLimit] are one limit for both
// limiters that does that: a burst of RedisBurst, refilled by one token every
// RedisRefillPeriod.
//
// A limit that refills fast (say a million a second) would not do: its
// bucket is full again a microsecond after each decision, so sluice drops
// the key and redis_rate lets it expire, and every decision would create a
// key instead of updating one. Here each decision keeps its key stored for
// another RedisRefillPeriod, longer than any benchmark takes to come back
// to the key, and no run takes RedisBurst decisions on one key.
//
// sluice refills exactly only while capacity × period (in µs) stays within
// 2^51; 3e7 × 6e7 = 1.8e15 does.
const (
	// RedisBurst is the limit's capacity: the decisions a key admits at
	// once.
	RedisBurst = 30_000_000
	// RedisRefillPeriod is the time in which one token returns.
	RedisRefillPeriod = time.Minute
)

// RedisConfig is the limit of the Redis benchmarks for sluice.
func RedisConfig() ratelimit.Config {
	return ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{
		ratelimit.Every(RedisRefillPeriod, 1).WithBurst(RedisBurst),
	}}
}

// RedisRateLimit is the limit of the Redis benchmarks for
// github.com/go-redis/redis_rate/v10: the same burst and rate as
// [RedisConfig].
func RedisRateLimit() redis_rate.Limit {
	return redis_rate.Limit{Rate: 1, Period: RedisRefillPeriod, Burst: RedisBurst}
}
