package failpolicy_test

import (
	"context"
	"fmt"
	"time"

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
