package sharding_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/backend/memory"
	redisbackend "github.com/sluicehq/sluice/backend/redis"
	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/sharding"
)

// A global limit of 1000 requests an hour on one key, split 4 ways: each
// sub-bucket holds 250, and together they admit exactly 1000.
func Example() {
	mem := memory.New()
	defer mem.Close()
	backend, err := sharding.New(mem, sharding.Keys(4, "global"))
	if err != nil {
		log.Fatal(err)
	}
	limiter := ratelimit.New(backend)
	ctx := context.Background()
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(1000)}}

	for range 3 {
		d, err := limiter.Allow(ctx, "global", cfg)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("allowed %v, limit %d\n", d.Allowed, d.Limit)
	}
	// Inspect sums the sub-buckets.
	d, err := backend.Do(ctx, "global", cfg, ratelimit.Request{Op: ratelimit.Inspect})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d left\n", d.Remaining)

	// One request may take at most what one sub-bucket holds.
	_, err = limiter.AllowN(ctx, "global", cfg, 251)
	fmt.Println(errors.Is(err, ratelimit.ErrInvalidRequest))

	// A key no rule matches is one bucket, as without sharding.
	d, err = limiter.Allow(ctx, "user:42", cfg)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("user:42: %d left of %d\n", d.Remaining, d.Limit)
	// Output:
	// allowed true, limit 1000
	// allowed true, limit 1000
	// allowed true, limit 1000
	// 997 left
	// true
	// user:42: 999 left of 1000
}

// Sharding over a fail policy over a Redis Cluster: the whole API's 50,000
// requests a second on one key, split over 6 sub-buckets that land on
// every master of a cluster of up to 6. The policy judges each
// sub-bucket's call under its own deadline, so a stalled master fails
// only the sub-buckets on it, and the requests move on to the others. The
// example needs a Redis Cluster, so it is compiled but not run.
func Example_cluster() {
	client := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"},
		MaxRetries:            -1,   // a retried decision would be charged twice
		ContextTimeoutEnabled: true, // give up at the context's deadline
	})
	defer client.Close()
	store, err := redisbackend.New(client, redisbackend.WithPrefix("rl:"))
	if err != nil {
		log.Fatal(err)
	}
	policy, err := failpolicy.Wrap(store, failpolicy.Closed, failpolicy.WithTimeout(50*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	defer policy.Close()
	backend, err := sharding.New(policy, sharding.Keys(6, "global").WithRetries(2))
	if err != nil {
		log.Fatal(err)
	}
	limiter := ratelimit.New(backend)

	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(50_000)}}
	d, err := limiter.Allow(context.Background(), "global", cfg)
	if err != nil {
		log.Fatal(err)
	}
	if !d.Allowed {
		fmt.Printf("429: retry after %v (degraded: %v)\n", d.RetryAfter, d.Degraded)
		return
	}
	fmt.Printf("allowed, about %d of %d left\n", d.Remaining, d.Limit)
}

// Where a hot key's sub-buckets live: their keys, slots and the masters
// serving them now. It asks the cluster for its masters, so it is
// compiled but not run.
func ExampleBackend_Slots() {
	client := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"},
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
	})
	defer client.Close()
	store, err := redisbackend.New(client)
	if err != nil {
		log.Fatal(err)
	}
	backend, err := sharding.New(store, sharding.Keys(6, "global"))
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	subs, err := backend.Slots(ctx, "global")
	if err != nil {
		log.Fatal(err)
	}
	for i, s := range subs {
		fmt.Printf("sub-bucket %d: slot %5d on %s (key %q)\n", i, s.Slot, s.Master, s.Key)
	}
}

// Hooks.Retried is told each time a request moves on from a sub-bucket,
// and why. Here every request goes first to sub-bucket 0, which holds 2
// of the 4 tokens: the third request moves on to sub-bucket 1.
func ExampleWithHooks() {
	mem := memory.New()
	defer mem.Close()
	first := func(context.Context, string) uint64 { return 0 }
	backend, err := sharding.New(mem,
		sharding.Keys(2, "global").WithAffinity(first),
		sharding.WithHooks(sharding.Hooks{
			Retried: func(_ context.Context, key string, reason sharding.RetryReason) {
				fmt.Printf("  %s: moved on, %v\n", key, reason)
			},
		}),
	)
	if err != nil {
		log.Fatal(err)
	}
	limiter := ratelimit.New(backend)
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(4)}}
	for i := 1; i <= 3; i++ {
		d, err := limiter.Allow(context.Background(), "global", cfg)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("request %d: allowed %v\n", i, d.Allowed)
	}
	// Output:
	// request 1: allowed true
	// request 2: allowed true
	//   global: moved on, rejected
	// request 3: allowed true
}
