package plans_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/ratelimit"
)

// A tenant's plan limits its requests; moving it to another plan takes
// effect on its next request.
func Example() {
	ctx := context.Background()
	store := new(plans.MemoryStore)
	must(store.PutPlan("free", ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(2)}}))
	must(store.PutPlan("pro", ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(100)}}))
	must(store.Assign("acme", "free"))

	// A lookup of a new subject, or the first after a change, waits for
	// the store's read, up to plans.DefaultReadWait (50ms). The store here
	// is in memory, but a busy machine may still not run its read that
	// soon: waiting for every read keeps the output the same anywhere.
	cache, err := plans.NewCache(store, plans.WithReadWait(time.Minute))
	if err != nil {
		panic(err)
	}
	store.Notify(cache) // as plans/postgres's listener would

	backend := memory.New()
	defer backend.Close()
	// An upgrade should give the new plan's headroom at once: Additive
	// adds the capacity gained to the tokens left.
	limiter := ratelimit.New(backend, ratelimit.WithInheritance(ratelimit.Additive))
	bucket := cache.Bucket(limiter, "acme", "acme")

	for range 3 {
		d, _ := bucket.TryConsume(ctx, 1)
		fmt.Printf("allowed=%v limit=%d\n", d.Allowed, d.Limit)
	}
	must(store.Assign("acme", "pro"))
	d, _ := bucket.TryConsume(ctx, 1)
	fmt.Printf("allowed=%v limit=%d\n", d.Allowed, d.Limit)
	// Output:
	// allowed=true limit=2
	// allowed=true limit=2
	// allowed=false limit=2
	// allowed=true limit=100
}

// tenants is a Store over a map, as a service with plans in its own
// database might write one.
type tenants map[string]plans.Assignment

func (t tenants) Lookup(_ context.Context, subject string) (plans.Assignment, error) {
	return t[subject], nil // a missing subject has no plan: the cache serves its default
}

func ExampleCache_Lookup() {
	pro := plans.Plan{Name: "pro", Version: 7, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(50).WithBurst(200)}}
	cache, err := plans.NewCache(tenants{"acme": {Subject: "acme", Version: 9, Plan: pro}}, plans.WithReadWait(time.Minute))
	if err != nil {
		panic(err)
	}
	for _, subject := range []string{"acme", "unknown"} {
		a, err := cache.Lookup(context.Background(), subject)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: plan %s, config version %d, capacity %d\n",
			subject, a.Plan.Name, a.ConfigVersion(), a.Plan.Bandwidths[0].Capacity)
	}
	// Output:
	// acme: plan pro, config version 9, capacity 200
	// unknown: plan default, config version 0, capacity 60
}

// flaky is a Store whose database has gone away.
type flaky struct {
	tenants
	down bool
}

func (f *flaky) Lookup(ctx context.Context, subject string) (plans.Assignment, error) {
	if f.down {
		return plans.Assignment{}, errors.New("dial tcp: connection refused")
	}
	return f.tenants.Lookup(ctx, subject)
}

// When the store fails, the cache keeps serving the last good plan, and
// says so through its hooks.
func ExampleWithHooks() {
	pro := plans.Plan{Name: "pro", Version: 7, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(50)}}
	store := &flaky{tenants: tenants{"acme": {Subject: "acme", Version: 9, Plan: pro}}}
	cache, err := plans.NewCache(store, plans.WithHooks(plans.Hooks{
		StaleServed: func(subject string, err error) { fmt.Printf("serving %s's last good plan: %v\n", subject, err) },
		LoadFailed:  func(subject string, err error) { fmt.Printf("serving %s the default plan: %v\n", subject, err) },
	}), plans.WithReadWait(time.Minute))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	cache.Lookup(ctx, "acme")

	store.down = true
	cache.Resync() // a change feed reconnected: everything is read again
	a, _ := cache.Lookup(ctx, "acme")
	fmt.Println("acme is on", a.Plan.Name)
	a, _ = cache.Lookup(ctx, "newcomer")
	fmt.Println("newcomer is on", a.Plan.Name)
	// Output:
	// serving acme's last good plan: dial tcp: connection refused
	// acme is on pro
	// serving newcomer the default plan: dial tcp: connection refused
	// newcomer is on default
}

