package benchmarks

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/throttled/throttled/v2/store/goredisstore.v9"
	ulule "github.com/ulule/limiter/v3"
	ululeredis "github.com/ulule/limiter/v3/drivers/store/redis"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/benchmarks/internal/measure"
	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

// redisKeys is how many distinct keys the many-key cases cycle through.
const redisKeys = 10_000

// warmGoroutines make the untimed first decision on every key, or as many
// as the timed calls use when that is more: so that go-redis's pool has
// dialled its connections and rueidis's pipeline is up before the timer
// starts.
const warmGoroutines = 64

// poolSlack is how many go-redis connections each client has beyond one per
// goroutine, so that no timed call waits for a connection.
const poolSlack = 4

// The prefixes before the user key of each limiter's Redis key.
const (
	// redisRatePrefix is redis_rate's (its unexported redisPrefix).
	redisRatePrefix = "rate:"
	// gcraPrefix is sluice's for GCRA, so that its buckets are not the
	// token buckets of the same user keys.
	gcraPrefix = "gcra:"
	// throttledPrefix is throttled's, as in its goredisstore example.
	throttledPrefix = "throttled:"
	// ululePrefix is ulule's default, limiter.DefaultPrefix, and the
	// colon its store puts after it.
	ululePrefix = ulule.DefaultPrefix + ":"
)

// redisLimit is the limit of the Redis benchmarks for the peers that take
// a [limit]: the same as [RedisConfig].
var redisLimit = limit{Burst: RedisBurst, Refill: 1, Period: RedisRefillPeriod}

// BenchmarkRedis measures decisions against one redis-server, all on the
// same limit that admits every call ([RedisConfig], [RedisRateLimit],
// [redisLimit]), so each call reads and rewrites its key:
//
//   - redis_rate: github.com/go-redis/redis_rate/v10's Allow (GCRA, one
//     script call);
//   - sluice-goredis, sluice-rueidis: sluice's token bucket over go-redis
//     and over rueidis; sluice-goredis-gcra, sluice-rueidis-gcra: its GCRA
//     (one script call each);
//   - throttled: github.com/throttled/throttled/v2's GCRA on its go-redis v9
//     store (goredisstore.v9): a pipelined TIME and GET, then a
//     compare-and-swap script, so two round trips a decision;
//   - ulule: github.com/ulule/limiter/v3's fixed window on its Redis store
//     (one script call), Burst calls per window.
//
// Names are keys=10k|1/goroutines=1|16|64|256/impl=NAME. Exactly that many
// goroutines share the b.N calls; call i is on key i mod the key count, so
// keys=10k walks the keys round robin and keys=1 is one hot key. Each sub-
// benchmark first makes one untimed decision on every key the timed calls
// will use, which loads the script and stores the keys, and checks every
// call's outcome, so a peer configured differently fails rather than
// measuring another path.
//
// Every library gets its best documented client settings. go-redis's
// default pool (10 connections per GOMAXPROCS) would make most of 256
// goroutines queue for a connection, so each goroutines=N sub-benchmark
// builds its own go-redis client with PoolSize N+4 (closed when it ends),
// which the go-redis limiters share; rueidis keeps its defaults, which
// pipeline every goroutine's calls onto one connection (auto-pipelining).
//
// Besides sec/op it reports decisions/s and the p50, p99 and p99.9 latency
// of one call ([timeDecisions]), and the CPU time per decision of this
// process (client-µs/op, every goroutine of it) and of the server
// (server-µs/op, from INFO cpu, so other load on a shared server counts
// too).
//
// The server is $SLUICE_REDIS_ADDR when set (benchmarks/redis.sh and
// peers.sh set it, so that every round and the ceilings use one server),
// and otherwise a redis-server this benchmark starts and kills.
func BenchmarkRedis(b *testing.B) {
	addr, external := servers.StandaloneAddr(b)
	// rdb reads INFO cpu and deletes the keys; the limiters have clients
	// of their own.
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
		// Another run on this server must find no state of this one:
		// a key that kept its tokens taken would admit fewer calls.
		b.Cleanup(func() {
			for _, ks := range keySets {
				deleteKeys(b, rdb, ks.keys)
			}
		})
	}
	for _, ks := range keySets {
		b.Run("keys="+ks.name, func(b *testing.B) {
			for _, g := range goroutineCounts {
				b.Run("goroutines="+strconv.Itoa(g), func(b *testing.B) {
					for _, im := range redisImpls(b, addr, g) {
						b.Run("impl="+im.name, func(b *testing.B) {
							benchDecisions(b, rdb, im.allow, ks.keys, g)
						})
					}
				})
			}
		})
	}
}

// goredisOptions are the go-redis options sluice's package comment
// recommends (no retries, the context's deadline obeyed), with a pool of
// one connection per goroutine and [poolSlack] more.
func goredisOptions(addr string, goroutines int) *redis.Options {
	return &redis.Options{
		Addr:                  addr,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
		PoolSize:              goroutines + poolSlack,
	}
}

// redisImpl is one limiter under test; allow makes one decision on the
// limit of the Redis benchmarks.
type redisImpl struct {
	name  string
	allow allowFunc
}

