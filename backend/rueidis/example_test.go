package rueidisbackend_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/rueidis"

	rueidisbackend "github.com/sluicehq/sluice/backend/rueidis"
	"github.com/sluicehq/sluice/ratelimit"
)

// A limiter on the rueidis client a service already has. Concurrent
// decisions share round trips through rueidis's automatic pipelining. The
// example needs a Redis server on 127.0.0.1:6379, so it is compiled but
// not run.
func Example() {
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	backend, err := rueidisbackend.New(client)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := backend.Check(context.Background()); err != nil {
		log.Print(err) // e.g. a maxmemory-policy that may evict buckets
	}
	limiter := ratelimit.New(backend)
	// Both must hold: a burst of 10 a second, and 1000 an hour.
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{
		ratelimit.PerSecond(10).WithID("burst"),
		ratelimit.PerHour(1000).WithID("hourly"),
	}}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	d, err := limiter.Allow(ctx, "user:12345", cfg)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("allowed %v; %s: %d of %d left\n", d.Allowed, d.Bandwidth, d.Remaining, d.Limit)
}
