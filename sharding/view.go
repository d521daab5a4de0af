package sharding

import (
	"math/bits"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// view is what a call has seen of a hot key's sub-buckets, from which it
// reports the whole key.
type view struct {
	seen     int                  // decisions of the store
	decided  []ratelimit.Decision // the store's decisions, in order
	degraded *ratelimit.Decision  // the last fail policy's denial
	err      error                // the last failure
}

// see records a sub-bucket's decision.
func (v *view) see(d ratelimit.Decision) {
	v.seen++
	v.decided = append(v.decided, d)
}

// skip records a sub-bucket that failed with err, or whose request a fail
// policy denied (d).
func (v *view) skip(d ratelimit.Decision, err error) {
	if err != nil {
		v.err = err
		return
	}
	v.degraded = &d
}

// whole turns the deciding sub-bucket's decision d into the key's: the
// key's Limit, Remaining estimated from every sub-bucket seen, and the
// latest ResetAfter seen.
func (v *view) whole(cfg ratelimit.Config, d ratelimit.Decision) ratelimit.Decision {
	d.Limit = limitOf(cfg, d.Bandwidth)
	d.Remaining = v.estimate(d.Bandwidth, d.Limit)
	for _, s := range v.decided {
		d.ResetAfter = max(d.ResetAfter, s.ResetAfter)
	}
	return d
}

// denial is the key's decision when every sub-bucket seen denied: the one
// that could pass soonest, as the whole key.
func (v *view) denial(cfg ratelimit.Config) ratelimit.Decision {
	best := v.decided[0]
	for _, d := range v.decided[1:] {
		if d.RetryAfter < best.RetryAfter {
			best = d
		}
	}
	best.Allowed, best.Consumed = false, 0
	return v.whole(cfg, best)
}

// estimate scales the Remaining of the sub-buckets seen whose binding
// bandwidth is band up to the whole key: their sum times limit, the key's
// capacity of band, over the sum of their Limits. It is exact when every
// sub-bucket holds as the ones seen do.
func (v *view) estimate(band string, limit int64) int64 {
	var rem, lim uint64
	for _, d := range v.decided {
		if d.Bandwidth == band && d.Limit > 0 {
			rem, lim = rem+uint64(max(d.Remaining, 0)), lim+uint64(d.Limit)
		}
	}
	if lim == 0 {
		return 0
	}
	rem = min(rem, lim) // so that the quotient fits
	hi, lo := bits.Mul64(rem, uint64(limit))
	q, _ := bits.Div64(hi, lo, lim)
	return int64(q)
}

// sum is the key's decision from every sub-bucket's (an Inspect, Reset,
// Replace or Add): allowed if any is, Remaining and Consumed their sums,
// RetryAfter the soonest when none is allowed, ResetAfter the latest,
// Degraded if any is, and the binding bandwidth and RefillAfter those of
// the sub-bucket with the fewest tokens left.
func sum(cfg ratelimit.Config, ds []ratelimit.Decision) ratelimit.Decision {
	var total ratelimit.Decision
	retry := time.Duration(-1)
	binding := 0
	for i, d := range ds {
		total.Allowed = total.Allowed || d.Allowed
		total.Degraded = total.Degraded || d.Degraded
		total.Remaining += d.Remaining
		total.Consumed += d.Consumed
		total.ResetAfter = max(total.ResetAfter, d.ResetAfter)
		if !d.Allowed && (retry < 0 || d.RetryAfter < retry) {
			retry = d.RetryAfter
		}
		if d.Remaining < ds[binding].Remaining {
			binding = i
		}
	}
	if !total.Allowed && retry > 0 {
		total.RetryAfter = retry
	}
	total.Bandwidth, total.RefillAfter = ds[binding].Bandwidth, ds[binding].RefillAfter
	total.Limit = limitOf(cfg, total.Bandwidth)
	return total
}

// limitOf is the capacity in cfg of the bandwidth a decision names.
func limitOf(cfg ratelimit.Config, band string) int64 {
	for i := range cfg.Bandwidths {
		if cfg.BandwidthName(i) == band {
			return cfg.Bandwidths[i].Capacity
		}
	}
	return cfg.MinCapacity()
}
