package main

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestBucketBounds(t *testing.T) {
	tests := []struct {
		v    uint64
		want int
	}{
		{0, 0},
		{63, 63},
		{64, 64},
		{127, 127},
		{128, 128},
		{129, 128},
		{130, 129},
		{math.MaxUint64, len(histogram{}.counts) - 1},
	}
	for _, tt := range tests {
		if got := bucket(tt.v); got != tt.want {
			t.Errorf("bucket(%d) = %d, want %d", tt.v, got, tt.want)
		}
	}
}

// TestMidpointError checks that every duration's bucket midpoint is within
// 1/128 of it, from nanoseconds to hours.
func TestMidpointError(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 100_000 {
		v := uint64(math.Exp(r.Float64() * math.Log(float64(time.Hour))))
		m := midpoint(bucket(v))
		if diff := math.Abs(float64(m) - float64(v)); diff > float64(v)/128 {
			t.Fatalf("midpoint(bucket(%d)) = %d: off by %.0f, more than 1/128", v, m, diff)
		}
	}
}

// TestQuantile compares the histogram's quantiles, after a merge, with the
// exact nearest-rank quantiles of the same durations.
func TestQuantile(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var a, b histogram
	var all []time.Duration
	for i := range 50_000 {
		d := time.Duration(r.ExpFloat64() * float64(300*time.Microsecond))
		all = append(all, d)
		if i%2 == 0 {
			a.record(d)
		} else {
			b.record(d)
		}
	}
	a.merge(&b)
	slices.Sort(all)
	for _, p := range []float64{0.01, 0.5, 0.9, 0.99, 0.999, 1} {
		exact := all[int(math.Ceil(p*float64(len(all))))-1]
		got := a.quantile(p)
		if diff := math.Abs(float64(got - exact)); diff > float64(exact)/64 {
			t.Errorf("quantile(%v) = %v, exact %v", p, got, exact)
		}
	}
	if a.n != uint64(len(all)) {
		t.Errorf("n = %d after the merge, want %d", a.n, len(all))
	}
}

func TestQuantileEmpty(t *testing.T) {
	var h histogram
	if got := h.quantile(0.99); got != 0 {
		t.Errorf("quantile of nothing = %v, want 0", got)
	}
}

func TestKeysLabel(t *testing.T) {
	for n, want := range map[int]string{1: "1", 100: "100", 10_000: "10k", 100_000: "100k", 1500: "1500"} {
		if got := keysLabel(n); got != want {
			t.Errorf("keysLabel(%d) = %q, want %q", n, got, want)
		}
	}
}
