// Package benchmarks compares sluice with the ways Go services limit per
// key today, in memory and on Redis, in one run on one machine, so that the
// results are ratios rather than absolute numbers from different places.
//
// It is a separate module so that the peers it imports stay out of the
// SDK's go.mod. Every benchmark runs through each library's public API,
// gives every library the same limit, stores every key's state before the
// timer starts, and checks each call's outcome, so that a peer configured
// differently fails rather than measuring another path.
//
// # The published comparison
//
// peers.sh (make bench-peers) runs the whole comparison on one redis-server
// of its own in under ten minutes, and cmd/benchreport writes
// docs/benchmarks.md from its raw results: the tables, the machine, the
// commit, the command, and plots of decisions/s against goroutines and of
// latency percentiles. It runs
//
//   - BenchmarkAllowGoroutines: the in-memory libraries (sluice's memory
//     backend, one x/time/rate Limiter per key, sethvargo/go-limiter,
//     ulule/limiter, throttled) at exactly 1, 16, 64 and 256 goroutines:
//     decisions/s and p50/p99/p99.9 latency;
//   - BenchmarkKeyMemory: the heap each of them holds per key;
//   - BenchmarkRedis: sluice's token bucket and GCRA over go-redis and over
//     rueidis, github.com/go-redis/redis_rate/v10, and throttled's and
//     ulule's Redis stores, at the same goroutine counts, with the client's
//     and the server's CPU time per decision;
//   - cmd/redisceiling, the server's own ceiling for a limiter's script
//     under deep pipelining, and cmd/redismemory, the Redis memory of one
//     bucket key;
//   - cmd/scaleplan, the figures docs/scale.md budgets from: Redis memory
//     per key over a million keys, bytes on the wire and replicated per
//     decision, server and client CPU per decision, what a full master
//     returns, and the memory backend's bytes per key.
//
// Without $SLUICE_REDIS_ADDR the Redis benchmarks start a redis-server of
// their own (internal/test/servers), so
//
//	go test -run='^$' -bench='BenchmarkRedis/keys=10k' .
//
// needs only redis-server on PATH.
//
// # Other runs
//
// BenchmarkAllow times the in-memory libraries in ns/op, serial and under
// b.RunParallel, and BenchmarkParallelCeiling the best parallel speed-up
// of the machine; run.sh (make bench) compares them over six interleaved
// rounds with benchstat:
//
//	benchstat -col '/impl@(xrate sluice sethvargo ulule throttled)' peers.txt
//
// redis.sh (make bench-redis) repeats BenchmarkRedis and the ceilings in six
// rounds for benchstat, and algorithms.sh (make bench-algorithms) measures
// each of sluice's algorithms on Redis (BenchmarkAlgorithms).
//
// [RedisConfig] and [RedisRateLimit] are the limit every Redis benchmark
// decides on.
package benchmarks
