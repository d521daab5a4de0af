package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/backend/memory"
	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/ratelimit"
)

// checkTimeout bounds the Redis check at start-up: a server that does not
// answer in this time is reported as unreachable.
const checkTimeout = 5 * time.Second

// A store is where buckets live, with what to call to let it go.
type store struct {
	backend ratelimit.Backend
	// kind names it for the page and the logs: "memory", "redis" or
	// "redis cluster".
	kind  string
	close func() error
}

// openStore returns the memory backend, or, with opts.redisAddrs, sluice's
// go-redis backend on a client set as the README says: no retries (a
// retried decision would be charged twice) and the context's deadline on
// the socket. It checks the server first, so that a wrong address fails at
// start-up rather than on every request, and logs what the check finds
// unsafe.
func openStore(ctx context.Context, opts options, log *slog.Logger) (store, error) {
	if len(opts.redisAddrs) == 0 {
		m := memory.New()
		return store{backend: m, kind: "memory", close: m.Close}, nil
	}
	var client redis.UniversalClient
	kind := "redis"
	if opts.cluster {
		kind = "redis cluster"
		client = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: opts.redisAddrs, MaxRetries: -1, ContextTimeoutEnabled: true,
		})
	} else {
		client = redis.NewClient(&redis.Options{
			Addr: opts.redisAddrs[0], MaxRetries: -1, ContextTimeoutEnabled: true,
		})
	}
	b, err := redisbackend.New(client)
	if err != nil {
		_ = client.Close()
		return store{}, fmt.Errorf("--redis %s: %w", strings.Join(opts.redisAddrs, ","), err)
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	report, err := b.Check(ctx)
	switch {
	case errors.Is(err, redisbackend.ErrUnsafeServer):
		for _, p := range report.Problems {
			log.Warn("redis setting can break the limits", "problem", p)
		}
	case err != nil:
		_ = client.Close()
		return store{}, fmt.Errorf("--redis %s: %w", strings.Join(opts.redisAddrs, ","), err)
	}
	return store{backend: b, kind: kind, close: client.Close}, nil
}
