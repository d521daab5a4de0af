package sharding

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

var algorithms = []ratelimit.Algorithm{
	ratelimit.TokenBucket, ratelimit.GCRA, ratelimit.FixedWindow,
	ratelimit.SlidingWindowLog, ratelimit.SlidingWindowCounter, ratelimit.LeakyBucket,
}

// refillKinds are the refill kinds alg accepts.
func refillKinds(alg ratelimit.Algorithm) []ratelimit.RefillKind {
	switch alg {
	case ratelimit.TokenBucket:
		return []ratelimit.RefillKind{ratelimit.Greedy, ratelimit.Interval, ratelimit.IntervalAligned}
	case ratelimit.FixedWindow:
		return []ratelimit.RefillKind{ratelimit.Greedy, ratelimit.IntervalAligned}
	}
	return []ratelimit.RefillKind{ratelimit.Greedy}
}

// windowed reports whether alg counts requests in windows, which asks
// RefillTokens = Capacity and no InitialTokens.
func windowed(alg ratelimit.Algorithm) bool {
	return alg == ratelimit.FixedWindow || alg == ratelimit.SlidingWindowLog || alg == ratelimit.SlidingWindowCounter
}

// splitConfigs returns valid configs of alg: each refill kind it takes, 1
// to 3 bandwidths, capacities that n seldom divides (7, 1000, 1001, and
// 2^50 or, for the window algorithms, 9999),
// refills of the capacity or of a third of it plus one, InitialTokens nil,
// 0 or two thirds. A combination Validate rejects (2^50 for a window, say)
// is left out.
func splitConfigs(alg ratelimit.Algorithm) map[string]ratelimit.Config {
	capacities := []int64{7, 1000, 1001, ratelimit.MaxCapacity}
	periods := []time.Duration{time.Second, time.Hour, 366 * 24 * time.Hour}
	initials := []string{"nil", "0", "2/3"}
	refills := []string{"C", "C/3+1"}
	if windowed(alg) {
		// A window's RefillTokens is its Capacity, at most one a µs, and a
		// log's at most MaxLogCapacity.
		capacities[3], periods[2] = ratelimit.MaxLogCapacity-1, 24*time.Hour
		initials, refills = initials[:1], refills[:1]
	}
	configs := map[string]ratelimit.Config{}
	for _, kind := range refillKinds(alg) {
		for bands := 1; bands <= 3; bands++ {
			for _, initial := range initials {
				for _, refill := range refills {
					for c0 := range capacities {
						cfg := ratelimit.Config{Algorithm: alg}
						for j := range bands {
							c, p := capacities[(c0+j)%len(capacities)], periods[j]
							r := min(c, int64(p/time.Microsecond))
							if refill == "C/3+1" && j == 0 {
								r = r/3 + 1
							}
							b := ratelimit.Bandwidth{Capacity: c, RefillTokens: r, RefillPeriod: p, Refill: kind}
							if kind == ratelimit.IntervalAligned {
								b.AlignedStart = epoch.Add(-17 * time.Minute)
							}
							switch initial {
							case "0":
								b = b.WithInitialTokens(0)
							case "2/3":
								b = b.WithInitialTokens(c / 3 * 2)
							}
							cfg.Bandwidths = append(cfg.Bandwidths, b)
						}
						if cfg.Validate() == nil {
							name := fmt.Sprintf("%v/%v/bands=%d/initial=%s/refill=%s/C0=%d", alg, kind, bands, initial, refill, capacities[c0])
							configs[name] = cfg
						}
					}
				}
			}
		}
	}
	return configs
}

