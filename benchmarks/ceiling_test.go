package benchmarks

import (
	"testing"
)

// BenchmarkParallelCeiling measures how much faster this machine runs work
// that shares nothing when b.RunParallel spreads it over GOMAXPROCS
// goroutines: the best parallel speed-up any limiter could show here. On a
// virtual machine whose CPUs are busy elsewhere it can be well under
// GOMAXPROCS; compare the limiters' mode=parallel results with it.
func BenchmarkParallelCeiling(b *testing.B) {
	b.Run("mode=serial", func(b *testing.B) {
		x := uint64(1)
		for range b.N {
			x = spin(x)
		}
		sink(b, x)
	})
	b.Run("mode=parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			x := uint64(1)
			for pb.Next() {
				x = spin(x)
			}
			sink(b, x)
		})
	})
}

// spin is about half a microsecond of register-only arithmetic: a chain of
// xorshift steps, each depending on the last.
func spin(x uint64) uint64 {
	for range 256 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	return x
}

// sink keeps the compiler from discarding spin's result.
func sink(b *testing.B, x uint64) {
	if x == 0 {
		b.Log("unreachable: xorshift never reaches 0 from 1")
	}
}
