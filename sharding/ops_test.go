package sharding

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
)

// opsEnv is a hot key "hot" split n ways over a memory backend on a fake
// clock, its first sub-bucket chosen by a fixed affinity.
type opsEnv struct {
	clock *ratelimittest.Clock
	mem   ratelimit.Backend
	b     *Backend
	n     int
}

func newOps(t *testing.T, n, retries int, first uint64) *opsEnv {
	clock := newClock()
	mem := newMemory(t, clock)
	return &opsEnv{clock: clock, mem: mem, b: mustNew(t, mem, Keys(n, "hot").WithRetries(retries).WithAffinity(fixed(first))), n: n}
}

// empty takes every token of every sub-bucket under cfg, straight from the
// backend.
func (e *opsEnv) empty(t *testing.T, cfg ratelimit.Config) {
	t.Helper()
	m := parts(cfg, e.n)
	for i, k := range subKeys(t, e.b, "hot")[:m] {
		do(t, e.mem, k, subConfig(cfg, m, i), upTo(ratelimit.MaxCapacity))
	}
}

// each returns what each sub-bucket holds under cfg.
func (e *opsEnv) each(t *testing.T, cfg ratelimit.Config) []int64 {
	t.Helper()
	return remainingEach(t, e.b, e.mem, "hot", cfg, parts(cfg, e.n))
}

// TestEstimateTakesNothing: an Estimate decides as a Consume would, tries
// the same sub-buckets, and takes nothing.
func TestEstimateTakesNothing(t *testing.T) {
	e := newOps(t, 4, 1, 0)
	cfg := config(ratelimit.PerHour(8))
	do(t, e.b, "hot", cfg, consume(2)) // sub-bucket 0 empty
	for range 5 {
		d := do(t, e.b, "hot", cfg, estimate(2))
		// Sub-bucket 0 denies, 0 of 2 left; 1 allows, 2 of 2: (0+2)·8/4.
		want := ratelimit.Decision{Allowed: true, Limit: 8, Remaining: 4, Bandwidth: "0", ResetAfter: time.Hour}
		if d != want {
			t.Fatalf("Estimate(2): %+v; want %+v (sub-bucket 1, after 0)", d, want)
		}
	}
	if got := e.each(t, cfg); !equal64(got, []int64{0, 2, 2, 2}) {
		t.Errorf("after Estimates the sub-buckets hold %v; want 0 2 2 2", got)
	}
}

func equal64(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestReserve: a Reserve goes on credit in one sub-bucket, with that
// sub-bucket's wait (its share of the refill, r/n), and moves on to the
// next when the wait is beyond MaxWait; for TokenBucket and GCRA alike.
func TestReserve(t *testing.T) {
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			e := newOps(t, 4, 1, 0)
			cfg := ratelimit.Config{Algorithm: alg, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(8)}} // 2 and 2/s a sub-bucket
			e.empty(t, cfg)
			for i, want := range []time.Duration{500 * time.Millisecond, time.Second, 500 * time.Millisecond, time.Second} {
				d := do(t, e.b, "hot", cfg, reserve(1, time.Second))
				if !d.Allowed || d.RetryAfter != want || d.Consumed != 1 || d.Limit != 8 || d.Remaining != 0 {
					t.Fatalf("Reserve %d: %+v; want allowed after %v, one sub-bucket's wait", i, d, want)
				}
			}
			// Sub-buckets 0 and 1 are reserved for a second; 2 and 3 are
			// not tried.
			d := do(t, e.b, "hot", cfg, reserve(1, time.Second))
			if d.Allowed || d.RetryAfter != 1500*time.Millisecond {
				t.Fatalf("Reserve with sub-buckets 0 and 1 reserved a second ahead: %+v; want denied, 1.5s", d)
			}
		})
	}
}

