package ratelimittest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
)

// A backend's conformance test is a Test function that hands Run a way to
// build the backend on the suite's clock. This example shows its body; it
// has no output, so go test compiles it without running it.
func Example() {
	testConformance := func(t *testing.T) {
		ratelimittest.Run(t, ratelimittest.Harness{
			New: func(t *testing.T, clock ratelimit.Clock) ratelimit.Backend {
				b := memory.New(memory.WithClock(clock))
				t.Cleanup(func() { b.Close() })
				return b
			},
		})
	}
	_ = testConformance // in a _test.go file: func TestConformance(t *testing.T) { ... }
}

// A backend that reads its store's clock, such as Redis TIME, says so; the
// suite then moves time by sleeping and checks durations against bounds.
func Example_serverClock() {
	testConformance := func(t *testing.T) {
		ratelimittest.Run(t, ratelimittest.Harness{
			ServerClock: true,
			New: func(t *testing.T, _ ratelimit.Clock) ratelimit.Backend {
				b := memory.New() // on its own clock, standing in for Redis
				t.Cleanup(func() { b.Close() })
				return b
			},
		})
	}
	_ = testConformance
}

func ExampleClock() {
	clock := ratelimittest.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	backend := memory.New(memory.WithClock(clock))
	defer backend.Close()
	limiter := ratelimit.New(backend)
	ctx := context.Background()
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(1)}}

	d, _ := limiter.Allow(ctx, "k", cfg)
	fmt.Println(d.Allowed)
	d, _ = limiter.Allow(ctx, "k", cfg)
	fmt.Println(d.Allowed, d.RetryAfter)
	clock.Advance(d.RetryAfter)
	d, _ = limiter.Allow(ctx, "k", cfg)
	fmt.Println(d.Allowed, clock.Now().Format(time.TimeOnly))
	// Output:
	// true
	// false 1m0s
	// true 00:01:00
}
