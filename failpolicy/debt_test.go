package failpolicy_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/failpolicy"
	"github.com/sluicehq/sluice/ratelimit"
)

// outageRun is what a client sending one request a second, alternating
// between two instances, got before, during and after an outage.
type outageRun struct {
	admitted, denied [3]int // before, during, after
	firstDenied      int    // seconds after the outage of the first denial after it; -1 for none
}

// runOutage runs a client within its plan (one request a second, the
// refill rate, alternating between two instances that each say
// WithInstances(instances)) for 10s with the store up, 20s with it down
// and 40s with it back, on a bucket of 10 that refills 10 every 10s.
func runOutage(t *testing.T, instances int) outageRun {
	var run outageRun
	synctest.Test(t, func(t *testing.T) {
		s := newStore(t, nil)
		cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{{Capacity: 10, RefillTokens: 10, RefillPeriod: 10 * time.Second}}}
		ps := [2]*failpolicy.Backend{
			newPolicy(t, s, failpolicy.Local, failpolicy.WithInstances(instances)),
			newPolicy(t, s, failpolicy.Local, failpolicy.WithInstances(instances)),
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
			d, err := ps[sec%2].Do(context.Background(), "k", cfg, consume)
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
// request while the store is away, and is then denied 11 of the 40 that
// follow, starting at once: the shares admitted 20 tokens (10 each), all
// owed, and the store, full again at 10, goes 10 into credit, which the
// client's own requests at the refill rate keep from paying back for 11s.
// That is the debt charging whatever the store lost to its cap while away,
// which only the store could tell; docs/operations.md says why it is not
// forgiven. The figures are the same with WithInstances(1), where each
// share is the whole bucket and the debt's cap 20, as with 2 (a share of
// 5, a cap of 10): the client's 10 a share never reach either cap.
func TestDebtAfterOutage(t *testing.T) {
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			r := runOutage(t, n)
			if r.denied != [3]int{0, 0, 11} || r.firstDenied != 0 {
				t.Errorf("denied %v (before, during, after), the first after %ds; want [0 0 11], at once", r.denied, r.firstDenied)
			}
			t.Logf("WithInstances(%d): before %d/%d denied, during %d/%d, after %d/%d (first denial %ds after)", n,
				r.denied[0], r.admitted[0]+r.denied[0], r.denied[1], r.admitted[1]+r.denied[1], r.denied[2], r.admitted[2]+r.denied[2], r.firstDenied)
		})
	}
}
