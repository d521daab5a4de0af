package failpolicy_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/ratelimit"
)

// down is a store that is always away, as Redis is when it is stopped.
type down struct{}

func (down) Do(context.Context, string, ratelimit.Config, ratelimit.Request) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, fmt.Errorf("%w: connection refused", ratelimit.ErrBackendUnavailable)
}

// With the store away, the Local mode admits this instance's share of the
// limit: 10 a minute shared by 4 instances is 2 here. After 5 failures
// the breaker opens, and the store is left alone for a second.
func ExampleWrap() {
	policy, err := failpolicy.Wrap(down{}, failpolicy.Local, failpolicy.WithInstances(4))
	if err != nil {
		panic(err)
	}
	defer policy.Close()
	limiter := ratelimit.New(policy)
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(10)}}
	for i := 1; i <= 6; i++ {
		d, err := limiter.Allow(context.Background(), "user:1", cfg)
		if err != nil {
			panic(err)
		}
		fmt.Printf("request %d: allowed %v, degraded %v, %v\n", i, d.Allowed, d.Degraded, policy.Breaker())
	}
	// Output:
	// request 1: allowed true, degraded true, BreakerClosed
	// request 2: allowed true, degraded true, BreakerClosed
	// request 3: allowed false, degraded true, BreakerClosed
	// request 4: allowed false, degraded true, BreakerClosed
	// request 5: allowed false, degraded true, BreakerOpen
	// request 6: allowed false, degraded true, BreakerOpen
}

// Hooks count what the policy decided, for metrics.
func ExampleWithHooks() {
	var degraded int
	hooks := failpolicy.Hooks{
		Degraded: func(context.Context, string, failpolicy.Mode, error) { degraded++ },
		BreakerChanged: func(from, to failpolicy.BreakerState) {
			fmt.Println("breaker:", from, "->", to)
		},
	}
	policy, err := failpolicy.Wrap(down{}, failpolicy.Closed, failpolicy.WithBreaker(2, time.Second), failpolicy.WithHooks(hooks))
	if err != nil {
		panic(err)
	}
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(10)}}
	for range 3 {
		if _, err := policy.Do(context.Background(), "user:1", cfg, ratelimit.Request{Tokens: 1}); err != nil {
			panic(err)
		}
	}
	fmt.Println("degraded decisions:", degraded)
	// Output:
	// breaker: BreakerClosed -> BreakerOpen
	// degraded decisions: 3
}

// flaky is a store that is away while down is set, and otherwise answers
// from memory.
type flaky struct {
	down  bool
	store *memory.Backend
}

func (f *flaky) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if f.down {
		return ratelimit.Decision{}, fmt.Errorf("%w: connection refused", ratelimit.ErrBackendUnavailable)
	}
	return f.store.Do(ctx, key, cfg, req)
}

// What the Local mode's share admits while the store is away is charged
// to the store when it answers again: here a bucket of 10 an hour, shared
// by 2 instances, admits 5 locally; once the store is back, the first
// call charges those 5 before its own request, so the store has 4 left
// after it, not 9.
func Example_localDebt() {
	store := &flaky{store: memory.New()}
	defer store.store.Close()
	policy, err := failpolicy.Wrap(store, failpolicy.Local, failpolicy.WithInstances(2), failpolicy.WithBreaker(100, time.Second))
	if err != nil {
		panic(err)
	}
	defer policy.Close()
	limiter := ratelimit.New(policy)
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(10)}}

	store.down = true
	admitted := 0
	for range 8 {
		if d, _ := limiter.Allow(context.Background(), "user:1", cfg); d.Allowed {
			admitted++
		}
	}
	fmt.Println("admitted by the share while the store was away:", admitted)

	store.down = false
	d, err := limiter.Allow(context.Background(), "user:1", cfg)
	fmt.Println("the store back:", d.Allowed, "remaining", d.Remaining, "degraded", d.Degraded, err)
	// Output:
	// admitted by the share while the store was away: 5
	// the store back: true remaining 4 degraded false <nil>
}
