package sharding

import (
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// parts returns how many sub-buckets a key of a rule of n sub-buckets uses
// under cfg: n, or fewer when a bandwidth has less than that to split, so
// that every sub-bucket gets at least one token of Capacity and some
// refill: a Capacity below n, or a RefillTokens below n where the refill
// is split in tokens (see [byPeriod]). cfg must be valid.
func parts(cfg ratelimit.Config, n int) int {
	for ; n > 1; n-- {
		if splits(cfg, n) {
			break
		}
	}
	return n
}

// splits reports whether every bandwidth of cfg can be split n ways.
func splits(cfg ratelimit.Config, n int) bool {
	for i := range cfg.Bandwidths {
		b := &cfg.Bandwidths[i]
		if b.Capacity < int64(n) || !byPeriod(cfg.Algorithm, b, n) && b.RefillTokens < int64(n) {
			return false
		}
	}
	return true
}

// byPeriod reports whether b's refill is split n ways by lengthening its
// period: each sub-bucket then refills RefillTokens every n·RefillPeriod,
// exactly 1/n of the rate, with nothing to round, and its arithmetic
// stays as exact as the whole bandwidth's. That is so for a greedy
// bandwidth of the algorithms that read it as a rate (the token bucket,
// GCRA, the leaky bucket) whose n periods fit in
// [ratelimit.MaxRefillPeriod]. The others split RefillTokens instead: an
// interval refill must come at the same instants, and a window must keep
// its length.
func byPeriod(alg ratelimit.Algorithm, b *ratelimit.Bandwidth, n int) bool {
	switch alg {
	case ratelimit.FixedWindow, ratelimit.SlidingWindowLog, ratelimit.SlidingWindowCounter:
		return false
	}
	return b.Refill == ratelimit.Greedy && b.RefillPeriod <= ratelimit.MaxRefillPeriod/time.Duration(n)
}

// share returns sub-bucket i's part of v split n ways: v/n, plus one for
// each of the first v%n sub-buckets, so that the parts add up to v.
func share(v int64, n, i int) int64 {
	q, r := v/int64(n), v%int64(n)
	if int64(i) < r {
		q++
	}
	return q
}

// subConfig returns sub-bucket i's config of cfg split n ways: each
// bandwidth's Capacity and InitialTokens split by [share], and its refill
// by lengthening RefillPeriod n times where [byPeriod] says so, else by
// splitting RefillTokens by share; everything else as it is. The
// sub-buckets' capacities, refill rates and initial tokens add up to
// cfg's exactly, and each sub-bucket's InitialTokens stays within its
// Capacity (a share of a smaller number is never larger).
func subConfig(cfg ratelimit.Config, n, i int) ratelimit.Config {
	bws := make([]ratelimit.Bandwidth, len(cfg.Bandwidths))
	for j, b := range cfg.Bandwidths {
		if byPeriod(cfg.Algorithm, &b, n) {
			b.RefillPeriod *= time.Duration(n)
		} else {
			b.RefillTokens = share(b.RefillTokens, n, i)
		}
		b.Capacity = share(b.Capacity, n, i)
		if b.InitialTokens != nil {
			t := share(*b.InitialTokens, n, i)
			b.InitialTokens = &t
		}
		bws[j] = b
	}
	cfg.Bandwidths = bws
	return cfg
}

// minShare is the most tokens one request may ask of a key split n ways:
// the smallest sub-bucket's smallest capacity, the last one's (a share
// rounded down).
func minShare(cfg ratelimit.Config, n int) int64 {
	return cfg.MinCapacity() / int64(n)
}

// checkSplit returns the first sub-bucket of cfg split n ways whose config
// fails [ratelimit.Config.Validate], and its error; or -1 and nil. cfg
// must be valid, and n what [parts] returns for it. A share can fail
// where the config passes, though rarely: an interval bandwidth's fill
// time depends on Capacity over RefillTokens, which rounding can grow,
// and a greedy bandwidth's scaled units on gcd(RefillTokens, period),
// which a longer period can change.
//
// Sub-bucket i's config depends only on which of its values got the
// extra token of [share], that is on whether i < v%n for each value v:
// sub-bucket 0 and the sub-buckets at each v%n stand for all the others,
// so at most one and three per bandwidth are checked.
func checkSplit(cfg ratelimit.Config, n int) (int, error) {
	if n <= 1 {
		return -1, nil // cfg itself, valid
	}
	firsts := uint64(1) // sub-bucket 0, and each first at which a share drops
	for i := range cfg.Bandwidths {
		b := &cfg.Bandwidths[i]
		firsts |= 1<<(b.Capacity%int64(n)) | 1<<(b.RefillTokens%int64(n))
		if b.InitialTokens != nil {
			firsts |= 1 << (*b.InitialTokens % int64(n))
		}
	}
	for ; firsts != 0; firsts &= firsts - 1 {
		i := bits.TrailingZeros64(firsts)
		if err := subConfig(cfg, n, i).Validate(); err != nil {
			return i, err
		}
	}
	return -1, nil
}

// splitCache remembers configs whose split [checkSplit] found valid, so
// that a hot key's decisions, which pass the same config again and again,
// skip validating its sub-configs: a few hundred ns and up to four
// allocations a decision. It holds a hash of the config's fingerprint and
// n in one of a fixed number of places, lock-free: a config that finds
// another's hash in its place is checked again. (Two configs whose hashes
// match, a chance of 2^-64, would skip the check; the sub-buckets' own
// backend still validates their configs.)
type splitCache struct {
	seen [64]atomic.Uint64
}

// splitKey is the hash of cfg split n ways, never 0 (an empty place).
func splitKey(cfg ratelimit.Config, n int) uint64 {
	return (cfg.Fingerprint() ^ uint64(n)*0x9e3779b97f4a7c15) | 1
}

// valid reports whether cfg split n ways was checked and found valid.
func (sc *splitCache) valid(cfg ratelimit.Config, n int) bool {
	k := splitKey(cfg, n)
	return sc.seen[k%uint64(len(sc.seen))].Load() == k
}

// checked records that cfg split n ways is valid.
func (sc *splitCache) checked(cfg ratelimit.Config, n int) {
	k := splitKey(cfg, n)
	sc.seen[k%uint64(len(sc.seen))].Store(k)
}
