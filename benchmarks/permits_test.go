package benchmarks

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/backend/memory"
	redisbackend "github.com/sluicehq/sluice/backend/redis"
	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// permitLimit is the concurrency limit of BenchmarkPermits: more than its
// goroutines, so that every acquire is granted and each pair of calls
// reads and rewrites the key's state.
var permitLimit = ratelimit.InFlight(1024, time.Minute)

// counterPrefix is the hand-made semaphore's key prefix.
const counterPrefix = "sem:"

// BenchmarkPermits measures concurrency permits: each op is a TryAcquire
// and the permit's Release, two calls to the store, on [permitLimit]. The
// baselines, in the same run on the same server:
//
//   - memory-allow, goredis-allow, rueidis-allow: sluice's rate decision
//     (Limiter.Allow, a token bucket that admits every call) on the same
//     backend, one call a decision;
//   - counter: the semaphore services commonly write by hand, an INCR that
//     a DECR undoes when over the limit and on release (two round trips
//     per op, like sluice's), over go-redis. It is not crash-safe: a
//     holder that dies keeps its permit for ever, which is what sluice's
//     leases cost against it.
//
// Names are keys=10k|1/goroutines=16|64/impl=NAME, with the metrics of
// [timeDecisions] (a "decision" here is an op). The Redis server is
// $SLUICE_REDIS_ADDR when set, else one the benchmark starts.
func BenchmarkPermits(b *testing.B) {
	addr, external := servers.StandaloneAddr(b)
	rdb := redis.NewClient(goredisOptions(addr, 1))
	b.Cleanup(func() { rdb.Close() })
	keySets := []struct {
		name string
		keys []string
	}{
		{"10k", makeKeys(redisKeys)},
		{"1", makeKeys(1)},
	}
	if external {
		b.Cleanup(func() {
			for _, ks := range keySets {
				deleteKeys(b, rdb, ks.keys)
			}
		})
	}
	for _, ks := range keySets {
		b.Run("keys="+ks.name, func(b *testing.B) {
			for _, g := range []int{16, 64} {
				b.Run("goroutines="+strconv.Itoa(g), func(b *testing.B) {
					for _, im := range permitImpls(b, addr, g) {
						b.Run("impl="+im.name, func(b *testing.B) {
							benchDecisions(b, rdb, im.allow, ks.keys, g)
						})
					}
				})
			}
		})
	}
}

// permitImpls builds the implementations for goroutines goroutines, with
// clients as [redisImpls] builds them.
func permitImpls(b *testing.B, addr string, goroutines int) []redisImpl {
	rdb := redis.NewClient(goredisOptions(addr, goroutines))
	b.Cleanup(func() { rdb.Close() })
	ruc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(ruc.Close)
	mem := memory.New()
	b.Cleanup(func() { mem.Close() })
	goredis := must(redisbackend.New(rdb))(b)
	rue := must(rueidisbackend.New(ruc))(b)
	cfg := RedisConfig()
	return []redisImpl{
		{"memory-allow", allowSluice(mem, cfg)},
		{"memory-permit", acquireRelease(mem)},
		{"goredis-allow", allowSluice(goredis, cfg)},
		{"goredis-permit", acquireRelease(goredis)},
		{"rueidis-allow", allowSluice(rue, cfg)},
		{"rueidis-permit", acquireRelease(rue)},
		{"counter", counterSemaphore(rdb)},
	}
}

// acquireRelease is sluice's public path: Limiter.TryAcquire, then the
// permit's Release.
func acquireRelease(backend ratelimit.Backend) allowFunc {
	lim := ratelimit.New(backend)
	return func(ctx context.Context, key string) (bool, error) {
		p, _, err := lim.TryAcquire(ctx, key, permitLimit, 1)
		if err != nil || p == nil {
			return false, err
		}
		return true, p.Release(ctx)
	}
}

// counterSemaphore is the hand-made semaphore BenchmarkPermits describes.
func counterSemaphore(rdb *redis.Client) allowFunc {
	return func(ctx context.Context, key string) (bool, error) {
		n, err := rdb.Incr(ctx, counterPrefix+key).Result()
		if err != nil {
			return false, err
		}
		err = rdb.Decr(ctx, counterPrefix+key).Err()
		if n > permitLimit.Limit {
			return false, errors.Join(errors.New("over the limit"), err)
		}
		return true, err
	}
}
