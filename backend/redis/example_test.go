package redisbackend_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/ratelimit"
)

// A limiter on the go-redis client a service already has. The example needs
// a Redis server on 127.0.0.1:6379, so it is compiled but not run.
func Example() {
	client := redis.NewClient(&redis.Options{
		Addr:                  "127.0.0.1:6379",
		MaxRetries:            -1,   // a retried decision would be charged twice
		ContextTimeoutEnabled: true, // give up at the context's deadline
	})
	defer client.Close()

	backend, err := redisbackend.New(client)
	if err != nil {
		log.Fatal(err)
	}
	limiter := ratelimit.New(backend)
	// A burst of 20, then 100 a minute.
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(100).WithBurst(20)}}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	d, err := limiter.Allow(ctx, "user:12345", cfg)
	if err != nil {
		log.Fatal(err) // ratelimit.ErrTimeout or ErrBackendUnavailable: the fail policy's business
	}
	if !d.Allowed {
		fmt.Printf("429: retry after %v\n", d.RetryAfter)
		return
	}
	fmt.Printf("allowed, %d of %d left\n", d.Remaining, d.Limit)
}

// Check at start-up: a server that may evict keys would reset limits under
// memory pressure, and a client that retries or ignores deadlines would
// charge twice or stall.
func ExampleBackend_Check() {
	client := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"},
		MaxRetries:            -1,
		ContextTimeoutEnabled: true, // else Check reports that deadlines are ignored
	})
	defer client.Close()
	backend, err := redisbackend.New(client, redisbackend.WithPrefix("rl:"))
	if err != nil {
		log.Fatal(err)
	}
	report, err := backend.Check(context.Background())
	for _, s := range report.Servers {
		log.Printf("redis %s at %s, maxmemory-policy %s", s.Version, s.Addr, s.MaxmemoryPolicy)
	}
	if err != nil {
		log.Fatal(err) // wraps redisbackend.ErrUnsafeServer: each problem, and how to fix it
	}
}