// TestConsumeUpTo: ConsumeUpTo takes what it can from the first
// sub-bucket, then from the next ones, as many as the retries allow; an
// allowed decision has no RetryAfter, though the last sub-bucket tried
// was empty; with nothing to take it is a denial.
func TestConsumeUpTo(t *testing.T) {
	cfg := config(ratelimit.PerHour(8)) // 2 a sub-bucket
	t.Run("Gathers", func(t *testing.T) {
		e := newOps(t, 4, 1, 0)
		d := do(t, e.b, "hot", cfg, upTo(5))
		if !d.Allowed || d.Consumed != 4 || d.RetryAfter != 0 || d.Limit != 8 {
			t.Fatalf("ConsumeUpTo(5), one retry: %+v; want 4 from sub-buckets 0 and 1", d)
		}
		if got := e.each(t, cfg); !equal64(got, []int64{0, 0, 2, 2}) {
			t.Errorf("the sub-buckets hold %v; want 0 0 2 2", got)
		}
	})
	t.Run("AllRetries", func(t *testing.T) {
		e := newOps(t, 4, 3, 1)
		if d := do(t, e.b, "hot", cfg, upTo(100)); !d.Allowed || d.Consumed != 8 || d.RetryAfter != 0 || d.Remaining != 0 {
			t.Fatalf("ConsumeUpTo(100), every sub-bucket: %+v; want all 8", d)
		}
		d := do(t, e.b, "hot", cfg, upTo(1))
		want := ratelimit.Decision{Limit: 8, RetryAfter: 30 * time.Minute, ResetAfter: time.Hour, RefillAfter: 30 * time.Minute, Bandwidth: "0"}
		if d != want {
			t.Errorf("ConsumeUpTo(1) of an empty key: %+v; want %+v", d, want)
		}
	})
	t.Run("LastEmpty", func(t *testing.T) {
		e := newOps(t, 4, 1, 0)
		do(t, e.b, "hot", cfg, upTo(3)) // 0 empty, 1 holds 1
		do(t, e.b, "hot", cfg, upTo(1)) // 0 empty, 1 empty: routed from 0
		do(t, e.b, "hot", cfg, upTo(1)) // nothing left within one retry
		e.clock.Advance(15 * time.Minute)
		// Sub-buckets 0 and 1 have refilled half a token each. Put a whole
		// one in 0 and ask for more than it holds: 1 gives none.
		do(t, e.mem, subKeys(t, e.b, "hot")[0], subConfig(cfg, 4, 0), add(1))
		d := do(t, e.b, "hot", cfg, upTo(3))
		if !d.Allowed || d.Consumed != 1 || d.RetryAfter != 0 {
			t.Errorf("ConsumeUpTo(3) with 1 token in sub-bucket 0 and none in 1: %+v; want allowed, 1 taken, no RetryAfter", d)
		}
	})
}

// TestAdd: Add spreads its tokens as share() splits them, starting at the
// sub-bucket a Consume would go to, and each keeps what fits, never more
// than its capacity.
func TestAdd(t *testing.T) {
	cfg := config(ratelimit.PerHour(100)) // 25 a sub-bucket
	e := newOps(t, 4, 3, 2)
	e.empty(t, cfg)
	d := do(t, e.b, "hot", cfg, add(10))
	if got := e.each(t, cfg); !equal64(got, []int64{2, 2, 3, 3}) {
		t.Errorf("Add(10) from sub-bucket 2: the sub-buckets hold %v; want 2 2 3 3", got)
	}
	if d.Remaining != 10 || d.Limit != 100 {
		t.Errorf("Add(10): %+v; want the sum, 10 of 100", d)
	}
	d = do(t, e.b, "hot", cfg, add(3))
	if got := e.each(t, cfg); !equal64(got, []int64{3, 2, 4, 4}) || d.Remaining != 13 {
		t.Errorf("Add(3) more: %v, %+v; want 3 2 4 4, the whole key's 13 in the decision", got, d)
	}
	d = do(t, e.b, "hot", cfg, add(1000))
	if got := e.each(t, cfg); !equal64(got, []int64{25, 25, 25, 25}) || d.Remaining != 100 {
		t.Errorf("Add(1000): %v, %+v; want each full at 25, 100 in all", got, d)
	}
}

