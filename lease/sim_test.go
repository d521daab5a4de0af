package lease_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/ratelimit/ratelimittest"
	"github.com/sluicehq/sluice/sharding"
)

// admission is one admitted Consume: n tokens at µs at.
type admission struct{ at, n int64 }

// checkBound fails t unless boundError finds adm within cfg's bound.
func checkBound(t *testing.T, adm []admission, cfg ratelimit.Config) {
	t.Helper()
	if err := boundError(adm, cfg); err != nil {
		t.Fatal(err)
	}
}

// boundError returns an error naming an interval between two admissions
// of adm (in time order) that admitted more than C + ⌊r·T⌋ tokens for a
// bandwidth of cfg, or nil. The count from i to j is at most
// C + r·(t_j − t_i) for all i ≤ j iff, with R tokens every P µs,
// (tokens to j)·P − R·t_j − min over i ≤ j of (tokens before i)·P − R·t_i
// is at most C·P.
func boundError(adm []admission, cfg ratelimit.Config) error {
	for bi, bw := range cfg.Bandwidths {
		p, rt, c := bw.PeriodMicros(), bw.RefillTokens, bw.Capacity
		var before, lowBefore int64 // tokens admitted before j, before lowAt
		lowest := int64(math.MaxInt64)
		lowAt := 0
		for j, a := range adm {
			if v := before*p - rt*a.at; v < lowest {
				lowest, lowAt, lowBefore = v, j, before
			}
			before += a.n
			if (before*p-rt*a.at)-lowest > c*p {
				return fmt.Errorf("bandwidth %d: %d tokens admitted from µs %d to µs %d, more than C + r·T = %d + %d×%dµs/%dµs",
					bi, before-lowBefore, adm[lowAt].at, a.at, c, rt, a.at-adm[lowAt].at, p)
			}
		}
	}
	return nil
}

// TestBoundError: the check finds an interval over the bound, and only
// such an interval.
func TestBoundError(t *testing.T) {
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1000).WithBurst(10)}} // a token a ms
	var within, over []admission
	for i := range 10 {
		within = append(within, admission{at: int64(i), n: 1}) // the burst
	}
	within = append(within, admission{at: 1000, n: 1}, admission{at: 2000, n: 1}) // a token a ms after
	over = append(slices.Clone(within), admission{at: 2500, n: 1})
	if err := boundError(within, cfg); err != nil {
		t.Errorf("within the bound: %v", err)
	}
	err := boundError(over, cfg)
	if want := "bandwidth 0: 13 tokens admitted from µs 0 to µs 2500, more than C + r·T = 10 + 1000×2500µs/1000000µs"; err == nil || err.Error() != want {
		t.Errorf("over the bound: %v; want %s", err, want)
	}
}

// sim is a run of instances, each a lease.Backend over one shared store,
// on one fake clock.
type sim struct {
	clock     *ratelimittest.Clock
	instances []*lease.Backend
	cfg       ratelimit.Config
	key       string
	// wait makes each call's refill land before the next call:
	// deterministic. Without it the refills run on goroutines of their
	// own while the clock moves on.
	wait bool
}

