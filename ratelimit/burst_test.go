package ratelimit_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// TestBoundaryBurst measures, for each algorithm on a limit of 10 a minute,
// the most requests it admits within any span of a minute when a client
// times its bursts to hurt: optionally one request to open a window, then
// as many requests as pass at a time a, then as many as pass at a + δ, for
// every a and δ on a grid of a hundredth of a minute and one microsecond
// either side of each minute boundary. The factor, that count over 10, is
// the burst column of docs/algorithms.md: run with -v to print it.
//
// A fixed window, the sliding window counter and the token bucket family
// (GCRA and the leaky bucket decide as it does) all admit 19, one short of
// twice the limit; the sliding log admits 10, never more than the limit.
func TestBoundaryBurst(t *testing.T) {
	const capacity, window = 10, int64(time.Minute / time.Microsecond)
	want := map[ratelimit.Algorithm]int64{
		ratelimit.TokenBucket:          2*capacity - 1,
		ratelimit.GCRA:                 2*capacity - 1,
		ratelimit.LeakyBucket:          2*capacity - 1,
		ratelimit.FixedWindow:          2*capacity - 1,
		ratelimit.SlidingWindowCounter: 2*capacity - 1,
		ratelimit.SlidingWindowLog:     capacity,
	}
	// A whole minute since 1970, so the counter's windows start there.
	const base = 28_333_334 * window
	var times []int64
	for i := range int64(100) {
		times = append(times, i*window/100)
	}
	for k := int64(1); k <= 2; k++ {
		times = append(times, k*window-1, k*window, k*window+1)
	}
	for alg := range ratelimit.LeakyBucket + 1 {
		cfg := ratelimit.Config{Algorithm: alg, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerMinute(capacity)}}
		var worst int64
		var how string
		for _, open := range []bool{false, true} {
			for _, a := range times {
				for _, delta := range times {
					if delta <= 0 || delta >= window {
						continue
					}
					var s ratelimit.State
					var admitted []int64
					if open {
						ratelimit.Apply(&s, cfg, ratelimit.Request{Tokens: 1}, base)
						admitted = append(admitted, base)
					}
					for _, at := range []int64{base + a, base + a + delta} {
						for ratelimit.Apply(&s, cfg, ratelimit.Request{Tokens: 1}, at).Allowed {
							admitted = append(admitted, at)
						}
					}
					if n := mostInWindow(admitted, window); n > worst {
						worst, how = n, fmt.Sprintf("open %v, bursts at %dµs and %dµs", open, a, a+delta)
					}
				}
			}
		}
		t.Logf("%-20v admits at most %d in a minute (%.1f× the limit): %s", alg, worst, float64(worst)/capacity, how)
		if worst != want[alg] {
			t.Errorf("%v admitted %d within a minute, want %d", alg, worst, want[alg])
		}
	}
}

// mostInWindow returns the most of the sorted times that fall within one
// span [t, t+window).
func mostInWindow(times []int64, window int64) int64 {
	var most int64
	first := 0
	for last := range times {
		for times[last]-times[first] >= window {
			first++
		}
		most = max(most, int64(last-first+1))
	}
	return most
}
