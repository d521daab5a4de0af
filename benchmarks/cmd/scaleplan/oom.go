package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strconv"

	"github.com/redis/go-redis/v9"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/ratelimit"
)

// oomHeadroom is how far above used_memory oom sets maxmemory: room for a
// few thousand keys.
const oomHeadroom = 1 << 20

// oomMaxKeys bounds the new keys oom decides on before it gives up on
// reaching maxmemory.
const oomMaxKeys = 100_000

// measureOOM fills the server at rdb to a maxmemory just above what it
// holds and prints how a decision on a new key and then on an existing one
// fail.
func measureOOM(ctx context.Context, f flags, rdb *redis.Client, cfg ratelimit.Config) error {
	if err := requireEmpty(ctx, rdb); err != nil {
		return err
	}
	in, err := readInfo(ctx, rdb, "memory")
	if err != nil {
		return err
	}
	used, err := in.number("used_memory")
	if err != nil {
		return err
	}
	prev, err := rdb.ConfigGet(ctx, "maxmemory").Result()
	if err != nil {
		return err
	}
	backend, err := redisbackend.New(rdb)
	if err != nil {
		return err
	}
	lim := ratelimit.New(backend)
	written := 0
	defer func() {
		if err := deleteKeys(context.WithoutCancel(ctx), rdb, f, written); err != nil {
			log.Printf("scaleplan: %v", err)
		}
	}()
	if err := rdb.ConfigSet(ctx, "maxmemory", strconv.FormatInt(int64(used)+oomHeadroom, 10)).Err(); err != nil {
		return err
	}
	defer func() {
		if err := rdb.ConfigSet(context.WithoutCancel(ctx), "maxmemory", prev["maxmemory"]).Err(); err != nil {
			log.Printf("scaleplan: restore maxmemory %s: %v", prev["maxmemory"], err)
		}
	}()
	for i := range oomMaxKeys {
		written = i + 1
		_, err := lim.Allow(ctx, f.userKey(i), cfg)
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if err != nil {
			fmt.Printf("after %d new keys: %v\n", i, err)
			printWraps(err)
			d, err := lim.Allow(ctx, f.userKey(0), cfg)
			fmt.Printf("an existing key: allowed=%v err=%v\n", d.Allowed, err)
			printWraps(err)
			return nil
		}
	}
	return fmt.Errorf("%d new keys decided without reaching maxmemory", oomMaxKeys)
}

// printWraps prints which of ratelimit's sentinels err wraps.
func printWraps(err error) {
	fmt.Printf("  ErrBackendUnavailable=%v ErrKeyRejected=%v\n",
		errors.Is(err, ratelimit.ErrBackendUnavailable), errors.Is(err, ratelimit.ErrKeyRejected))
}
