// Package benchmarks compares sluice's in-memory limiter with the ways Go
// services limit per key today, in one run on one machine, so that the
// results are ratios rather than absolute numbers from different places.
//
// It is a separate module so that the peers it imports stay out of the
// SDK's go.mod. Run it with
//
//	go test -run='^$' -bench=. -benchmem -count=6 -cpu=1,2 ./...
//
// and compare the implementations with
//
//	benchstat -col '/impl@(xrate sluice sethvargo ulule throttled)' results.txt
//
// docs/benchmarks.md in the SDK explains the cases and records results.
//
// # Redis
//
// BenchmarkRedis compares sluice's two Redis backends (over go-redis and
// over rueidis) with github.com/go-redis/redis_rate/v10 on one
// redis-server: decisions per second and p50/p99 latency at 1 to 256
// goroutines, on 10k keys and on one hot key. Without $SLUICE_REDIS_ADDR it
// starts a redis-server of its own (internal/testkit), so
//
//	go test -run='^$' -bench=BenchmarkRedis .
//
// needs only redis-server on PATH. redis.sh (make bench-redis) runs the
// full comparison: one dedicated server for every round, the server's own
// ceiling for each limiter's script under deep pipelining
// (cmd/redisceiling), the Redis memory of one bucket key
// (cmd/redismemory), and the benchstat tables:
//
//	benchstat -col '/impl@(redis_rate sluice-goredis sluice-rueidis)' redis.txt
//
// [RedisConfig] and [RedisRateLimit] are the limit every Redis benchmark
// decides on.
package benchmarks
