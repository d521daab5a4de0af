package sharding

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// TestConcurrentExact: 64 goroutines hammer one hot key on a frozen clock
// until every sub-bucket is empty; whatever the interleaving, whichever
// sub-buckets they are sent to and however many retries they have, the
// key admits its capacity exactly, never a token more or less. A key of 7
// split 6 ways uses 6 sub-buckets; split 3 ways of a 7 burst refilled 2
// an hour, 2.
func TestConcurrentExact(t *testing.T) {
	type tc struct {
		name string
		cfg  ratelimit.Config
		want int64
	}
	var cases []tc
	for _, c := range []int64{1000, 1001, 7} {
		cases = append(cases, tc{fmt.Sprintf("PerHour(%d)", c), config(ratelimit.PerHour(c)), c})
	}
	cases = append(cases,
		tc{"SmallRefill", config(ratelimit.PerHour(2).WithBurst(7)), 7},
		tc{"MultiBandwidth", config(ratelimit.PerSecond(100), ratelimit.PerHour(1000)), 100},
		tc{"InitialTokens", config(ratelimit.PerHour(1000).WithInitialTokens(333)), 333},
	)
	perAlgorithm := map[string]bool{}
	for _, alg := range algorithms[1:] { // TokenBucket is the cases above
		cfg := config(ratelimit.PerHour(1001))
		cfg.Algorithm = alg
		cases = append(cases, tc{alg.String(), cfg, 1001})
		perAlgorithm[alg.String()] = true
	}
	for _, n := range []int{3, 6} {
		for _, retries := range []int{0, 1, n - 1} {
			for _, c := range cases {
				if perAlgorithm[c.name] && retries != 1 {
					continue // each algorithm once per n is enough
				}
				t.Run(fmt.Sprintf("n=%d/retries=%d/%s", n, retries, c.name), func(t *testing.T) {
					t.Parallel()
					clock := newClock()
					b := mustNew(t, newMemory(t, clock), Keys(n, "hot").WithRetries(retries))
					if got := hammer(t, b, "hot", c.cfg, consume(1)); got != c.want {
						t.Errorf("admitted %d; want %d", got, c.want)
					}
				})
			}
		}
	}
}

// TestConcurrentConsumeUpToExact: goroutines taking up to 7 tokens at a
// time take the capacity exactly between them.
func TestConcurrentConsumeUpToExact(t *testing.T) {
	for _, retries := range []int{0, 1, 5} {
		t.Run(fmt.Sprintf("retries=%d", retries), func(t *testing.T) {
			t.Parallel()
			b := mustNew(t, newMemory(t, newClock()), Keys(6, "hot").WithRetries(retries))
			if got := hammer(t, b, "hot", config(ratelimit.PerHour(1001)), upTo(7)); got != 1001 {
				t.Errorf("took %d; want 1001", got)
			}
		})
	}
}

// hammer runs rounds of 64 goroutines × 16 requests req on key until a
// round admits nothing and an Inspect finds every sub-bucket empty (at most
// 1000 rounds, far more than any capacity here needs), and returns the
// tokens taken.
func hammer(t *testing.T, b *Backend, key string, cfg ratelimit.Config, req ratelimit.Request) int64 {
	t.Helper()
	const goroutines, each, maxRounds = 64, 16, 1000
	var taken atomic.Int64
	for range maxRounds {
		var round atomic.Int64
		var wg sync.WaitGroup
		for range goroutines {
			wg.Go(func() {
				for range each {
					d, err := b.Do(context.Background(), key, cfg, req)
					if err != nil {
						t.Errorf("%v: %v", req.Op, err)
						return
					}
					if d.Allowed != (d.Consumed > 0) || d.Consumed > req.Tokens {
						t.Errorf("%v(%d): Allowed %v with Consumed %d", req.Op, req.Tokens, d.Allowed, d.Consumed)
					}
					round.Add(d.Consumed)
				}
			})
		}
		wg.Wait()
		taken.Add(round.Load())
		if t.Failed() {
			return taken.Load()
		}
		if round.Load() == 0 && do(t, b, key, cfg, inspect()).Remaining == 0 {
			return taken.Load()
		}
	}
	t.Fatalf("%d rounds did not empty the key", maxRounds)
	return 0
}