// TestResetReplaceInspect: Reset fills every sub-bucket again; Replace
// converts every sub-bucket to its share of the new config, so a plan
// change keeps the key within the new capacity; Inspect sums them.
func TestResetReplaceInspect(t *testing.T) {
	hourly := func(c int64) ratelimit.Config { return config(ratelimit.PerHour(c)) }
	e := newOps(t, 6, 5, 0)
	cfg := hourly(600)
	do(t, e.b, "hot", cfg, upTo(250)) // 100 from 0, 1; 50 from 2
	d := do(t, e.b, "hot", cfg, inspect())
	// RefillAfter is that of sub-bucket 0, the first of the fewest left:
	// 100 an hour.
	if want := (ratelimit.Decision{Allowed: true, Limit: 600, Remaining: 350, ResetAfter: time.Hour, RefillAfter: 36 * time.Second, Bandwidth: "0"}); d != want {
		t.Errorf("Inspect: %+v; want %+v", d, want)
	}
	do(t, e.b, "hot", cfg, reset())
	if got := e.each(t, cfg); !equal64(got, []int64{100, 100, 100, 100, 100, 100}) {
		t.Errorf("after Reset: %v; want each full", got)
	}

	for _, tc := range []struct {
		s    ratelimit.Inheritance
		want []int64
	}{
		{ratelimit.AsIs, []int64{0, 0, 10, 10, 10, 10}},
		{ratelimit.Proportionally, []int64{0, 0, 5, 10, 10, 10}},
		{ratelimit.ResetTokens, []int64{10, 10, 10, 10, 10, 10}},
	} {
		t.Run(tc.s.String(), func(t *testing.T) {
			e := newOps(t, 6, 5, 0)
			do(t, e.b, "hot", hourly(600), upTo(250)) // 0 0 50 100 100 100
			d := do(t, e.b, "hot", hourly(60), replace(tc.s))
			got := e.each(t, hourly(60))
			if !equal64(got, tc.want) || d.Remaining != total(tc.want) || d.Limit != 60 {
				t.Errorf("600/h to 60/h: %v, %+v; want %v", got, d, tc.want)
			}
			if total(got) > 60 {
				t.Errorf("600/h to 60/h holds %d", total(got))
			}
			if n := hammerOnce(t, e.b, hourly(60)); n != total(tc.want) {
				t.Errorf("then admitted %d; want what it held, %d", n, total(tc.want))
			}
		})
	}

	// A plan change met by a Consume converts each sub-bucket as it comes.
	e = newOps(t, 6, 5, 0)
	do(t, e.b, "hot", hourly(600), consume(1))
	if n := hammerOnce(t, e.b, hourly(60)); n > 60 {
		t.Errorf("after a change from 600/h to 60/h, admitted %d", n)
	}
}

// hammerOnce consumes one token at a time, every sub-bucket tried, until
// denied, and returns how many were admitted.
func hammerOnce(t *testing.T, b *Backend, cfg ratelimit.Config) int64 {
	t.Helper()
	var n int64
	for n < 10_000 && do(t, b, "hot", cfg, consume(1)).Allowed {
		n++
	}
	return n
}

