package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
	"github.com/sluicehq/sluice/sharding"
)

// newExampleClock is a hand-driven clock that keeps the examples' output
// deterministic; a real service leaves the memory backend on its own clock.
func newExampleClock() *ratelimittest.Clock {
	return ratelimittest.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
}

func ExampleLimiter_Allow() {
	clock := newExampleClock()
	backend := memory.New(memory.WithClock(clock))
	defer backend.Close()
	limiter := ratelimit.New(backend)
	ctx := context.Background()

	// Two requests a second, in bursts of up to three.
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{
		ratelimit.PerSecond(2).WithBurst(3),
	}}

	for i := 1; i <= 4; i++ {
		d, err := limiter.Allow(ctx, "user:42", cfg)
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		if !d.Allowed {
			// An HTTP handler would answer 429 with a Retry-After header
			// rounded up to whole seconds.
			fmt.Printf("request %d: denied, retry after %v\n", i, d.RetryAfter)
			clock.Advance(d.RetryAfter)
			continue
		}
		fmt.Printf("request %d: allowed, %d of %d left\n", i, d.Remaining, d.Limit)
	}

	d, _ := limiter.Allow(ctx, "user:42", cfg)
	fmt.Printf("after waiting: allowed=%v, full again in %v\n", d.Allowed, d.ResetAfter)
	// Output:
	// request 1: allowed, 2 of 3 left
	// request 2: allowed, 1 of 3 left
	// request 3: allowed, 0 of 3 left
	// request 4: denied, retry after 500ms
	// after waiting: allowed=true, full again in 1.5s
}

func ExampleLimiter_Bucket() {
	clock := newExampleClock()
	backend := memory.New(memory.WithClock(clock))
	defer backend.Close()
	// Additive: a customer who upgrades gets the extra capacity at once.
	limiter := ratelimit.New(backend, ratelimit.WithInheritance(ratelimit.Additive))
	ctx := context.Background()

	// The plan store: a database behind a cache in production. The supplier
	// is called on every operation, so a plan change applies on the next
	// request.
	plans := map[string]ratelimit.Config{
		"free": {Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(3).WithID("minute")}},
		"pro":  {Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(100).WithID("minute")}},
	}
	plan := "free"
	bucket := limiter.Bucket("customer:acme", func(context.Context) (ratelimit.Config, error) {
		return plans[plan], nil
	})

	for range 4 {
		d, err := bucket.TryConsume(ctx, 1)
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		fmt.Printf("%s plan: allowed=%v remaining=%d retry after %v\n", plan, d.Allowed, d.Remaining, d.RetryAfter)
	}

	plan = "pro"
	d, _ := bucket.TryConsume(ctx, 1)
	fmt.Printf("%s plan: allowed=%v remaining=%d retry after %v\n", plan, d.Allowed, d.Remaining, d.RetryAfter)
	// Output:
	// free plan: allowed=true remaining=2 retry after 0s
	// free plan: allowed=true remaining=1 retry after 0s
	// free plan: allowed=true remaining=0 retry after 0s
	// free plan: allowed=false remaining=0 retry after 20s
	// pro plan: allowed=true remaining=96 retry after 0s
}

// A config with several bandwidths admits a request only when every one of
// them has the tokens. Here a per-second burst limit and a per-minute
// sustained limit take turns binding.
func ExampleConfig_multipleBandwidths() {
	clock := newExampleClock()
	backend := memory.New(memory.WithClock(clock))
	defer backend.Close()
	limiter := ratelimit.New(backend)
	ctx := context.Background()

	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{
		ratelimit.PerSecond(5).WithID("second"),
		ratelimit.PerMinute(12).WithID("minute"),
	}}

	for second := range 3 {
		allowed := 0
		for {
			d, err := limiter.Allow(ctx, "ip:192.0.2.1", cfg)
			if err != nil {
				fmt.Println("error:", err)
				return
			}
			if !d.Allowed {
				fmt.Printf("t=%ds: %d allowed, then denied by %q: retry after %v\n", second, allowed, d.Bandwidth, d.RetryAfter)
				break
			}
			allowed++
		}
		clock.Advance(time.Second)
	}
	// Output:
	// t=0s: 5 allowed, then denied by "second": retry after 200ms
	// t=1s: 5 allowed, then denied by "second": retry after 200ms
	// t=2s: 2 allowed, then denied by "minute": retry after 3s
}

