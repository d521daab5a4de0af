package failpolicy_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
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

// Layer puts the policy in its place in a [ratelimit.Stack], next to the
// store, whatever the order the layers are given in. The stack's Close
// closes the policy, not the store. A bad option is an error naming the
// layer.
func ExampleLayer() {
	store := memory.New()
	defer store.Close()
	backend, err := ratelimit.Stack(store, failpolicy.Layer(failpolicy.Local, failpolicy.WithInstances(4), failpolicy.WithTimeout(time.Second)))
	if err != nil {
		panic(err)
	}
	defer backend.Close()
	limiter := ratelimit.New(backend)
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(2)}}
	for i := 1; i <= 3; i++ {
		d, err := limiter.Allow(context.Background(), "user:1", cfg)
		if err != nil {
			panic(err)
		}
		fmt.Printf("request %d: allowed %v, degraded %v\n", i, d.Allowed, d.Degraded)
	}

	_, err = ratelimit.Stack(store, failpolicy.Layer(failpolicy.Closed, failpolicy.WithTimeout(0)))
	fmt.Println(err)
	// Output:
	// request 1: allowed true, degraded false
	// request 2: allowed true, degraded false
	// request 3: allowed false, degraded false
	// ratelimit: Stack: the fail policy layer: ratelimit: invalid config: failpolicy: WithTimeout 0s is not positive
}

// Hooks count what the policy decided, for metrics.
func ExampleWithHooks() {
	var degraded int
	hooks := failpolicy.Hooks{
		Degraded: func(context.Context, string, failpolicy.Mode, error) { degraded++ },
		BreakerChanged: func(node string, from, to failpolicy.BreakerState) {
			fmt.Printf("breaker %q: %v -> %v\n", node, from, to)
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
	// breaker "": BreakerClosed -> BreakerOpen
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

// twoMasters is a store of two nodes, as a Redis Cluster of two masters
// looks to the policy: a key that starts with "a" is on the master
// 10.0.0.1:6379, the others on 10.0.0.2:6379, which is away.
type twoMasters struct{ store *memory.Backend }

func (twoMasters) Node(key string) string {
	if strings.HasPrefix(key, "a") {
		return "10.0.0.1:6379"
	}
	return "10.0.0.2:6379"
}

func (m twoMasters) Do(ctx context.Context, key string, cfg ratelimit.Config, req ratelimit.Request) (ratelimit.Decision, error) {
	if m.Node(key) == "10.0.0.2:6379" {
		return ratelimit.Decision{}, fmt.Errorf("%w: i/o timeout", ratelimit.ErrTimeout)
	}
	return m.store.Do(ctx, key, cfg, req)
}

// With a backend that names the node serving each key, as the Redis
// backends do on a cluster client, each node has a breaker of its own:
// the master that is away opens its own, and the keys on the other are
// still decided by the store.
func ExampleBackend_Breakers() {
	store := twoMasters{store: memory.New()}
	defer store.store.Close()
	// (The long deadline keeps a busy test machine from failing a
	// healthy call.)
	policy, err := failpolicy.Wrap(store, failpolicy.Closed, failpolicy.WithBreaker(2, time.Second), failpolicy.WithTimeout(time.Minute))
	if err != nil {
		panic(err)
	}
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(10)}}
	for _, key := range []string{"a:user:1", "b:user:2", "a:user:1", "b:user:2"} {
		d, err := policy.Do(context.Background(), key, cfg, ratelimit.Request{Tokens: 1})
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: allowed %v, degraded %v\n", key, d.Allowed, d.Degraded)
	}
	states := policy.Breakers()
	for _, node := range slices.Sorted(maps.Keys(states)) {
		fmt.Println(node, states[node])
	}
	fmt.Println("the most open:", policy.Breaker())
	// Output:
	// a:user:1: allowed true, degraded false
	// b:user:2: allowed false, degraded true
	// a:user:1: allowed true, degraded false
	// b:user:2: allowed false, degraded true
	// 10.0.0.1:6379 BreakerClosed
	// 10.0.0.2:6379 BreakerOpen
	// the most open: BreakerOpen
}