// redisImpls builds the limiters for goroutines goroutines, with clients
// that b's end closes: the go-redis limiters share one go-redis client
// ([goredisOptions]); sluice over rueidis gets a rueidis client with
// rueidis's defaults but for client-side caching, which a script call cannot
// use. redis_rate is first: it is the baseline benchstat compares against.
func redisImpls(b *testing.B, addr string, goroutines int) []redisImpl {
	rdb := redis.NewClient(goredisOptions(addr, goroutines))
	b.Cleanup(func() { rdb.Close() })
	ruc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(ruc.Close)

	tokenBucket, gcra := AlgorithmConfig(ratelimit.TokenBucket), AlgorithmConfig(ratelimit.GCRA)
	return []redisImpl{
		{"redis_rate", allowRedisRate(rdb)},
		{"sluice-goredis", allowSluice(must(redisbackend.New(rdb))(b), tokenBucket)},
		{"sluice-rueidis", allowSluice(must(rueidisbackend.New(ruc))(b), tokenBucket)},
		{"sluice-goredis-gcra", allowSluice(must(redisbackend.New(rdb, redisbackend.WithPrefix(gcraPrefix)))(b), gcra)},
		{"sluice-rueidis-gcra", allowSluice(must(rueidisbackend.New(ruc, rueidisbackend.WithPrefix(gcraPrefix)))(b), gcra)},
		{"throttled", allowThrottledRedis(b, rdb)},
		{"ulule", allowUluleRedis(b, rdb)},
	}
}

// must returns a function that returns v, or fails b with err.
func must[T any](v T, err error) func(b *testing.B) T {
	return func(b *testing.B) T {
		if err != nil {
			b.Fatal(err)
		}
		return v
	}
}

// allowRedisRate is redis_rate's Allow on [RedisRateLimit] through rdb.
func allowRedisRate(rdb *redis.Client) allowFunc {
	rl := redis_rate.NewLimiter(rdb)
	limit := RedisRateLimit()
	return func(ctx context.Context, key string) (bool, error) {
		res, err := rl.Allow(ctx, key, limit)
		if err != nil {
			return false, err
		}
		return res.Allowed == 1, nil
	}
}

// allowSluice is sluice's public path, ratelimit.New(backend).Allow, with
// cfg built once.
func allowSluice(backend ratelimit.Backend, cfg ratelimit.Config) allowFunc {
	lim := ratelimit.New(backend)
	return func(ctx context.Context, key string) (bool, error) {
		d, err := lim.Allow(ctx, key, cfg)
		return d.Allowed, err
	}
}

// allowThrottledRedis is throttled's GCRA limiter on [redisLimit] over its
// go-redis v9 store, with the CAS attempts raised as in [startThrottled]:
// on one hot key many goroutines' swaps conflict.
func allowThrottledRedis(b *testing.B, rdb *redis.Client) allowFunc {
	store := must(goredisstore.NewCtx(rdb, throttledPrefix))(b)
	return throttledAllow(b, store, redisLimit)
}

// allowUluleRedis is ulule's limiter on [redisLimit] over its Redis store
// with its defaults (limiter.DefaultPrefix), as [startUlule] has it in
// memory.
func allowUluleRedis(b *testing.B, rdb *redis.Client) allowFunc {
	return ululeAllow(must(ululeredis.NewStore(rdb))(b), redisLimit)
}

// benchDecisions makes the untimed first decisions, then times b.N
// decisions by goroutines goroutines and reports the metrics BenchmarkRedis
// describes.
func benchDecisions(b *testing.B, rdb *redis.Client, allow allowFunc, keys []string, goroutines int) {
	ctx := context.Background()
	// Only the keys the timed calls reach are stored first, so that a
	// smoke run with -benchtime=1x makes a handful of calls, not 10k.
	warm := keys[:min(b.N, len(keys))]
	warmers := max(warmGoroutines, goroutines)
	if err := decide(ctx, allow, warm, warmers, max(len(warm), warmers), true, nil); err != nil {
		b.Fatal(err)
	}
	before := readCPU(ctx, b, rdb)
	timeDecisions(b, allow, keys, goroutines, true)
	after := readCPU(ctx, b, rdb)
	perOp := func(d time.Duration) float64 { return micros(d) / float64(b.N) }
	b.ReportMetric(perOp(after.client-before.client), "client-µs/op")
	b.ReportMetric(perOp(after.server-before.server), "server-µs/op")
}

// cpuTimes are the CPU time used so far by this process and by the server.
type cpuTimes struct{ client, server time.Duration }

func readCPU(ctx context.Context, b *testing.B, rdb *redis.Client) cpuTimes {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	return cpuTimes{client: measure.ProcessCPU(), server: serverCPU(b, info)}
}

// serverCPU adds the user and system CPU time of the server's main process
// (all its threads) from the reply to INFO cpu.
func serverCPU(b *testing.B, info string) time.Duration {
	var total time.Duration
	for _, field := range []string{"used_cpu_user:", "used_cpu_sys:"} {
		_, rest, ok := strings.Cut(info, "\n"+field)
		if !ok {
			b.Fatalf("INFO cpu has no %s:\n%s", field, info)
		}
		value, _, _ := strings.Cut(rest, "\r")
		secs, err := strconv.ParseFloat(value, 64)
		if err != nil {
			b.Fatalf("INFO cpu %s%s: %v", field, value, err)
		}
		total += time.Duration(secs * float64(time.Second))
	}
	return total
}

// deleteKeys deletes every Redis key that the limiters under test keep for
// keys, with one DEL for each thousand of them.
func deleteKeys(b *testing.B, rdb *redis.Client, keys []string) {
	ctx := context.Background()
	for chunk := range slices.Chunk(keys, 1000) {
		redisKeys := make([]string, 0, 6*len(chunk))
		for _, k := range chunk {
			redisKeys = append(redisKeys,
				redisscript.Key(redisbackend.DefaultPrefix, k), redisscript.Key(gcraPrefix, k),
				redisRatePrefix+k, throttledPrefix+k, ululePrefix+k, counterPrefix+k)
		}
		if err := rdb.Del(ctx, redisKeys...).Err(); err != nil {
			b.Errorf("delete the benchmark's keys: %v", err)
			return
		}
	}
}
