package main

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/internal/redisscript"
)

// deleteBatch is how many UNLINKs deleteKeys sends in one pipeline.
const deleteBatch = 1000

// redisKey is the Redis key sluice's Redis backends keep the bucket of
// userKey in.
func redisKey(userKey string) string { return redisscript.Key(redisbackend.DefaultPrefix, userKey) }

// requireEmpty fails unless the server holds no key: redis-memory and oom
// measure a server alone, and flush none.
func requireEmpty(ctx context.Context, rdb *redis.Client) error {
	n, err := rdb.DBSize(ctx).Result()
	if err != nil {
		return fmt.Errorf("DBSIZE: %w", err)
	}
	if n != 0 {
		return fmt.Errorf("the server holds %d keys; redis-memory and oom need one with none", n)
	}
	return nil
}

// deleteKeys deletes the buckets of the first n user keys, one key a
// command, as a cluster node takes no command on keys of different slots.
func deleteKeys(ctx context.Context, rdb *redis.Client, f flags, n int) error {
	for start := 0; start < n; start += deleteBatch {
		pipe := rdb.Pipeline()
		for i := start; i < min(start+deleteBatch, n); i++ {
			pipe.Unlink(ctx, redisKey(f.userKey(i)))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("delete the keys: %w", err)
		}
	}
	return nil
}