// TestSplit: for every config and n, the sub-buckets' capacities, refills
// and initial tokens add up to the config's exactly, each sub-bucket's
// InitialTokens stays within its Capacity, parts gives every bandwidth
// at least a token a sub-bucket, minShare is the smallest sub-capacity,
// and checkSplit finds the first sub-bucket whose config is invalid.
func TestSplit(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			configs := splitConfigs(alg)
			if len(configs) < 10 {
				t.Fatalf("only %d valid configs of %v to split", len(configs), alg)
			}
			invalid := 0
			for name, cfg := range configs {
				for n := 2; n <= MaxSubBuckets; n++ {
					if !checkSplitMath(t, name, cfg, n) {
						invalid++
					}
				}
			}
			t.Logf("%d configs × %d values of n: %d splits invalid", len(configs), MaxSubBuckets-1, invalid)
		})
	}
}

// checkSplitMath checks cfg split n ways, and reports whether every
// sub-bucket's config is valid.
func checkSplitMath(t *testing.T, name string, cfg ratelimit.Config, n int) (valid bool) {
	t.Helper()
	m := parts(cfg, n)
	want := n
	for ; want > 1; want-- { // the most that give every bandwidth a token of Capacity and some refill
		ok := true
		for _, b := range cfg.Bandwidths {
			greedyRate := b.Refill == ratelimit.Greedy && !windowed(cfg.Algorithm) && b.RefillPeriod <= ratelimit.MaxRefillPeriod/time.Duration(want)
			ok = ok && b.Capacity >= int64(want) && (greedyRate || b.RefillTokens >= int64(want))
		}
		if ok {
			break
		}
	}
	if m != want || m < 1 {
		t.Fatalf("%s: parts(n=%d) = %d; want %d, the most that give every bandwidth a token of Capacity and some refill", name, n, m, want)
	}
	subs := make([]ratelimit.Config, m)
	for i := range subs {
		subs[i] = subConfig(cfg, m, i)
	}
	smallest, firstInvalid := int64(ratelimit.MaxCapacity), -1
	for i, sub := range subs {
		if sub.Algorithm != cfg.Algorithm || len(sub.Bandwidths) != len(cfg.Bandwidths) {
			t.Fatalf("%s: sub-bucket %d of %d: %+v is not a split of %+v", name, i, m, sub, cfg)
		}
		for j, b := range sub.Bandwidths {
			o := cfg.Bandwidths[j]
			// A greedy rate is split by a period m times as long, the
			// same RefillTokens; anything else by its RefillTokens.
			byPeriod := m > 1 && b.RefillPeriod == o.RefillPeriod*time.Duration(m) && b.RefillTokens == o.RefillTokens
			if b.ID != o.ID || b.RefillPeriod != o.RefillPeriod && !byPeriod || b.Refill != o.Refill || !b.AlignedStart.Equal(o.AlignedStart) ||
				byPeriod && (o.Refill != ratelimit.Greedy || windowed(cfg.Algorithm)) {
				t.Fatalf("%s: sub-bucket %d of %d: bandwidth %d changed beyond its numbers: %+v of %+v", name, i, m, j, b, o)
			}
			if b.Capacity < 1 || b.RefillTokens < 1 || b.Initial() > b.Capacity || (b.InitialTokens == nil) != (o.InitialTokens == nil) {
				t.Fatalf("%s: sub-bucket %d of %d: bandwidth %d: Capacity %d, RefillTokens %d, InitialTokens %d (nil: %v)",
					name, i, m, j, b.Capacity, b.RefillTokens, b.Initial(), b.InitialTokens == nil)
			}
			smallest = min(smallest, b.Capacity)
		}
		if firstInvalid < 0 && sub.Validate() != nil {
			firstInvalid = i
		}
	}
	for j, o := range cfg.Bandwidths {
		// r sums the sub-buckets' refill rates in RefillTokens per m
		// periods: a sub-bucket refills either a share of RefillTokens
		// a period, or RefillTokens every m periods.
		var c, r, init int64
		for _, sub := range subs {
			sb := sub.Bandwidths[j]
			c += sb.Capacity
			r += sb.RefillTokens * int64(o.RefillPeriod*time.Duration(m)/sb.RefillPeriod)
			init += sb.Initial()
		}
		r /= int64(m)
		if c != o.Capacity || r != o.RefillTokens || init != o.Initial() {
			t.Fatalf("%s: split %d ways, bandwidth %d adds up to Capacity %d, RefillTokens %d, InitialTokens %d; want %d, %d, %d",
				name, m, j, c, r, init, o.Capacity, o.RefillTokens, o.Initial())
		}
	}
	if got := minShare(cfg, m); got != smallest {
		t.Fatalf("%s: minShare(n=%d) = %d; the smallest sub-capacity is %d", name, m, got, smallest)
	}
	if i, err := checkSplit(cfg, m); i != firstInvalid || (err == nil) != (i < 0) {
		t.Fatalf("%s: checkSplit(n=%d) = %d, %v; the first invalid sub-bucket is %d", name, m, i, err, firstInvalid)
	}
	return firstInvalid < 0
}

