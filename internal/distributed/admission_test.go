package distributed_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/ratelimit"
)

// bounds are what a token bucket may admit over a run, from the tokens it
// holds at the end: it starts full, takes only what it admits, and gains at
// most RefillTokens per RefillPeriod of the span between T0, read from the
// server's clock before the first call, and T1, read after the final
// Inspect. With L the fractional tokens at the end,
//
//	admitted + L = Capacity + refilled − lost to a full bucket
//
// so Capacity ≤ admitted + L ≤ Capacity + refill(T1−T0), and since
// Remaining = ⌊L⌋ and admitted is whole,
//
//	Capacity ≤ admitted + Remaining ≤ ⌊Capacity + refill(T1−T0)⌋.
//
// Calls that failed may or may not have been admitted: they count towards
// the low bound, not the high one.
type bounds struct {
	low, high int64
	span      time.Duration
}

func tokenBucketBounds(bw ratelimit.Bandwidth, t0, t1 time.Time) bounds {
	span := t1.Sub(t0)
	refill := bw.RefillTokens * int64(span/time.Microsecond) / int64(bw.RefillPeriod/time.Microsecond)
	return bounds{low: bw.Capacity, high: bw.Capacity + refill, span: span}
}

// check returns an error unless a run's tally and the bucket's Remaining
// after it lie within b; without refill and failures, admitted must be
// exactly b.low.
func (b bounds) check(n tally, remaining int64) error {
	admitted := int64(n.admitted)
	if admitted+remaining > b.high || admitted+int64(n.failed)+remaining < b.low {
		return fmt.Errorf("admitted %d (and %d failed) + remaining %d; want admitted + remaining within [%d, %d] over %v of server time",
			n.admitted, n.failed, remaining, b.low, b.high, b.span)
	}
	if b.high == b.low && n.failed == 0 && admitted != b.low {
		return fmt.Errorf("admitted %d without refill; want exactly %d", n.admitted, b.low)
	}
	return nil
}

// admissionRun is the run of the count checks: 2 processes × 64
// goroutines, 5,000 calls in all, on one new bucket of capacity 1000.
func admissionRun(top topology, backend string, bw ratelimit.Bandwidth) run {
	return run{top: top, backend: backend, bandwidth: bw, processes: 2, goroutines: 64, attempts: 5000}
}

// TestExactAdmission makes admissionRun through each Redis adapter,
// standalone and on the cluster: a token bucket without refill must admit
// exactly 1000, and with refill what the server's clock allows; every
// other algorithm, at 1000 an hour, exactly 1000.
func TestExactAdmission(t *testing.T) {
	skipShort(t)
	type bucket struct {
		name string
		alg  ratelimit.Algorithm
		bw   ratelimit.Bandwidth
	}
	buckets := []bucket{
		{"NoRefill", ratelimit.TokenBucket, noRefill(1000)},
		// 100 tokens a second, smoothly.
		{"Refill", ratelimit.TokenBucket, ratelimit.Every(10*time.Millisecond, 1).WithBurst(1000)},
		{"GCRA", ratelimit.GCRA, noRefill(1000)},
		{"LeakyBucket", ratelimit.LeakyBucket, noRefill(1000)},
	}
	// The window algorithms' bound: their window is 1800 times the run's
	// span, so the token bucket's bound is theirs too.
	for _, alg := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindowLog, ratelimit.SlidingWindowCounter} {
		buckets = append(buckets, bucket{alg.String(), alg, ratelimit.PerHour(1000)})
	}
	onEachTopology(t, func(t *testing.T, top topology, c client) {
		for _, backend := range adapters {
			for _, b := range buckets {
				t.Run(backend+"/"+b.name, func(t *testing.T) {
					r := admissionRun(top, backend, b.bw)
					r.algorithm = b.alg
					checkAdmission(t, c, r)
				})
			}
		}
	})
}

// checkAdmission makes r's run and checks the count admitted against the
// bounds. Without a fault no call may fail, and a run without refill must
// admit exactly Capacity. With one, checkFault must pass.
func checkAdmission(t *testing.T, c client, r run) {
	t.Helper()
	spec := r.spec(newKey(t))
	var t0 time.Time
	calls, m := execute(t, c, r, spec, func() { t0 = c.serverTime(t, spec.Key) })
	remaining := c.inspect(t, spec.Key, spec.Config)
	t1 := c.serverTime(t, spec.Key)

	n := count(calls)
	b := tokenBucketBounds(r.bandwidth, t0, t1)
	if r.fault == nil && (n.calls != r.attempts || n.failed != 0) {
		t.Fatalf("%d calls, %d failed; want %d calls, none failed", n.calls, n.failed, r.attempts)
	}
	if err := b.check(n, remaining); err != nil {
		t.Error(err)
	}
	t.Logf("%d processes × %d goroutines, %d calls in %v (%.0f/s): admitted %d, denied %d, failed %d, remaining %d; bound [%d, %d] over %v of server time",
		r.processes, r.goroutines, n.calls, time.Duration(n.last-n.first).Round(time.Millisecond), n.rate(),
		n.admitted, n.denied, n.failed, remaining, b.low, b.high, b.span.Round(time.Millisecond))
	if r.fault != nil {
		logFault(t, r, calls, m)
	}
}

// logFault fails t unless checkFault passes r's run, and logs what the
// calls during and after the fault did.
func logFault(t *testing.T, r run, calls []testkit.Call, m marks) {
	t.Helper()
	if err := checkFault(r, calls, m); err != nil {
		t.Error(err)
	}
	during, after := m.split(calls)
	d, a := count(during), count(after)
	t.Logf("during the fault (%v): %d calls, %d decided, %d failed; after it: %d calls, %d decided, %d failed",
		time.Duration(m.healed-m.struck).Round(time.Millisecond), d.calls, d.admitted+d.denied, d.failed, a.calls, a.admitted+a.denied, a.failed)
}
