package lease_test

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
)

// FuzzDecay checks the lapse math against big-integer arithmetic: the
// tokens a bandwidth refills in dt µs, rounded up, or MaxInt64 if more.
func FuzzDecay(f *testing.F) {
	f.Add(int64(1000), int64(time.Second), int64(1))
	f.Add(int64(1), int64(time.Microsecond), int64(math.MaxInt64))
	f.Add(int64(3), int64(7*time.Microsecond), int64(10))
	f.Add(int64(1<<50), int64(1<<62), int64(1<<40))
	f.Fuzz(func(t *testing.T, tokens, period, dt int64) {
		bw := ratelimit.Bandwidth{Capacity: 1, RefillTokens: tokens, RefillPeriod: time.Duration(period)}
		if tokens < 1 || bw.PeriodMicros() < 1 {
			return
		}
		got := lease.Decay(&bw, dt)
		want := new(big.Int)
		if dt > 0 {
			p := big.NewInt(bw.PeriodMicros())
			want.Mul(big.NewInt(tokens), big.NewInt(dt))
			want.Add(want, p).Sub(want, big.NewInt(1)).Quo(want, p) // ⌈tokens·dt/p⌉
			if !want.IsInt64() {
				want.SetInt64(math.MaxInt64)
			}
		}
		if got != want.Int64() {
			t.Fatalf("decay(%d tokens per %dµs, %dµs) = %d, want %s", tokens, bw.PeriodMicros(), dt, got, want)
		}
	})
}

// FuzzBound runs instances leasing a random token bucket or GCRA at a
// random load, refills landing at once, and checks that no interval
// admits more than C + r·T.
func FuzzBound(f *testing.F) {
	f.Add(uint16(100), uint16(1000), uint16(1000), uint64(1), uint8(2), uint8(15), false)
	f.Add(uint16(1), uint16(1), uint16(1), uint64(2), uint8(3), uint8(40), true)
	f.Add(uint16(7), uint16(3), uint16(10), uint64(3), uint8(1), uint8(5), false)
	f.Fuzz(func(t *testing.T, capacity, tokens, periodMs uint16, seed uint64, instances, load10 uint8, gcra bool) {
		if capacity == 0 || tokens == 0 || periodMs == 0 || instances == 0 || instances > 5 || load10 == 0 {
			return
		}
		cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{
			ratelimit.Every(time.Duration(periodMs)*time.Millisecond, int64(tokens)).WithBurst(int64(capacity)),
		}}
		if gcra {
			cfg.Algorithm = ratelimit.GCRA
		}
		if cfg.Validate() != nil {
			return
		}
		clock := ratelimittest.NewClock(time.Unix(1e9, 0))
		store := memory.New(memory.WithClock(clock))
		defer store.Close()
		s := newSim(t, clock, store, int(instances), cfg, true, lease.WithMaxShare(0.5))
		adm, _, _ := s.run(t, rand.New(rand.NewPCG(seed, 0)), 500, float64(load10)/10, []int64{1, 1, min(2, int64(capacity))})
		if err := boundError(adm, cfg); err != nil {
			t.Fatal(err)
		}
	})
}