// TestSubConfigCopies: a sub-bucket's config shares no memory with the
// config it splits.
func TestSubConfigCopies(t *testing.T) {
	cfg := config(ratelimit.PerHour(10).WithInitialTokens(5))
	sub := subConfig(cfg, 3, 0)
	sub.Bandwidths[0].Capacity = 99
	*sub.Bandwidths[0].InitialTokens = 99
	if cfg.Bandwidths[0].Capacity != 10 || *cfg.Bandwidths[0].InitialTokens != 5 {
		t.Fatalf("changing a sub-config changed the config: %+v", cfg.Bandwidths[0])
	}
}

// invalidSplit is the package doc's example of a valid config whose
// split is not, for some n: 7100 tokens refilled 100 at a time every 366
// days take 71 periods to fill, just within 2^51µs; split 3 ways, the
// second sub-bucket's 2367 refilled 33 at a time take 72.
var invalidSplit = config(ratelimit.Bandwidth{Capacity: 7100, RefillTokens: 100, RefillPeriod: ratelimit.MaxRefillPeriod, Refill: ratelimit.Interval})

// TestInvalidShare: a valid config whose split is not is an error that
// names the sub-bucket and the field, for every op, and no sub-bucket is
// touched. Split 4 ways, the same config is fine.
func TestInvalidShare(t *testing.T) {
	cfg := invalidSplit
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(newMemory(t, newClock()))
	b := mustNew(t, rec, Keys(3, "three"), Keys(4, "four"))
	reqs := []ratelimit.Request{consume(1), estimate(1), reserve(1, time.Second), upTo(5), add(5), reset(), replace(ratelimit.AsIs), inspect()}
	for _, req := range reqs {
		_, err := b.Do(context.Background(), "three", cfg, req)
		want := fmt.Sprintf(`ratelimit: invalid config: sharding: %v on key "three": the config split 3 ways is invalid for sub-bucket 1 of 3: Bandwidths[0].Capacity 2367 refilled by 33 per 8784h0m0s takes more than 2^51µs`, req.Op)
		if !errors.Is(err, ratelimit.ErrInvalidConfig) || err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%v: %v;\nwant ErrInvalidConfig starting %q", req.Op, err, want)
		}
		if calls := rec.calls(); len(calls) != 0 {
			t.Errorf("%v: the invalid split reached the backend: %q", req.Op, calls)
		}
		if _, err := b.Do(context.Background(), "four", cfg, req); err != nil {
			t.Errorf("%v split 4 ways: %v", req.Op, err)
		}
		rec.calls()
	}
}

// TestInvalidShareExample: the package doc's example splits 2 and 4
// ways, not 3; and the greedy configs whose refill could not be split
// in tokens (PerHour(100_000_000) 3 or 6 ways) are split by period.
func TestInvalidShareExample(t *testing.T) {
	for n, valid := range map[int]bool{2: true, 3: false, 4: true} {
		if i, err := checkSplit(invalidSplit, parts(invalidSplit, n)); (err == nil) != valid {
			t.Errorf("the example split %d ways: sub-bucket %d: %v; want valid %v", n, i, err, valid)
		}
	}
	greedy := config(ratelimit.PerHour(100_000_000))
	for n := 2; n <= MaxSubBuckets; n++ {
		if i, err := checkSplit(greedy, parts(greedy, n)); err != nil {
			t.Errorf("PerHour(100_000_000) split %d ways: sub-bucket %d: %v", n, i, err)
		}
	}
}

