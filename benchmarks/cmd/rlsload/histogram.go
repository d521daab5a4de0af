package main

import (
	"math"
	"math/bits"
	"time"
)

// subBits is log2 of the buckets each power of two is split into: 64, so
// that a bucket is at most 1/64 of its lower bound wide and its midpoint
// within 1/128 (0.8%) of any duration in it.
const subBits = 6

const subBuckets = 1 << subBits

// histogram counts durations in log-linear buckets, as HdrHistogram does:
// durations under 64ns each have a bucket of their own, and every power of
// two above is split into 64 equal buckets. It holds any duration in a
// fixed 30 KB, however many it counts. The zero value is empty and ready;
// it is not safe for concurrent use (each goroutine of a run has its own,
// merged at the end).
type histogram struct {
	counts [(64 - subBits + 1) * subBuckets]uint64
	n      uint64
}

// record counts d; a negative d counts as 0.
func (h *histogram) record(d time.Duration) {
	h.counts[bucket(uint64(max(d, 0)))]++
	h.n++
}

// merge adds o's counts to h's.
func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
}

// quantile returns the p-quantile (0 < p ≤ 1) of the recorded durations by
// the nearest-rank method, as the midpoint of its bucket; 0 when none was
// recorded.
func (h *histogram) quantile(p float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(p * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return time.Duration(midpoint(i))
		}
	}
	panic("unreachable: the counts sum to n")
}

// bucket returns the index of the bucket that counts v nanoseconds.
func bucket(v uint64) int {
	if v < subBuckets {
		return int(v)
	}
	shift := bits.Len64(v) - 1 - subBits
	return (shift+1)*subBuckets + int(v>>shift) - subBuckets
}

// midpoint returns the middle of bucket i, in nanoseconds.
func midpoint(i int) uint64 {
	if i < subBuckets {
		return uint64(i)
	}
	shift := i/subBuckets - 1
	low := uint64(i%subBuckets+subBuckets) << shift
	return low + (uint64(1)<<shift)/2
}
