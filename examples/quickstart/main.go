// Command quickstart shows sluice's limiter on the in-memory backend, in real
// time: a burst is admitted, the next request is denied with the time to
// wait, and after that wait the bucket has refilled.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"fmt"
	"log"
	"math"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/ratelimit"
)

func main() {
	backend := memory.New()
	defer backend.Close()
	limiter := ratelimit.New(backend)
	ctx := context.Background()

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

// retryAfterSeconds is the HTTP Retry-After value for d: whole seconds,
// rounded up, since a value rounded down invites a retry that fails again.
func retryAfterSeconds(d time.Duration) int64 {
	return int64(math.Ceil(d.Seconds()))
}
