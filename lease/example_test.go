package lease_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/ratelimit"
)

// A global limit every instance of a service shares: each instance leases
// batches of its tokens, and decides most requests in memory.
func ExampleLayer() {
	store := memory.New() // in production: a Redis backend every instance shares
	defer store.Close()
	backend, err := ratelimit.Stack(store, lease.Layer(lease.Keys("global"), lease.WithRefillTimeout(10*time.Second)))
	if err != nil {
		panic(err)
	}
	defer backend.Close()
	limiter := ratelimit.New(backend)
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1000).WithBurst(1000)}}

	allowed := 0
	for range 100 {
		d, err := limiter.Allow(context.Background(), "global", cfg)
		if err != nil {
			panic(err)
		}
		if d.Allowed {
			allowed++
		}
	}
	fmt.Println("allowed:", allowed)
	// Output: allowed: 100
}

// New over a store, with the leases sized to last 50ms at the rate each
// key is asked for, and a key's store calls counted in Stats.
func ExampleNew() {
	store := memory.New()
	defer store.Close()
	leased, err := lease.New(store, lease.Prefix("tenant:"), lease.WithTarget(50*time.Millisecond), lease.WithRefillTimeout(10*time.Second))
	if err != nil {
		panic(err)
	}
	defer leased.Close()
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10_000).WithBurst(10_000)}}
	for range 1000 {
		if _, err := leased.Do(context.Background(), "tenant:acme", cfg, ratelimit.Request{Tokens: 1}); err != nil {
			panic(err)
		}
	}
	st := leased.Stats()
	fmt.Println("decisions:", st.Decisions)
	fmt.Println("fewer store calls than decisions:", st.Refills < st.Decisions)
	// Output:
	// decisions: 1000
	// fewer store calls than decisions: true
}
