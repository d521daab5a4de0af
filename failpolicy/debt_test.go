package failpolicy_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/ratelimit"
)

// outageRun is what a client sending one request a second got before,
// during and after an outage.
type outageRun struct {
	admitted, denied [3]int // before, during, after
	firstDenied      int    // seconds after the outage of the first denial after it; -1 for none
}

// runOutage runs a client within its plan (one request a second, the
// refill rate, to each of the given instances in turn, each saying
// WithInstances(instances)) for 10s with the store up, 20s with it down
// and 40s with it back, on a bucket of 10 that refills 10 every 10s.
func runOutage(t *testing.T, policies, instances int) outageRun {
	var run outageRun
	synctest.Test(t, func(t *testing.T) {
		s := newStore(t, nil)
		cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{{Capacity: 10, RefillTokens: 10, RefillPeriod: 10 * time.Second}}}
		ps := make([]*failpolicy.Backend, policies)
		for i := range ps {
			ps[i] = newPolicy(t, s, failpolicy.Local, failpolicy.WithInstances(instances))
		}
		run.firstDenied = -1
		for sec := range 70 {
			phase := 0
			switch {
			case sec == 10:
				s.fail(errDown)
			case sec == 30:
				s.heal()
			}
			if sec >= 10 {
				phase = 1
			}
			if sec >= 30 {
				phase = 2
			}
			d, err := ps[sec%policies].Do(context.Background(), "k", cfg, consume)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				run.admitted[phase]++
			} else {
				run.denied[phase]++
				if phase == 2 && run.firstDenied < 0 {
					run.firstDenied = sec - 30
				}
			}
			time.Sleep(time.Second)
		}
	})
	return run
}

// TestDebtAfterOutage measures who pays the debt (docs/operations.md): a
// client that stays within its plan through an outage is admitted every
// request while the store is away, 20 in all, owed by the shares that
// admitted them. Charged as of when they were admitted, they refill from
// then: with one instance the store replays them as it would have decided
// them, so the client, over-admitted by nothing, is denied nothing after
// the outage. With two instances taking turns, the one that reaches the
// store second finds it already moved on past its admissions, so its 10
// are charged at once on a full bucket, and the client is denied one
// request (docs/operations.md says why no store of a few numbers a key can
// do better). Charged as of the charge, as before Request.Ago, all 20
// tokens went 10 into credit on a full bucket: 11 denials, either way.
func TestDebtAfterOutage(t *testing.T) {
	for _, tc := range []struct {
		policies, instances int
		denied              int
	}{
		{1, 1, 0},
		{2, 1, 1},
		{2, 2, 1},
	} {
		t.Run(fmt.Sprintf("%d of WithInstances(%d)", tc.policies, tc.instances), func(t *testing.T) {
			r := runOutage(t, tc.policies, tc.instances)
			if r.denied != [3]int{0, 0, tc.denied} || tc.denied > 0 && r.firstDenied != 1 {
				t.Errorf("denied %v (before, during, after), the first %ds after; want [0 0 %d], the first 1s after", r.denied, r.firstDenied, tc.denied)
			}
			t.Logf("%d instances of WithInstances(%d): before %d/%d denied, during %d/%d, after %d/%d (first denial %ds after)", tc.policies, tc.instances,
				r.denied[0], r.admitted[0]+r.denied[0], r.denied[1], r.admitted[1]+r.denied[1], r.denied[2], r.admitted[2]+r.denied[2], r.firstDenied)
		})
	}
}

// TestChargeResumes: a debt of three admissions, a second apart, is
// charged a slot at a time, each as of its own time. When the store
// refuses the second slot's charge, the call is decided by the share, and
// the next call charges the second and third slots (and the degraded
// call's own admission), not the first again: the store ends charged each
// token once.
func TestChargeResumes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newStore(t, nil)
		p := newPolicy(t, s, failpolicy.Local, failpolicy.WithBreaker(100, time.Hour))
		cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(10)}}
		s.fail(errDown)
		for range 3 {
			if d, err := p.Do(context.Background(), "k", cfg, consume); err != nil || !d.Allowed || !d.Degraded {
				t.Fatalf("with the store down: %+v, %v", d, err)
			}
			time.Sleep(time.Second)
		}
		s.heal()
		var agos []time.Duration
		refused := false
		refuse := func(req ratelimit.Request) bool {
			if req.Ago > 0 {
				agos = append(agos, req.Ago)
			}
			if req.Ago == 2*time.Second && !refused { // the second admission's, once
				refused = true
				return true
			}
			return false
		}
		s.refuse.Store(&refuse)
		if d, err := p.Do(context.Background(), "k", cfg, consume); err != nil || !d.Degraded {
			t.Fatalf("the second slot's charge refused: %+v, %v; want a degraded decision", d, err)
		}
		if want := []time.Duration{3 * time.Second, 2 * time.Second}; !slices.Equal(agos, want) {
			t.Fatalf("charges as of %v ago; want %v", agos, want)
		}
		agos = nil
		before := s.calls.Load()
		if d, err := p.Do(context.Background(), "k", cfg, consume); err != nil || d.Degraded || !d.Allowed {
			t.Fatalf("the store back: %+v, %v", d, err)
		}
		if n := s.calls.Load() - before; n != 4 {
			t.Errorf("%d calls reached the store; want 4: the two slots left, the degraded call's own admission (now) and the request", n)
		}
		if want := []time.Duration{2 * time.Second, time.Second}; !slices.Equal(agos, want) {
			t.Errorf("charges as of %v ago; want %v, the slots left", agos, want)
		}
		// Taken from the store: the four admissions, once each, and the
		// request.
		in, err := s.mem.Do(context.Background(), "k", cfg, ratelimit.Request{Op: ratelimit.Inspect})
		if err != nil {
			t.Fatal(err)
		}
		if in.Remaining != 5 {
			t.Errorf("Inspect: %+v; want 5 remaining: 10 less the 4 charged and the request", in)
		}
	})
}
