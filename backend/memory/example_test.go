package memory_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
)

// newExampleClock is a hand-driven clock that keeps the examples' output
// deterministic; a real service leaves the Backend on its own clock.
func newExampleClock() *ratelimittest.Clock {
	return ratelimittest.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
}

func ExampleNew() {
	backend := memory.New()
	defer backend.Close() // stops the background sweep
	limiter := ratelimit.New(backend)

	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(100)}}
	d, err := limiter.Allow(context.Background(), "user:42", cfg)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Printf("allowed=%v remaining=%d of %d\n", d.Allowed, d.Remaining, d.Limit)
	// Output:
	// allowed=true remaining=99 of 100
}

// A full bucket is the same as an absent one, so the Backend stores only
// buckets that are still refilling.
func ExampleBackend_Len() {
	clock := newExampleClock()
	backend := memory.New(memory.WithClock(clock))
	defer backend.Close()
	limiter := ratelimit.New(backend)
	ctx := context.Background()

	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10)}}
	d, _ := limiter.Allow(ctx, "user:42", cfg)
	fmt.Printf("stored: %d, full again in %v\n", backend.Len(), d.ResetAfter)

	clock.Advance(d.ResetAfter)
	d, _ = limiter.Allow(ctx, "user:42", cfg) // refilled: a fresh bucket again
	fmt.Printf("remaining=%d\n", d.Remaining)
	// Output:
	// stored: 1, full again in 100ms
	// remaining=9
}

// With a cap on keys, a new key is refused while every stored bucket is
// still refilling: forgetting one would hand its owner a full bucket.
func ExampleWithMaxKeys() {
	clock := newExampleClock()
	backend := memory.New(memory.WithClock(clock), memory.WithMaxKeys(1))
	defer backend.Close()
	limiter := ratelimit.New(backend)
	ctx := context.Background()

	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1)}}
	d, _ := limiter.Allow(ctx, "alice", cfg)
	fmt.Println("alice:", d.Allowed)

	_, err := limiter.Allow(ctx, "bob", cfg)
	fmt.Println("bob:", err)
	fmt.Println("  errors.Is ErrTooManyKeys:", errors.Is(err, memory.ErrTooManyKeys))
	fmt.Println("  errors.Is ErrKeyRejected:", errors.Is(err, ratelimit.ErrKeyRejected))

	clock.Advance(time.Second) // alice's bucket is full again and may go
	d, err = limiter.Allow(ctx, "bob", cfg)
	fmt.Println("bob, a second later:", d.Allowed, err)
	// Output:
	// alice: true
	// bob: ratelimit: key rejected: memory: too many keys: key "bob" is new, and the Backend holds WithMaxKeys(1) buckets
	//   errors.Is ErrTooManyKeys: true
	//   errors.Is ErrKeyRejected: true
	// bob, a second later: true <nil>
}