func ExampleConfig_Validate() {
	check := func(name string, b ratelimit.Bandwidth) {
		err := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{b}}.Validate()
		switch {
		case err == nil:
			fmt.Printf("%s: ok\n", name)
		case errors.Is(err, ratelimit.ErrInvalidConfig):
			fmt.Printf("%s: %v\n", name, err)
		}
	}
	month := 30 * 24 * time.Hour

	check("zero capacity", ratelimit.PerSecond(0))
	check("10,000,000 a month", ratelimit.Every(month, 10_000_000))
	// Refilled greedily, a token of this quota is 288,000,000,000 scaled
	// units (see Apply): beyond what every backend computes exactly.
	check("9,999,999 a month", ratelimit.Every(month, 9_999_999))
	// Interval refill adds whole tokens once a period, so any quota fits.
	check("9,999,999 a month, interval", ratelimit.Every(month, 9_999_999).WithRefill(ratelimit.Interval))
	// Output:
	// zero capacity: ratelimit: invalid config: Bandwidths[0].Capacity must be between 1 and 2^50, got 0
	// 10,000,000 a month: ok
	// 9,999,999 a month: ratelimit: invalid config: Bandwidths[0].Capacity 9999999 refilled greedily by 9999999 per 720h0m0s takes more than 2^51 scaled units, beyond exact arithmetic: lower Capacity, make RefillTokens divide the period, or use Interval refill
	// 9,999,999 a month, interval: ok
}

// Each algorithm reads a bandwidth the same way, as Capacity requests per
// RefillPeriod, and they differ at a window's edge: a fixed window admits a
// full window again as soon as the last one ends, a sliding log only as
// its requests age out, a minute after each was made.
func ExampleAlgorithm() {
	clock := newExampleClock()
	backend := memory.New(memory.WithClock(clock))
	defer backend.Close()
	limiter := ratelimit.New(backend)
	ctx := context.Background()

	for _, alg := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindowLog} {
		cfg := ratelimit.Config{Algorithm: alg, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(3)}}
		key := "user:42:" + alg.String()
		// send makes n requests and returns how many passed, and the last
		// decision.
		send := func(n int) (passed int, d ratelimit.Decision) {
			for range n {
				var err error
				if d, err = limiter.Allow(ctx, key, cfg); err == nil && d.Allowed {
					passed++
				}
			}
			return passed, d
		}
		first, _ := send(1)
		clock.Advance(40 * time.Second)
		second, _ := send(2)
		clock.Advance(20 * time.Second)
		third, d := send(4)
		fmt.Printf("%v: %d of 1 at 0s, %d of 2 at 40s, %d of 4 at 60s, retry after %v\n", alg, first, second, third, d.RetryAfter)
	}
	// Output:
	// FixedWindow: 1 of 1 at 0s, 2 of 2 at 40s, 3 of 4 at 60s, retry after 1m0s
	// SlidingWindowLog: 1 of 1 at 0s, 2 of 2 at 40s, 1 of 4 at 60s, retry after 40s
}

// Stack puts each decorator in its place, whatever the order they are
// given in: here sharding splits the key "global" 4 ways, above a fail
// policy that judges each sub-bucket's call on its own, above the store.
func ExampleStack() {
	store := memory.New(memory.WithClock(newExampleClock()))
	defer store.Close()
	backend, err := ratelimit.Stack(store,
		sharding.Layer(sharding.Keys(4, "global")),
		failpolicy.Layer(failpolicy.Closed, failpolicy.WithTimeout(time.Second)),
	)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	defer backend.Close() // the layers; the store is the caller's to close
	limiter := ratelimit.New(backend)
	ctx := context.Background()
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(1000)}}

	d, err := limiter.Allow(ctx, "global", cfg)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Printf("allowed %v, limit %d, decided by the store: %v\n", d.Allowed, d.Limit, !d.Degraded)
	// Each of the 4 sub-buckets holds 250: one request may take no more.
	_, err = limiter.AllowN(ctx, "global", cfg, 251)
	fmt.Println(errors.Is(err, ratelimit.ErrInvalidRequest))

	_, err = ratelimit.Stack(store, sharding.Layer(), failpolicy.Layer(failpolicy.Open), sharding.Layer())
	fmt.Println(err)
	// Output:
	// allowed true, limit 1000, decided by the store: true
	// true
	// ratelimit: invalid config: Stack: two sharding layers
}

