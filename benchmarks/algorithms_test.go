package benchmarks

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// AlgorithmConfig is the limit of BenchmarkAlgorithms for alg: one that
// admits every call of a run and keeps each key's state stored between its
// calls, as [RedisConfig] does for the token bucket. The token bucket, GCRA
// and the leaky bucket take RedisConfig's bandwidth; the window algorithms a
// day's window, as large as each allows.
func AlgorithmConfig(alg ratelimit.Algorithm) ratelimit.Config {
	bw := RedisConfig().Bandwidths[0]
	switch alg {
	case ratelimit.FixedWindow:
		bw = ratelimit.Every(24*time.Hour, RedisBurst)
	case ratelimit.SlidingWindowLog:
		bw = ratelimit.Every(24*time.Hour, ratelimit.MaxLogCapacity)
	case ratelimit.SlidingWindowCounter:
		// Capacity × a day in µs within 2^53.
		bw = ratelimit.Every(24*time.Hour, 100_000)
	}
	return ratelimit.Config{Algorithm: alg, Bandwidths: []ratelimit.Bandwidth{bw}}
}

// algorithmGoroutines is how many goroutines share BenchmarkAlgorithms's
// calls.
const algorithmGoroutines = 64

// BenchmarkAlgorithms measures decisions of each algorithm against one
// redis-server, through sluice over rueidis, with 64 goroutines over 10k
// keys, on [AlgorithmConfig]. redis_rate (its GCRA script, over go-redis)
// runs in the same process on the same server as the outside baseline.
// The metrics are BenchmarkRedis's.
//
// A sliding log's key holds one entry per decision taken in its day's
// window: a run of N decisions leaves about N/10k in each, so its cost is
// that of a log that long (a few dozen entries at -benchtime 2s).
func BenchmarkAlgorithms(b *testing.B) {
	addr, external := servers.StandaloneAddr(b)
	// redis_rate's client has a connection for each goroutine, as in
	// BenchmarkRedis.
	rdb := redis.NewClient(goredisOptions(addr, algorithmGoroutines))
	b.Cleanup(func() { rdb.Close() })
	ruc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(ruc.Close)
	backend, err := rueidisbackend.New(ruc)
	if err != nil {
		b.Fatal(err)
	}
	keys := makeKeys(redisKeys)
	if external {
		b.Cleanup(func() { deleteKeys(b, rdb, keys) })
	}
	impls := []redisImpl{{"redis_rate", allowRedisRate(rdb)}}
	for alg := range ratelimit.LeakyBucket + 1 {
		impls = append(impls, redisImpl{alg.String(), allowSluice(backend, AlgorithmConfig(alg))})
	}
	for _, im := range impls {
		b.Run("algorithm="+im.name, func(b *testing.B) {
			deleteKeys(b, rdb, keys) // each algorithm starts with no state
			benchDecisions(b, rdb, im.allow, keys, algorithmGoroutines)
		})
	}
}