// TestWholeKeyDecision: a decision reports the whole key: Limit is the
// configured capacity of the binding bandwidth, Remaining the sub-buckets
// seen scaled up to the key, RetryAfter of a denial the soonest of the
// sub-buckets tried, ResetAfter the latest, RefillAfter that of the
// sub-bucket that decided.
func TestWholeKeyDecision(t *testing.T) {
	t.Run("Allowed", func(t *testing.T) {
		e := newOps(t, 2, 1, 0)
		cfg := config(ratelimit.PerSecond(10).WithID("burst"), ratelimit.PerHour(100).WithID("hourly"))
		d := do(t, e.b, "hot", cfg, consume(1))
		// Sub-bucket 0 (5 a second, 50 an hour) holds 4 of 5 in its
		// binding bandwidth, burst: the key, 4·10/5; its next token is
		// 200 ms away.
		want := ratelimit.Decision{Allowed: true, Limit: 10, Remaining: 8, Consumed: 1, ResetAfter: 72 * time.Second, RefillAfter: 200 * time.Millisecond, Bandwidth: "burst"}
		if d != want {
			t.Errorf("Consume: %+v; want %+v", d, want)
		}
		do(t, e.b, "hot", cfg, consume(4)) // sub-bucket 0's burst empty
		// Sub-bucket 0 denies (0 of 5 left), 1 allows (4 of 5): (0+4)·10/10;
		// 0 is full again once its hourly bandwidth has regained 5 tokens.
		want = ratelimit.Decision{Allowed: true, Limit: 10, Remaining: 4, Consumed: 1, ResetAfter: 5 * 72 * time.Second, RefillAfter: 200 * time.Millisecond, Bandwidth: "burst"}
		if d := do(t, e.b, "hot", cfg, consume(1)); d != want {
			t.Errorf("Consume with sub-bucket 0 empty: %+v; want %+v", d, want)
		}
	})
	t.Run("Denied", func(t *testing.T) {
		e := newOps(t, 2, 1, 1)
		cfg := config(ratelimit.PerSecond(4)) // 2 and 2/s a sub-bucket
		keys := subKeys(t, e.b, "hot")
		do(t, e.mem, keys[0], subConfig(cfg, 2, 0), consume(2))
		e.clock.Advance(250 * time.Millisecond)
		do(t, e.mem, keys[1], subConfig(cfg, 2, 1), consume(2))
		// Sub-bucket 1 (tried first) needs 500ms, 0 needs 250ms more; 1
		// is full again in 1s, 0 in 750ms.
		d := do(t, e.b, "hot", cfg, consume(1))
		want := ratelimit.Decision{Limit: 4, RetryAfter: 250 * time.Millisecond, ResetAfter: time.Second, RefillAfter: 250 * time.Millisecond, Bandwidth: "0"}
		if d != want {
			t.Errorf("Consume of an empty key: %+v; want %+v", d, want)
		}
		if d := do(t, e.b, "hot", cfg, inspect()); d != want {
			t.Errorf("Inspect of an empty key: %+v; want %+v", d, want)
		}
	})
}

// TestFewerSubBucketsThanN: a config with fewer tokens than n uses as many
// sub-buckets as each bandwidth can give one, and no others.
func TestFewerSubBucketsThanN(t *testing.T) {
	rec := newRecorder(newMemory(t, newClock()))
	b := mustNew(t, rec, Keys(6, "hot").WithRetries(5))
	keys := subKeys(t, b, "hot")
	for _, tc := range []struct {
		cfg  ratelimit.Config
		used int
	}{
		{config(ratelimit.PerHour(4)), 4},
		{config(ratelimit.Bandwidth{Capacity: 100, RefillTokens: 3, RefillPeriod: time.Hour, Refill: ratelimit.Interval}), 3},
		{config(ratelimit.PerHour(100), ratelimit.PerSecond(2)), 2},
		{config(ratelimit.Bandwidth{Capacity: 500, RefillTokens: 1, RefillPeriod: time.Hour, Refill: ratelimit.Interval}), 1},
		{config(ratelimit.PerHour(1).WithBurst(500)), 6}, // a greedy rate splits by period
	} {
		t.Run(fmt.Sprint(tc.used), func(t *testing.T) {
			rec.calls()
			do(t, b, "hot", tc.cfg, reset())
			do(t, b, "hot", tc.cfg, upTo(1000))
			do(t, b, "hot", tc.cfg, consume(1))
			do(t, b, "hot", tc.cfg, inspect())
			used := map[string]bool{}
			for _, k := range rec.calls() {
				used[k] = true
			}
			for i, k := range keys {
				if used[k] != (i < tc.used) {
					t.Errorf("sub-bucket %d used: %v; want only the first %d", i, used[k], tc.used)
				}
			}
		})
	}
}