func ExampleLimiter_TryAcquire() {
	backend := memory.New()
	defer backend.Close()
	limiter := ratelimit.New(backend)
	ctx := context.Background()

	// At most two reports generated at once per tenant; a permit whose
	// holder dies comes back after 30 seconds.
	lim := ratelimit.InFlight(2, 30*time.Second)

	var held []*ratelimit.Permit
	for i := 1; i <= 3; i++ {
		p, d, err := limiter.TryAcquire(ctx, "reports:tenant-7", lim, 1)
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		if p == nil {
			fmt.Printf("request %d: busy, %d of %d in flight\n", i, d.InFlight, d.Limit)
			continue
		}
		fmt.Printf("request %d: running, %d of %d in flight\n", i, d.InFlight, d.Limit)
		held = append(held, p)
	}
	for _, p := range held {
		// Release with a context that is not done, even when the
		// request's is.
		if err := p.Release(context.WithoutCancel(ctx)); err != nil {
			fmt.Println("error:", err)
		}
	}
	p, d, _ := limiter.TryAcquire(ctx, "reports:tenant-7", lim, 1)
	fmt.Printf("after the releases: running, %d of %d in flight\n", d.InFlight, d.Limit)
	_ = p.Release(ctx)
	// Output:
	// request 1: running, 1 of 2 in flight
	// request 2: running, 2 of 2 in flight
	// request 3: busy, 2 of 2 in flight
	// after the releases: running, 1 of 2 in flight
}

func ExampleLimiter_Acquire() {
	backend := memory.New()
	defer backend.Close()
	limiter := ratelimit.New(backend)
	lim := ratelimit.InFlight(1, time.Minute)

	first, _ := limiter.Acquire(context.Background(), "exports", lim, 1)
	go func() {
		time.Sleep(20 * time.Millisecond) // the first export's work
		_ = first.Release(context.Background())
	}()

	// Waits for the first to be released, for at most ten seconds.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	second, err := limiter.Acquire(ctx, "exports", lim, 1)
	if err != nil {
		fmt.Println("gave up:", err)
		return
	}
	defer second.Release(context.WithoutCancel(ctx))
	fmt.Println("second export running")
	// Output: second export running
}

func ExamplePermit_KeepAlive() {
	backend := memory.New()
	defer backend.Close()
	limiter := ratelimit.New(backend)
	ctx := context.Background()

	// A lease of a second, for work that may take longer: KeepAlive renews
	// the permit until the work is done.
	p, _, err := limiter.TryAcquire(ctx, "rebuild-index", ratelimit.InFlight(1, time.Second), 1)
	if err != nil || p == nil {
		fmt.Println("busy or failed:", err)
		return
	}
	work, done := context.WithCancel(ctx)
	kept := make(chan error)
	go func() { kept <- p.KeepAlive(work) }()

	time.Sleep(50 * time.Millisecond) // the long work
	done()
	if err := <-kept; err != nil {
		fmt.Println("lost the permit:", err) // the work should stop
	}
	fmt.Println("release:", p.Release(ctx))
	// Output: release: <nil>
}

func ExamplePermit_Hold() {
	backend := memory.New()
	defer backend.Close()
	limiter := ratelimit.New(backend)
	ctx := context.Background()

	p, _, err := limiter.TryAcquire(ctx, "uploads:tenant-7", ratelimit.InFlight(3, 10*time.Second), 1)
	if err != nil || p == nil {
		fmt.Println("busy or failed:", err)
		return
	}
	// The permit is kept alive while the work runs past a third of its
	// lease, and released when it returns, or panics.
	p.Hold(ctx, func() {
		fmt.Println("uploading")
	})
	d, _ := limiter.Semaphore("uploads:tenant-7", func(context.Context) (ratelimit.Concurrency, error) {
		return ratelimit.InFlight(3, 10*time.Second), nil
	}).InFlight(ctx)
	fmt.Println("in flight after:", d.InFlight)
	// Output:
	// uploading
	// in flight after: 0
}
