package distributed_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/test/harness"
	"github.com/sluicehq/sluice/internal/test/servers"
	"github.com/sluicehq/sluice/ratelimit"
)

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
	onEachTopology(t, func(t *testing.T, top topology, c client) {
		for _, backend := range adapters {
			for _, b := range harness.Buckets(1000) {
				t.Run(backend+"/"+b.Name, func(t *testing.T) {
					r := admissionRun(top, backend, b.Bandwidth)
					r.algorithm = b.Algorithm
					checkAdmission(t, c, r)
				})
			}
		}
	})
}

// checkAdmission makes r's run with harness.Measure and checks the count
// admitted against the bounds. Without a fault no call may fail, and a run
// without refill must admit exactly Capacity. With one, checkFault must
// pass.
func checkAdmission(t *testing.T, c client, r run) {
	t.Helper()
	spec := r.withHolds(r.spec(newKey(t)))
	var m marks
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	res, err := harness.Measure(ctx, harness.Run{
		Program: harness.Program{Path: build.Bin(t)}, Processes: r.processes, Spec: spec,
		Drive: func(in *harness.Instances) error {
			m = r.drive(t, c, spec.Key, servers.WrapInstances(in))
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	n, b := res.Tally, res.Bounds
	if r.fault == nil && (n.Calls != r.attempts || n.Failed != 0) {
		t.Fatalf("%d calls, %d failed; want %d calls, none failed", n.Calls, n.Failed, r.attempts)
	}
	if err := res.Check(); err != nil {
		t.Error(err)
	}
	t.Logf("%d processes × %d goroutines, %d calls in %v (%.0f/s): admitted %d, denied %d, failed %d (%d tokens unknown), remaining %d; bound [%d − unknown, %d] over %v of server time",
		r.processes, r.goroutines, n.Calls, n.Span().Round(time.Millisecond), n.Rate(),
		n.Admitted, n.Denied, n.Failed, n.Unknown, res.Remaining, b.Low, b.High, b.Span.Round(time.Millisecond))
	if r.fault != nil {
		logFault(t, r, res.Calls, m)
	}
}

// logFault fails t unless checkFault passes r's run, and logs what the
// calls during and after the fault did.
func logFault(t *testing.T, r run, calls []harness.Call, m marks) {
	t.Helper()
	if err := checkFault(r, calls, m); err != nil {
		t.Error(err)
	}
	during, after := m.split(calls)
	d, a := harness.Count(during), harness.Count(after)
	t.Logf("during the fault (%v): %d calls, %d decided, %d failed; after it: %d calls, %d decided, %d failed",
		time.Duration(m.healed-m.struck).Round(time.Millisecond), d.Calls, d.Admitted+d.Denied, d.Failed, a.Calls, a.Admitted+a.Denied, a.Failed)
}