// FuzzSplit: for any valid single-bandwidth config, token bucket with
// greedy or interval refill, and any n, the split adds up exactly, keeps
// InitialTokens within Capacity, and a decision on it panics nowhere; an
// error is one of bad input, and an invalid config only where checkSplit
// says the split is invalid.
func FuzzSplit(f *testing.F) {
	f.Add(int64(1000), int64(1000), int64(3_600_000_000), int64(-1), uint8(4))
	f.Add(int64(1001), int64(7), int64(1_000_000), int64(500), uint8(6))
	f.Add(int64(ratelimit.MaxCapacity), int64(1_000_000), int64(1_000_000), int64(0), uint8(3))
	f.Add(int64(7), int64(7), int64(60_000_000), int64(7), uint8(62))
	f.Add(int64(11), int64(6), int64(31_622_400_000_000), int64(-1), uint8(4))
	f.Add(int64(1), int64(6), int64(31_622_399_999_999), int64(-1), uint8(0)) // one sub-bucket: nothing split
	clock := newClock()
	mem := newMemory(f, clock)
	backends := map[int]*Backend{}
	f.Fuzz(func(t *testing.T, capacity, refill, periodMicros, initial int64, nn uint8) {
		n := 2 + int(nn)%(MaxSubBuckets-1)
		for _, kind := range []ratelimit.RefillKind{ratelimit.Greedy, ratelimit.Interval} {
			b := ratelimit.Bandwidth{Capacity: capacity, RefillTokens: refill, RefillPeriod: time.Duration(periodMicros) * time.Microsecond, Refill: kind}
			if periodMicros > int64(ratelimit.MaxRefillPeriod/time.Microsecond) {
				return // RefillPeriod would overflow into a valid one
			}
			if initial >= 0 {
				b = b.WithInitialTokens(initial)
			}
			cfg := config(b)
			if cfg.Validate() != nil {
				return
			}
			valid := checkSplitMath(t, "fuzz", cfg, n)
			sb := backends[n]
			if sb == nil {
				sb = mustNew(t, mem, Keys(n, "hot"))
				backends[n] = sb
			}
			for _, req := range []ratelimit.Request{consume(1), upTo(3), add(2), inspect()} {
				_, err := sb.Do(context.Background(), "hot", cfg, req)
				switch {
				case err == nil:
				case errors.Is(err, ratelimit.ErrInvalidConfig):
					if valid {
						t.Fatalf("%+v split %d ways: %v: %v, though every sub-config is valid", b, n, req.Op, err)
					}
				default:
					t.Fatalf("%+v split %d ways: %v: %v", b, n, req.Op, err)
				}
				if err == nil && !valid {
					t.Fatalf("%+v split %d ways: %v passed, though a sub-config is invalid", b, n, req.Op)
				}
			}
			clock.Advance(time.Duration(capacity%1000) * time.Millisecond)
		}
	})
}

// TestSplitCache: a config found valid is not checked again, but a
// config not yet seen is, whatever was checked before it, and an invalid
// split is never remembered.
func TestSplitCache(t *testing.T) {
	b := mustNew(t, newMemory(t, newClock()), Keys(3, "hot"))
	valid := config(ratelimit.PerHour(600))
	for range 3 {
		do(t, b, "hot", valid, consume(1))
	}
	if !b.splits.valid(valid, 3) {
		t.Fatal("a config split 3 ways and found valid is not remembered")
	}
	for range 3 {
		if _, err := b.Do(context.Background(), "hot", invalidSplit, consume(1)); !errors.Is(err, ratelimit.ErrInvalidConfig) {
			t.Fatalf("an invalid split after a valid one: %v; want ErrInvalidConfig", err)
		}
	}
	if b.splits.valid(invalidSplit, 3) {
		t.Fatal("an invalid split is remembered as valid")
	}
}