// TestRefillBound steps a fake clock and, between steps, sends a hot key
// requests for all it holds; then, over the run of T,
//
//	admitted ≤ C + ⌊r·T/P⌋
//
// for a bandwidth of C refilled r per P: each sub-bucket i is an exact
// bucket of Cᵢ refilled rᵢ per P, so it admits at most Cᵢ + ⌊rᵢ·T/P⌋, and
// the Cᵢ and rᵢ add up to C and r. (For a window algorithm it is C per
// window, and windows start at most ⌊T/P⌋ times after the first.)
//
// With n−1 retries, a request is denied only when every sub-bucket is
// short of it. Sending requests until one is denied then empties every
// sub-bucket at each step, as it empties the unsharded bucket, so each
// sub-bucket admits exactly what an unsharded bucket of its share would,
// Cᵢ + ⌊rᵢ·t/P⌋ by time t (steps short enough that none fills up, so no
// refill is lost to a cap). The unsharded bucket admits C + ⌊r·t/P⌋, and
// Σᵢ⌊rᵢ·t/P⌋ > r·t/P − n, so sharded ≥ unsharded − (n−1): only each
// sub-bucket's fraction of a token is lost, never more. Interval refill,
// fixed windows and logs lose nothing; the test holds them to the same
// bound. With n−1 retries the key admits, exactly, what n separate buckets
// of the sub-configs admit when each is emptied at every step.
//
// For several bandwidths a sub-bucket admits the least of its
// bandwidths' supplies, and Σᵢ minᵦ(xᵦᵢ) falls short of minᵦ Σᵢ xᵦᵢ when
// the shares are out of proportion. Greedy rates are split by period,
// exactly 1/n each, so only the rounding of each Capacity and each
// sub-bucket's fraction of a token are lost: at most n−1 tokens per
// bandwidth. (Splitting RefillTokens instead gave PerSecond(10) with a
// burst of 100 and PerMinute(300), split 6 ways, per-second refills of 2
// and 1, and the key admitted 564 against 612 over a minute; split by
// period, it admits all 612.) The upper bound holds either way.
func TestRefillBound(t *testing.T) {
	aligned := ratelimit.Every(time.Minute, 60).WithBurst(100).AlignedTo(epoch)
	type tc struct {
		name string
		cfg  ratelimit.Config
	}
	cases := []tc{
		{"Greedy", config(ratelimit.Every(time.Second, 10).WithBurst(100))},
		{"GreedyOdd", config(ratelimit.Every(7*time.Second, 31).WithBurst(101))},
		{"Interval", config(ratelimit.Every(time.Second, 10).WithBurst(100).WithRefill(ratelimit.Interval))},
		{"IntervalAligned", config(aligned)},
		{"GCRA", ratelimit.Config{Algorithm: ratelimit.GCRA, Bandwidths: []ratelimit.Bandwidth{ratelimit.Every(time.Second, 10).WithBurst(100)}}},
		{"LeakyBucket", ratelimit.Config{Algorithm: ratelimit.LeakyBucket, Bandwidths: []ratelimit.Bandwidth{ratelimit.Every(time.Second, 13).WithBurst(100)}}},
		{"FixedWindow", ratelimit.Config{Algorithm: ratelimit.FixedWindow, Bandwidths: []ratelimit.Bandwidth{ratelimit.Every(3*time.Second, 100)}}},
		{"SlidingWindowLog", ratelimit.Config{Algorithm: ratelimit.SlidingWindowLog, Bandwidths: []ratelimit.Bandwidth{ratelimit.Every(3*time.Second, 100)}}},
		{"MultiBandwidth", config(ratelimit.Every(time.Second, 10).WithBurst(100), ratelimit.PerMinute(300))},
	}
	// Steps of uneven lengths, short enough that no sub-bucket of 100/6
	// refilling 10/6 a second fills up in one.
	steps := []time.Duration{137 * time.Millisecond, time.Second, 3300 * time.Millisecond, 10 * time.Millisecond, 777 * time.Millisecond}
	for _, n := range []int{3, 6} {
		for _, retries := range []int{0, 1, n - 1} {
			for _, c := range cases {
				t.Run(fmt.Sprintf("n=%d/retries=%d/%s", n, retries, c.name), func(t *testing.T) {
					t.Parallel()
					clock := newClock()
					mem := newMemory(t, clock)
					b := mustNew(t, mem, Keys(n, "hot").WithRetries(retries))
					m := parts(c.cfg, n)
					sharded, unsharded, separate := int64(0), int64(0), int64(0)
					var elapsed time.Duration
					for i := range 60 {
						if i > 0 {
							step := steps[i%len(steps)]
							clock.Advance(step)
							elapsed += step
						}
						sharded += drain(t, b, "hot", c.cfg)
						unsharded += drain(t, mem, "cold", c.cfg)
						for j := range m {
							separate += drain(t, mem, fmt.Sprint("separate", j), subConfig(c.cfg, m, j))
						}
					}
					bound := int64(ratelimit.MaxCapacity)
					for _, bw := range c.cfg.Bandwidths {
						bound = min(bound, bw.Capacity+bw.RefillTokens*int64(elapsed/time.Microsecond)/bw.PeriodMicros())
					}
					if sharded > bound {
						t.Errorf("admitted %d over %v; the config allows at most %d", sharded, elapsed, bound)
					}
					if unsharded > bound {
						t.Errorf("unsharded, admitted %d over %v; the config allows at most %d", unsharded, elapsed, bound)
					}
					if lost := int64((n - 1) * len(c.cfg.Bandwidths)); retries == n-1 && sharded < unsharded-lost {
						t.Errorf("admitted %d over %v with every sub-bucket tried; unsharded, %d, and at most (n-1) per bandwidth = %d fewer", sharded, elapsed, unsharded, lost)
					}
					if retries == n-1 && sharded != separate {
						t.Errorf("admitted %d over %v with every sub-bucket tried; %d separate buckets of the sub-configs admit %d", sharded, elapsed, m, separate)
					}
					t.Logf("admitted %d, unsharded %d, separately %d, bound %d", sharded, unsharded, separate, bound)
				})
			}
		}
	}
}

// drain sends key Consume(1) until 8 in a row are denied (one is enough
// when every sub-bucket is tried), at most 10,000 times, and returns how
// many were admitted.
func drain(t *testing.T, b ratelimit.Backend, key string, cfg ratelimit.Config) int64 {
	t.Helper()
	var admitted int64
	for i, denied := 0, 0; i < 10_000 && denied < 8; i++ {
		if do(t, b, key, cfg, consume(1)).Allowed {
			admitted, denied = admitted+1, 0
		} else {
			denied++
		}
	}
	return admitted
}