// Hit and Miss count lookups, for the cache's hit ratio; Loaded and the
// other hooks count the store's reads.
func ExampleHooks() {
	pro := plans.Plan{Name: "pro", Version: 7, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(50)}}
	var hits, misses, reads atomic.Int64
	cache, err := plans.NewCache(tenants{"acme": {Subject: "acme", Version: 9, Plan: pro}}, plans.WithHooks(plans.Hooks{
		Hit:    func(string) { hits.Add(1) },
		Miss:   func(string) { misses.Add(1) },
		Loaded: func(string, plans.Assignment) { reads.Add(1) },
	}), plans.WithReadWait(time.Minute))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for range 5 {
		cache.Config(ctx, "acme")
	}
	cache.Resync() // a change feed reconnected: the next lookup reads again
	for range 5 {
		cache.Config(ctx, "acme")
	}
	fmt.Printf("%d hits, %d misses, %d store reads\n", hits.Load(), misses.Load(), reads.Load())
	// Output:
	// 8 hits, 2 misses, 2 store reads
}

// hung is a Store whose database has stopped answering: its reads wait
// until answer is closed, or their ctx ends.
type hung struct {
	tenants
	answer chan struct{}
}

func (h hung) Lookup(ctx context.Context, subject string) (plans.Assignment, error) {
	select {
	case <-h.answer:
		return h.tenants.Lookup(ctx, subject)
	case <-ctx.Done():
		return plans.Assignment{}, ctx.Err()
	}
}

// With the store hung, a new subject waits for its plan no longer than
// the read wait: it gets the default plan, and its plan once the read
// lands. A subject the cache holds a plan for never waits on the store.
func ExampleWithReadWait() {
	pro := plans.Plan{Name: "pro", Version: 7, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(50)}}
	store := hung{tenants: tenants{"acme": {Subject: "acme", Version: 9, Plan: pro}}, answer: make(chan struct{})}
	landed := make(chan struct{})
	cache, err := plans.NewCache(store, plans.WithReadWait(10*time.Millisecond), plans.WithHooks(plans.Hooks{
		Loaded: func(string, plans.Assignment) { close(landed) },
	}))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	a, _ := cache.Lookup(ctx, "acme")
	fmt.Println("acme is on", a.Plan.Name, "while the store does not answer")

	close(store.answer) // the database answers
	<-landed
	a, _ = cache.Lookup(ctx, "acme")
	fmt.Println("acme is on", a.Plan.Name, "once the read landed")
	// Output:
	// acme is on default while the store does not answer
	// acme is on pro once the read landed
}

func ExamplePlanFromRow() {
	row := []byte(`[{"id":"burst","capacity":20,"refill_tokens":20,"refill_period":"1s"},
	                {"id":"daily","capacity":10000,"refill_tokens":10000,"refill_period":"24h","refill":"Interval"}]`)
	p, err := plans.PlanFromRow("pro", 7, "TokenBucket", row)
	if err != nil {
		panic(err)
	}
	fmt.Println(p.Name, p.Version, p.Algorithm, len(p.Bandwidths), p.Bandwidths[1].ID, p.Bandwidths[1].Refill)

	_, err = plans.PlanFromRow("pro", 8, "TokenBucket", []byte(`[{"capacity":20,"refill_tokens":20}]`))
	fmt.Println(err)
	fmt.Println(errors.Is(err, plans.ErrInvalidPlan))
	// Output:
	// pro 7 TokenBucket 2 daily Interval
	// plans: invalid plan: plan "pro" version 8: bandwidths[0].refill_period: missing
	// true
}

func ExampleMarshalBandwidths() {
	data, err := plans.MarshalBandwidths([]ratelimit.Bandwidth{
		ratelimit.PerMinute(100).WithID("burst").WithInitialTokens(50),
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(string(data))
	// Output:
	// [{"id":"burst","capacity":100,"refill_tokens":100,"refill_period":"1m0s","refill":"Greedy","initial_tokens":50}]
}

// must panics on err, and drops the value: for brevity in examples.
func must[T any](_ T, err error) {
	if err != nil {
		panic(err)
	}
}
