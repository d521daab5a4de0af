package benchmarks

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// goroutineCounts are the numbers of goroutines that BenchmarkRedis and
// BenchmarkAllowGoroutines share their calls among.
var goroutineCounts = []int{1, 16, 64, 256}

// claim is how many consecutive calls a goroutine of [decide] takes from the
// shared counter at once: with one atomic add per call, the counter's cache
// line, written by every goroutine, would move between the CPUs on almost
// every in-memory decision and be timed with it.
const claim = 16

// timeDecisions times b.N decisions by exactly goroutines goroutines, each
// of which must come out want, and reports decisions/s and the p50, p99 and
// p99.9 latency of one call (p50-µs, p99-µs, p99.9-µs). Every call is timed
// with two reads of the monotonic clock, which count in decisions/s too,
// the same for every implementation.
func timeDecisions(b *testing.B, allow allowFunc, keys []string, goroutines int, want bool) {
	latencies := make([]time.Duration, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	err := decide(context.Background(), allow, keys, goroutines, b.N, want, latencies)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	slices.Sort(latencies)
	b.ReportMetric(micros(percentile(latencies, 0.50)), "p50-µs")
	b.ReportMetric(micros(percentile(latencies, 0.99)), "p99-µs")
	b.ReportMetric(micros(percentile(latencies, 0.999)), "p99.9-µs")
}

// decide makes n decisions with exactly goroutines goroutines (not
// b.RunParallel, whose goroutine count is a multiple of GOMAXPROCS), which
// take the calls in turns of [claim] from one counter: call i is on
// keys[i%len(keys)] and, when latencies is not nil, stores its latency in
// latencies[i] (so the slice is allocated once, before the timer starts).
// Every call must come out want; the first error or other outcome stops all
// goroutines and is returned.
func decide(ctx context.Context, allow allowFunc, keys []string, goroutines, n int, want bool, latencies []time.Duration) error {
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	end, nkeys := int64(n), int64(len(keys))
	for range goroutines {
		wg.Go(func() {
			for {
				from := next.Add(claim) - claim
				if from >= end {
					return
				}
				for i := from; i < min(from+claim, end); i++ {
					key := keys[i%nkeys]
					start := time.Now()
					ok, err := allow(ctx, key)
					if latencies != nil {
						latencies[i] = time.Since(start)
					}
					if err == nil && ok != want {
						err = fmt.Errorf("decision on %q: allowed = %v, want %v; the benchmark's limit fixes every outcome", key, ok, want)
					}
					if err != nil {
						once.Do(func() { first = err })
						next.Store(end) // the others stop at their next turn
						return
					}
				}
			}
		})
	}
	wg.Wait()
	return first
}

// percentile returns the p-quantile of sorted by the nearest-rank method.
func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
