package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/benchmarks/internal/measure"
	"github.com/sluicehq/sluice/ratelimit"
)

// randomBatch is how many decisions a goroutine of memory-backend's timed
// runs makes between reading the clock.
const randomBatch = 1000

// measureMemoryBackend prints the heap f.n keys of cfg cost the memory
// backend, and the decisions a second it then makes on keys at random.
func measureMemoryBackend(ctx context.Context, f flags, cfg ratelimit.Config) error {
	before := measure.LiveHeap()
	b := memory.New(memory.WithMaxKeys(f.n + 1))
	defer b.Close()
	lim := ratelimit.New(b)
	keys := make([]string, f.n)
	for i := range keys {
		keys[i] = f.userKey(i)
	}
	withKeys := measure.LiveHeap() // the key strings, which the slice holds
	for _, k := range keys {
		d, err := lim.Allow(ctx, k, cfg)
		if err := allowed(d, err, k); err != nil {
			return err
		}
	}
	after := measure.LiveHeap()
	if held := b.Len(); held != f.n {
		return fmt.Errorf("the backend's sweep dropped %d of the %d buckets before the heap was read", f.n-held, f.n)
	}
	fmt.Printf("keys=%d key=%q heap per key beyond the key string=%.1fB, key strings=%.1fB per key\n",
		f.n, keys[0], float64(after-withKeys)/float64(f.n), float64(withKeys-before)/float64(f.n))
	for _, g := range []int{1, runtime.GOMAXPROCS(0)} {
		rate, err := decideAtRandom(ctx, lim, cfg, keys, g, f.duration)
		if err != nil {
			return err
		}
		fmt.Printf("goroutines=%d decisions/s=%.0f (keys at random)\n", g, rate)
	}
	return nil
}

// decideAtRandom decides on keys drawn at random from g goroutines for d,
// and returns the decisions a second.
func decideAtRandom(ctx context.Context, lim *ratelimit.Limiter, cfg ratelimit.Config, keys []string, g int, d time.Duration) (float64, error) {
	var wg sync.WaitGroup
	counts := make([]int, g)
	errs := make([]error, g)
	stop := time.Now().Add(d)
	for w := range g {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for time.Now().Before(stop) {
				for range randomBatch {
					key := keys[r.IntN(len(keys))]
					d, err := lim.Allow(ctx, key, cfg)
					if err := allowed(d, err, key); err != nil {
						errs[w] = err
						return
					}
				}
				counts[w] += randomBatch
			}
		})
	}
	wg.Wait()
	total := 0
	for _, c := range counts {
		total += c
	}
	return float64(total) / d.Seconds(), errors.Join(errs...)
}
