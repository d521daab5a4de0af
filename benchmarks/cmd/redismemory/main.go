// Command redismemory prints what one rate-limited user costs in Redis: the
// key each limiter stores for the user key user:12345 after one allowed
// decision, its value's length (STRLEN) and MEMORY USAGE ... SAMPLES 0, for
// sluice with one bandwidth, sluice with two, and
// github.com/go-redis/redis_rate/v10, all on one server in one run. A second
// table gives, for each of sluice's algorithms, MEMORY USAGE after one
// request and at the limit (every request of the window taken).
//
// Usage:
//
//	go run ./cmd/redismemory [-addr 127.0.0.1:6379]
//
// The address defaults to $SLUICE_REDIS_ADDR. It deletes the keys it
// measures (before and after each case, so each case starts from no state),
// and touches no others.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"text/tabwriter"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

// userKey is the user key of every case.
const userKey = "user:12345"

// bucket is one case: a limiter, the limit it is given, and the Redis key it
// keeps for userKey.
type bucket struct {
	limiter, limit, redisKey string
	allow                    func(ctx context.Context) error
}

func main() {
	addr := flag.String("addr", os.Getenv("SLUICE_REDIS_ADDR"), "address of the redis-server")
	flag.Parse()
	if *addr == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	rdb := redis.NewClient(&redis.Options{Addr: *addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	defer rdb.Close()
	buckets, err := cases(rdb)
	if err != nil {
		log.Fatalf("redismemory: %v", err)
	}
	if err := measure(context.Background(), rdb, buckets); err != nil {
		log.Fatalf("redismemory: %v", err)
	}
	fmt.Println()
	if err := measureAlgorithms(context.Background(), rdb); err != nil {
		log.Fatalf("redismemory: %v", err)
	}
}

func cases(rdb *redis.Client) ([]bucket, error) {
	backend, err := redisbackend.New(rdb)
	if err != nil {
		return nil, err
	}
	lim := ratelimit.New(backend)
	sluice := func(limit string, bws ...ratelimit.Bandwidth) bucket {
		cfg := ratelimit.Config{Bandwidths: bws}
		return bucket{
			limiter:  "sluice",
			limit:    limit,
			redisKey: redisscript.Key(redisbackend.DefaultPrefix, userKey),
			allow: func(ctx context.Context) error {
				d, err := lim.Allow(ctx, userKey, cfg)
				return allowed(d.Allowed, err)
			},
		}
	}
	rl := redis_rate.NewLimiter(rdb)
	return []bucket{
		sluice("PerSecond(100)", ratelimit.PerSecond(100)),
		sluice(`PerSecond(10).WithBurst(20) "burst" + PerHour(1000) "hourly"`,
			ratelimit.PerSecond(10).WithBurst(20).WithID("burst"),
			ratelimit.PerHour(1000).WithID("hourly")),
		{
			limiter: "redis_rate",
			limit:   "PerSecond(100)",
			// redis_rate's unexported redisPrefix.
			redisKey: "rate:" + userKey,
			allow: func(ctx context.Context) error {
				res, err := rl.Allow(ctx, userKey, redis_rate.PerSecond(100))
				if err != nil {
					return err
				}
				return allowed(res.Allowed == 1, nil)
			},
		},
	}, nil
}

func allowed(ok bool, err error) error {
	if err == nil && !ok {
		err = fmt.Errorf("the first decision on %s was denied", userKey)
	}
	return err
}

// measure runs each case on a key with no state and prints a table.
func measure(ctx context.Context, rdb *redis.Client, buckets []bucket) error {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "limiter\tlimit\tRedis key\tvalue bytes\tMEMORY USAGE bytes\t")
	for _, bk := range buckets {
		if err := rdb.Del(ctx, bk.redisKey).Err(); err != nil {
			return err
		}
		if err := bk.allow(ctx); err != nil {
			return err
		}
		strlen, err := rdb.StrLen(ctx, bk.redisKey).Result()
		if err != nil {
			return err
		}
		usage, err := rdb.MemoryUsage(ctx, bk.redisKey, 0).Result()
		if err != nil {
			return err
		}
		if err := rdb.Del(ctx, bk.redisKey).Err(); err != nil {
			return err
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t\n", bk.limiter, bk.limit, bk.redisKey, strlen, usage)
	}
	return w.Flush()
}

// measureAlgorithms prints, for each algorithm on a limit of 100 a minute
// (and the sliding log on 1000 too, past the 128 entries Redis keeps in a
// listpack), the MEMORY USAGE of the bucket's key after one request and
// after the 100th (or 1000th), with the key's Redis type.
func measureAlgorithms(ctx context.Context, rdb *redis.Client) error {
	backend, err := redisbackend.New(rdb)
	if err != nil {
		return err
	}
	lim := ratelimit.New(backend)
	redisKey := redisscript.Key(redisbackend.DefaultPrefix, userKey)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "algorithm\tlimit\ttype\tafter 1 request (bytes)\tat the limit (bytes)\t")
	type row struct {
		alg   ratelimit.Algorithm
		limit int64
	}
	var rows []row
	for alg := range ratelimit.LeakyBucket + 1 {
		rows = append(rows, row{alg, 100})
	}
	rows = append(rows, row{ratelimit.SlidingWindowLog, 1000})
	for _, r := range rows {
		cfg := ratelimit.Config{Algorithm: r.alg, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(r.limit)}}
		if err := rdb.Del(ctx, redisKey).Err(); err != nil {
			return err
		}
		var usage [2]int64
		var kind string
		for i := range r.limit {
			d, err := lim.Allow(ctx, userKey, cfg)
			if err := allowed(d.Allowed, err); err != nil {
				return fmt.Errorf("%v, request %d: %w", r.alg, i+1, err)
			}
			if i != 0 && i != r.limit-1 {
				continue
			}
			if usage[min(i, 1)], err = rdb.MemoryUsage(ctx, redisKey, 0).Result(); err != nil {
				return err
			}
			if kind, err = rdb.Type(ctx, redisKey).Result(); err != nil {
				return err
			}
		}
		if err := rdb.Del(ctx, redisKey).Err(); err != nil {
			return err
		}
		fmt.Fprintf(w, "%v\tPerMinute(%d)\t%s\t%d\t%d\t\n", r.alg, r.limit, kind, usage[0], usage[1])
	}
	return w.Flush()
}
