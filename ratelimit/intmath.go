package ratelimit

import (
	"math"
	"math/bits"
	"time"
)

// mulDivFloor returns floor(a×b/c) for b, c ≥ 1, exactly, saturating at
// ±MaxInt64 where it does not fit.
func mulDivFloor(a, b, c int64) int64 {
	neg := a < 0
	ua := uint64(a)
	if neg {
		ua = -ua
	}
	hi, lo := bits.Mul64(ua, uint64(b))
	if hi >= uint64(c) {
		if neg {
			return math.MinInt64
		}
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, uint64(c))
	if q > math.MaxInt64 {
		q = math.MaxInt64
	}
	if !neg {
		return int64(q)
	}
	if r != 0 {
		q++
	}
	return -int64(q)
}

func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }

// floorDiv is a/b rounded toward minus infinity, for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// ceilDiv is a/b rounded toward plus infinity, for b > 0.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b > 0 {
		q++
	}
	return q
}

// gcd is the greatest common divisor of a and b, for a, b ≥ 1.
func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
