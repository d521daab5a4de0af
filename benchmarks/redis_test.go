package benchmarks

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/ratelimit"
)

// redisKeys is how many distinct keys the many-key cases cycle through.
const redisKeys = 10_000

// warmGoroutines make the untimed first decision on every key: enough to
// fill go-redis's pool and rueidis's pipeline before the timer starts.
const warmGoroutines = 64

// redisRatePrefix is the prefix redis_rate puts before every key (its
// unexported redisPrefix).
const redisRatePrefix = "rate:"

// BenchmarkRedis measures decisions against one redis-server, for sluice
// over go-redis, sluice over rueidis and github.com/go-redis/redis_rate/v10,
// all on the same limit ([RedisConfig], [RedisRateLimit]) that admits every
// call, so each call is one script run that reads and rewrites its key.
//
// Names are keys=10k|1/goroutines=1|16|64|256/impl=NAME. Exactly that many
// goroutines share the b.N calls (not b.RunParallel, whose goroutine count
// is a multiple of GOMAXPROCS); call i is on key i mod the key count, so
// keys=10k walks the keys round robin and keys=1 is one hot key. Each sub-
// benchmark first makes one untimed decision on every key the timed calls
// will use, which loads the script and stores the keys.
//
// Besides sec/op it reports decisions/s, the p50 and p99 latency of one
// call (p50-µs, p99-µs), and the CPU time per decision of this process
// (client-µs/op, every goroutine of it) and of the server (server-µs/op,
// from INFO cpu, so other load on a shared server counts too).
//
// The server is $SLUICE_REDIS_ADDR when set (benchmarks/redis.sh sets it, so
// that every round and the ceilings use one server), and otherwise a
// redis-server this benchmark starts and kills.
func BenchmarkRedis(b *testing.B) {
	addr, external := testkit.StandaloneAddr(b)
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	b.Cleanup(func() { rdb.Close() })
	impls := redisImpls(b, addr, rdb)

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
		for _, g := range []int{1, 16, 64, 256} {
			for _, im := range impls {
				name := "keys=" + ks.name + "/goroutines=" + strconv.Itoa(g) + "/impl=" + im.name
				b.Run(name, func(b *testing.B) {
					benchDecisions(b, rdb, im.allow, ks.keys, g)
				})
			}
		}
	}
}

// redisImpl is one limiter under test; allow makes one decision on the
// limit of the Redis benchmarks.
type redisImpl struct {
	name  string
	allow allowFunc
}

// redisImpls builds the limiters: redis_rate and sluice over go-redis share
// rdb, the client sluice's package comment recommends (no retries, the
// context's deadline obeyed) with go-redis's default pool; sluice over
// rueidis gets a rueidis client with rueidis's defaults but for client-side
// caching, which a script call cannot use. redis_rate is first: it is the
// baseline benchstat compares against.
func redisImpls(b *testing.B, addr string, rdb *redis.Client) []redisImpl {
	ruc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(ruc.Close)

	goredisBackend, err := redisbackend.New(rdb)
	if err != nil {
		b.Fatal(err)
	}
	rueidisBackend, err := rueidisbackend.New(ruc)
	if err != nil {
		b.Fatal(err)
	}
	return []redisImpl{
		{"redis_rate", allowRedisRate(rdb)},
		{"sluice-goredis", allowSluice(goredisBackend)},
		{"sluice-rueidis", allowSluice(rueidisBackend)},
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

// allowSluice is sluice's public path, ratelimit.New(backend).Allow, with a
// config built once.
func allowSluice(backend ratelimit.Backend) allowFunc {
	lim := ratelimit.New(backend)
	cfg := RedisConfig()
	return func(ctx context.Context, key string) (bool, error) {
		d, err := lim.Allow(ctx, key, cfg)
		return d.Allowed, err
	}
}

// benchDecisions times b.N decisions by goroutines goroutines and reports
// the metrics BenchmarkRedis describes.
func benchDecisions(b *testing.B, rdb *redis.Client, allow allowFunc, keys []string, goroutines int) {
	ctx := context.Background()
	// Only the keys the timed calls reach are stored first, so that a
	// smoke run with -benchtime=1x makes a handful of calls, not 10k.
	warm := keys[:min(b.N, len(keys))]
	if err := decide(ctx, allow, warm, min(warmGoroutines, len(warm)), len(warm), nil); err != nil {
		b.Fatal(err)
	}
	latencies := make([]time.Duration, b.N)
	before := readCPU(ctx, b, rdb)

	b.ReportAllocs()
	b.ResetTimer()
	err := decide(ctx, allow, keys, goroutines, b.N, latencies)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}

	after := readCPU(ctx, b, rdb)
	perOp := func(d time.Duration) float64 { return micros(d) / float64(b.N) }
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	slices.Sort(latencies)
	b.ReportMetric(micros(percentile(latencies, 0.50)), "p50-µs")
	b.ReportMetric(micros(percentile(latencies, 0.99)), "p99-µs")
	b.ReportMetric(perOp(after.client-before.client), "client-µs/op")
	b.ReportMetric(perOp(after.server-before.server), "server-µs/op")
}

// decide makes n decisions with exactly goroutines goroutines, which take
// the calls in turn from one counter: call i is on keys[i%len(keys)] and,
// when latencies is not nil, stores its latency in latencies[i] (so the
// slice is allocated once, before the timer starts). Every call must be
// allowed; the first error or denial stops all goroutines and is returned.
func decide(ctx context.Context, allow allowFunc, keys []string, goroutines, n int, latencies []time.Duration) error {
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	end, nkeys := int64(n), int64(len(keys))
	for range goroutines {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= end {
					return
				}
				key := keys[i%nkeys]
				start := time.Now()
				ok, err := allow(ctx, key)
				if latencies != nil {
					latencies[i] = time.Since(start)
				}
				if err == nil && !ok {
					err = fmt.Errorf("decision on %q denied; the benchmark's limit must admit every call", key)
				}
				if err != nil {
					once.Do(func() { first = err })
					next.Store(end) // the others stop at their next call
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// percentile returns the p-quantile of sorted by the nearest-rank method.
func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// cpuTimes are the CPU time used so far by this process and by the server.
type cpuTimes struct{ client, server time.Duration }

func readCPU(ctx context.Context, b *testing.B, rdb *redis.Client) cpuTimes {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	return cpuTimes{client: processCPU(), server: serverCPU(b, info)}
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
		redisKeys := make([]string, 0, 2*len(chunk))
		for _, k := range chunk {
			redisKeys = append(redisKeys, redisscript.Key(redisbackend.DefaultPrefix, k), redisRatePrefix+k)
		}
		if err := rdb.Del(ctx, redisKeys...).Err(); err != nil {
			b.Errorf("delete the benchmark's keys: %v", err)
			return
		}
	}
}
