// Command quickstart shows sluice's limiter in real time: a burst is
// admitted, the next request is denied with the time to wait, and after that
// wait the bucket has refilled. Buckets live in memory, or with -redis in a
// Redis server, where every process that runs it shares them.
//
//	go run ./examples/quickstart
//	go run ./examples/quickstart -redis 127.0.0.1:6379
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/backend/memory"
	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/ratelimit"
)

func main() {
	redisAddr := flag.String("redis", "", "keep buckets in the Redis server at this address instead of in memory")
	flag.Parse()
	ctx := context.Background()
	backend, done := newBackend(ctx, *redisAddr)
	defer done()
	limiter := ratelimit.New(backend)

	// Two requests a second on average, in bursts of up to five.
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{
		ratelimit.PerSecond(2).WithBurst(5),
	}}
	const key = "user:42"
	fmt.Println("limit: 2 requests a second, bursts of up to 5, for key", key)

	allow := func(label string) ratelimit.Decision {
		d, err := limiter.Allow(ctx, key, cfg)
		if err != nil {
			log.Fatal(err)
		}
		if d.Allowed {
			fmt.Printf("  %-10s allowed, %d of %d left\n", label, d.Remaining, d.Limit)
		} else {
			fmt.Printf("  %-10s denied: 429, Retry-After: %d (retry after %v)\n", label, retryAfterSeconds(d.RetryAfter), d.RetryAfter)
		}
		return d
	}

	fmt.Println("\n6 requests at once:")
	var d ratelimit.Decision
	for i := 1; i <= 6; i++ {
		d = allow(fmt.Sprintf("request %d", i))
	}

	fmt.Printf("\nsleeping %v, as the denial said:\n", d.RetryAfter.Round(time.Millisecond))
	time.Sleep(d.RetryAfter)
	d = allow("request 7")

	fmt.Printf("\nsleeping %v, until the bucket is full again:\n", d.ResetAfter.Round(time.Millisecond))
	time.Sleep(d.ResetAfter)
	allow("request 8")
}

// newBackend returns the memory backend, or with an address a Redis one,
// and what to call when done with it.
func newBackend(ctx context.Context, addr string) (ratelimit.Backend, func()) {
	if addr == "" {
		b := memory.New()
		return b, func() { b.Close() }
	}
	// No retries: a decision whose reply was lost must not be charged twice.
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	b, err := redisbackend.New(client)
	if err != nil {
		log.Fatal(err)
	}
	report, err := b.Check(ctx)
	if err != nil {
		log.Print(err) // a risky setting: say so, and go on with the demo
	}
	for _, s := range report.Servers {
		fmt.Printf("buckets in Redis %s at %s\n", s.Version, s.Addr)
	}
	return b, func() { client.Close() }
}

// retryAfterSeconds is the HTTP Retry-After value for d: whole seconds,
// rounded up, since a value rounded down invites a retry that fails again.
func retryAfterSeconds(d time.Duration) int64 {
	return int64(math.Ceil(d.Seconds()))
}