// newSim starts n instances leasing key over store (built on clock).
func newSim(t testing.TB, clock *ratelimittest.Clock, store ratelimit.Backend, n int, cfg ratelimit.Config, wait bool, opts ...lease.Option) *sim {
	s := &sim{clock: clock, cfg: cfg, key: "hot", wait: wait}
	for range n {
		// A refill on the memory store takes µs, but a loaded machine can
		// leave its goroutine waiting far longer than the default second.
		b, err := lease.New(store, append([]lease.Option{lease.Keys(s.key), lease.WithClock(clock), lease.WithRefillTimeout(time.Minute)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		s.instances = append(s.instances, b)
	}
	return s
}

// run makes calls Consumes, arriving at load × the first bandwidth's rate
// on random instances, and returns what was admitted, the denials and the
// lease stats summed.
func (s *sim) run(t testing.TB, rng *rand.Rand, calls int, load float64, sizes []int64) ([]admission, int, lease.Stats) {
	t.Helper()
	bw := s.cfg.Bandwidths[0]
	meanGap := float64(bw.PeriodMicros()) / float64(bw.RefillTokens) / load // µs between calls
	var adm []admission
	denied := 0
	start := s.clock.Now()
	for range calls {
		s.clock.Advance(time.Duration(rng.ExpFloat64()*meanGap*1000) * time.Nanosecond)
		in := s.instances[rng.IntN(len(s.instances))]
		n := sizes[rng.IntN(len(sizes))]
		d, err := in.Do(context.Background(), s.key, s.cfg, ratelimit.Request{Tokens: n})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			adm = append(adm, admission{at: s.clock.Now().Sub(start).Microseconds(), n: n})
		} else {
			denied++
		}
		if s.wait {
			in.WaitRefills()
		}
	}
	var st lease.Stats
	for _, in := range s.instances {
		in.WaitRefills()
		x := in.Stats()
		st.Decisions += x.Decisions
		st.Refills += x.Refills
		st.Leased += x.Leased
		st.Spent += x.Spent
		st.Lapsed += x.Lapsed
	}
	return adm, denied, st
}

// leasableConfigs are configs of every algorithm a lease holds to.
var leasableConfigs = map[string]ratelimit.Config{
	"TokenBucket": {Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1000).WithBurst(200)}},
	"TwoBands": {Bandwidths: []ratelimit.Bandwidth{
		ratelimit.PerSecond(1000).WithBurst(100).WithID("burst"),
		ratelimit.Every(10*time.Second, 6000).WithBurst(3000).WithID("sustained"),
	}},
	"GCRA":        {Algorithm: ratelimit.GCRA, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1000).WithBurst(200)}},
	"LeakyBucket": {Algorithm: ratelimit.LeakyBucket, Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(1000).WithBurst(50)}},
}

// TestBound drives 1, 2 and 5 instances at 50–300% of the limit on one
// memory store and a fake clock, refills landing at once or on their own
// goroutines, and checks that no interval admits more than C + r·T.
func TestBound(t *testing.T) {
	for name, cfg := range leasableConfigs {
		for _, instances := range []int{1, 2, 5} {
			for _, load := range []float64{0.8, 1, 1.5, 3} {
				for _, wait := range []bool{true, false} {
					t.Run(fmt.Sprintf("%s/instances=%d/load=%v/wait=%v", name, instances, load, wait), func(t *testing.T) {
						t.Parallel()
						clock := ratelimittest.NewClock(time.Unix(1e9, 0))
						store := memory.New(memory.WithClock(clock))
						t.Cleanup(func() { store.Close() })
						s := newSim(t, clock, store, instances, cfg, wait, lease.WithMaxShare(0.5), lease.WithTarget(50*time.Millisecond))
						rng := rand.New(rand.NewPCG(uint64(instances), uint64(load*10)))
						adm, denied, st := s.run(t, rng, 8000, load, []int64{1, 1, 1, 2, 5})
						checkBound(t, adm, cfg)
						if st.Refills == 0 || st.Spent > st.Leased {
							t.Errorf("stats %+v: want refills, and no more spent than leased", st)
						}
						t.Logf("%d admitted, %d denied; %+v", len(adm), denied, st)
					})
				}
			}
		}
	}
}

// TestBoundStacked checks the bound through sharding (a lease gathered
// from sub-buckets) and a fail policy below the leases.
func TestBoundStacked(t *testing.T) {
	cfg := leasableConfigs["TokenBucket"]
	for _, load := range []float64{0.8, 1, 1.5} {
		t.Run(fmt.Sprint(load), func(t *testing.T) {
			clock := ratelimittest.NewClock(time.Unix(1e9, 0))
			mem := memory.New(memory.WithClock(clock))
			t.Cleanup(func() { mem.Close() })
			store, err := ratelimit.Stack(mem,
				failpolicy.Layer(failpolicy.Closed),
				sharding.Layer(sharding.Keys(4, "hot")),
			)
			if err != nil {
				t.Fatal(err)
			}
			s := newSim(t, clock, store, 3, cfg, true, lease.WithMaxShare(0.25))
			adm, denied, st := s.run(t, rand.New(rand.NewPCG(7, uint64(load*10))), 20000, load, []int64{1})
			checkBound(t, adm, cfg)
			t.Logf("%d admitted, %d denied; %+v", len(adm), denied, st)
		})
	}
}
