package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/ratelimit"
)

// memoryUsageSamples is how many keys' MEMORY USAGE redis-memory averages.
const memoryUsageSamples = 1000

// warmKey is the user key of the decision that loads sluice's Redis
// Function before redis-memory reads used_memory, so that the library's
// memory is not counted as the keys'.
const warmKey = "scaleplan:warm"

// rssPeriod is how often redis-server samples its RSS for INFO memory's
// used_memory_rss (its cron's 100 ms), with a margin.
const rssPeriod = 200 * time.Millisecond

// measureRedisMemory prints what f.n keys of cfg cost the server at rdb.
func measureRedisMemory(ctx context.Context, f flags, rdb *redis.Client, cluster bool, cfg ratelimit.Config) error {
	if err := requireEmpty(ctx, rdb); err != nil {
		return err
	}
	backend, err := redisbackend.New(rdb)
	if err != nil {
		return err
	}
	lim := ratelimit.New(backend)
	if _, err := lim.Allow(ctx, warmKey, cfg); err != nil {
		return err
	}
	if err := rdb.Del(ctx, redisKey(warmKey)).Err(); err != nil {
		return err
	}
	if err := sleep(ctx, rssPeriod); err != nil {
		return err
	}
	before, err := readInfo(ctx, rdb, "memory")
	if err != nil {
		return err
	}
	defer func() {
		if err := deleteKeys(context.WithoutCancel(ctx), rdb, f, f.n); err != nil {
			log.Printf("scaleplan: %v", err)
		}
	}()
	took, err := drive(f.n, f.goroutines, func(i int) error {
		key := f.userKey(i)
		d, err := lim.Allow(ctx, key, cfg)
		return allowed(d, err, key)
	})
	if err != nil {
		return err
	}
	// Let the server finish rehashing its hash tables, which it does a step
	// a command and a step a cron tick.
	if err := sleep(ctx, f.settle); err != nil {
		return err
	}
	after, err := readInfo(ctx, rdb, "memory")
	if err != nil {
		return err
	}
	dbsize, err := rdb.DBSize(ctx).Result()
	if err != nil {
		return err
	}
	usage, err := meanMemoryUsage(ctx, rdb, f)
	if err != nil {
		return err
	}
	first := redisKey(f.userKey(0))
	strlen, err := rdb.StrLen(ctx, first).Result()
	if err != nil {
		return err
	}
	used, err := delta(before, after, "used_memory")
	if err != nil {
		return err
	}
	rss, err := delta(before, after, "used_memory_rss")
	if err != nil {
		return err
	}
	fmt.Printf("cluster=%v config=%s keys=%d dbsize=%d write=%.1fs key=%q value=%dB MEMORY_USAGE=%.1fB used_memory_delta=%.0fB per_key=%.1fB rss_per_key=%.1fB\n",
		cluster, f.config, f.n, dbsize, took.Seconds(), first, strlen, usage,
		used, used/float64(dbsize), rss/float64(dbsize))
	return nil
}

// meanMemoryUsage is the mean MEMORY USAGE (SAMPLES 0) of up to
// memoryUsageSamples buckets spread evenly over the f.n keys.
func meanMemoryUsage(ctx context.Context, rdb *redis.Client, f flags) (float64, error) {
	samples := min(memoryUsageSamples, f.n)
	var sum int64
	for i := range samples {
		key := redisKey(f.userKey(i * (f.n / samples)))
		u, err := rdb.MemoryUsage(ctx, key, 0).Result()
		if err != nil {
			return 0, fmt.Errorf("MEMORY USAGE %s: %w", key, err)
		}
		sum += u
	}
	return float64(sum) / float64(samples), nil
}

// delta is the field name of after less before's.
func delta(before, after info, name string) (float64, error) {
	b, err := before.number(name)
	if err != nil {
		return 0, err
	}
	a, err := after.number(name)
	return a - b, err
}
