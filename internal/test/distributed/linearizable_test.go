package distributed_test

import (
	"context"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/sluicehq/sluice/internal/test/harness"
	"github.com/sluicehq/sluice/ratelimit"
)

// mixedRequests are the calls of a linearizability run: every op the model
// knows, with token counts that keep a bucket of capacity 10 moving
// between empty and full.
func mixedRequests(seed uint64, n int) []ratelimit.Request {
	r := rand.New(rand.NewPCG(seed, 0))
	reqs := make([]ratelimit.Request, n)
	for i := range reqs {
		tokens := 1 + r.Int64N(3)
		switch r.IntN(10) {
		case 0, 1, 2, 3:
			reqs[i] = ratelimit.Request{Op: ratelimit.Consume, Tokens: tokens}
		case 4, 5:
			reqs[i] = ratelimit.Request{Op: ratelimit.ConsumeUpTo, Tokens: tokens + 1}
		case 6, 7:
			reqs[i] = ratelimit.Request{Op: ratelimit.Add, Tokens: tokens}
		case 8:
			reqs[i] = ratelimit.Request{Op: ratelimit.Estimate, Tokens: tokens}
		default:
			reqs[i] = ratelimit.Request{Op: ratelimit.Inspect}
		}
	}
	return reqs
}

// refillRun is linearizabilityRun on refillBandwidth, which gains a token
// every 10ms, checked against refillModel.
func refillRun(top topology, backend string) run {
	r := linearizabilityRun(top, backend)
	r.bandwidth, r.refill = refillBandwidth, true
	return r
}

// linearizabilityRun is the run the checker gets: 3 processes × 4
// goroutines, 300 calls of every op on one bucket of capacity 10. (With
// more goroutines at once the search can take minutes.)
func linearizabilityRun(top topology, backend string) run {
	return run{
		top: top, backend: backend,
		bandwidth: harness.NoRefill(10),
		processes: 3, goroutines: 4, attempts: 300,
	}
}

// checkTimeout bounds one porcupine check; the histories here take
// milliseconds.
const checkTimeout = time.Minute

// linearizable makes r's run with mixed ops and checks its history.
func linearizable(t *testing.T, c client, r run, seed uint64) (porcupine.CheckResult, porcupine.LinearizationInfo, []harness.Call, marks) {
	t.Helper()
	spec := r.spec(newKey(t))
	requests, hist := mixedRequests, history
	if r.refill {
		requests, hist = refillRequests, timedHistory
	}
	spec.Requests = requests(seed, spec.Attempts)
	calls, m := execute(t, c, r, spec)
	ops, err := hist(spec, calls)
	if err != nil {
		t.Fatal(err)
	}
	res, info := porcupine.CheckOperationsVerbose(r.model(), ops, checkTimeout)
	return res, info, calls, m
}

// model is the sequential model r's history is checked against.
func (r run) model() porcupine.Model {
	if r.refill {
		return refillModel(r.bandwidth.Capacity, refillScale)
	}
	return bucketModel(r.bandwidth.Capacity)
}

// inconclusiveRuns bounds the runs checkLinearizable makes while
// porcupine's check of each comes back Unknown (it ran out of
// checkTimeout, which a loaded machine can make it do).
const inconclusiveRuns = 3

// checkLinearizable makes r's run with mixed ops and fails t unless
// porcupine finds its history linearizable. A violation fails at once; a
// check that runs out of time proves nothing either way, so the run is
// made again, on a new bucket, up to inconclusiveRuns in all.
func checkLinearizable(t *testing.T, c client, r run) {
	t.Helper()
	var (
		info  porcupine.LinearizationInfo
		calls []harness.Call
		m     marks
	)
	res, runs := untilConclusive(func() porcupine.CheckResult {
		var res porcupine.CheckResult
		res, info, calls, m = linearizable(t, c, r, 1)
		return res
	})
	if runs > 1 {
		t.Logf("%d runs: porcupine's check of the first %d ran out of %v", runs, runs-1, checkTimeout)
	}
	if res != porcupine.Ok {
		t.Errorf("porcupine: %v; visualization in %s", res, visualize(r, info))
	}
	n := harness.Count(calls)
	t.Logf("%d processes × %d goroutines, %d ops (%d allowed, %d denied, %d failed; the longest took %v): %v",
		r.processes, r.goroutines, n.Calls, n.Admitted, n.Denied, n.Failed, n.Longest.Round(time.Millisecond), res)
	if r.fault != nil {
		logFault(t, r, calls, m)
	}
}

// untilConclusive calls check until it returns Ok or Illegal, at most
// inconclusiveRuns times, and returns its last result and how many runs
// it made.
func untilConclusive(check func() porcupine.CheckResult) (porcupine.CheckResult, int) {
	res, runs := check(), 1
	for ; res == porcupine.Unknown && runs < inconclusiveRuns; runs++ {
		res = check()
	}
	return res, runs
}

// TestUntilConclusive: a check that runs out of time is made again, up to
// inconclusiveRuns in all; a violation ends the runs at once, as does a
// pass.
func TestUntilConclusive(t *testing.T) {
	u, ok, bad := porcupine.Unknown, porcupine.Ok, porcupine.Illegal
	for _, tt := range []struct {
		results []porcupine.CheckResult
		want    porcupine.CheckResult
		runs    int
	}{
		{[]porcupine.CheckResult{ok}, ok, 1},
		{[]porcupine.CheckResult{bad, ok}, bad, 1},
		{[]porcupine.CheckResult{u, ok}, ok, 2},
		{[]porcupine.CheckResult{u, bad, ok}, bad, 2},
		{[]porcupine.CheckResult{u, u, u, ok}, u, inconclusiveRuns},
	} {
		i := 0
		got, runs := untilConclusive(func() porcupine.CheckResult { i++; return tt.results[i-1] })
		if got != tt.want || runs != tt.runs || i != runs {
			t.Errorf("%v: %v after %d runs (%d checks); want %v after %d", tt.results, got, runs, i, tt.want, tt.runs)
		}
	}
}

// TestLinearizable checks the recorded histories of both Redis adapters,
// standalone and on the cluster, with porcupine: against bucketModel, and
// with refill against refillModel.
func TestLinearizable(t *testing.T) {
	skipShort(t)
	onEachTopology(t, func(t *testing.T, top topology, c client) {
		for _, backend := range adapters {
			t.Run(backend, func(t *testing.T) { checkLinearizable(t, c, linearizabilityRun(top, backend)) })
			t.Run(backend+"/Refill", func(t *testing.T) { checkLinearizable(t, c, refillRun(top, backend)) })
		}
	})
}

// TestRacyIsCaught shows that the checks can fail: the racy backend reads,
// decides in Go and writes back. porcupine must find its lost updates, and
// its admissions must break the count's bounds. Overlap is a matter of
// scheduling, so each check gets three runs to show it.
func TestRacyIsCaught(t *testing.T) {
	skipShort(t)
	top := standalone(t)
	c := newClient(t, top)
	for _, r := range []run{linearizabilityRun(top, harness.BackendRacy), refillRun(top, harness.BackendRacy)} {
		name := "Linearizable"
		if r.refill {
			name += "/Refill"
		}
		t.Run(name, func(t *testing.T) {
			for seed := range uint64(3) {
				res, _, calls, _ := linearizable(t, c, r, seed)
				n := harness.Count(calls)
				t.Logf("run %d: %d ops (%d allowed, %d denied): %v", seed, n.Calls, n.Admitted, n.Denied, res)
				if res == porcupine.Illegal {
					return
				}
			}
			t.Error("porcupine found no violation in 3 runs of the racy backend")
		})
	}
	t.Run("Admission", func(t *testing.T) {
		r := admissionRun(top, harness.BackendRacy, harness.NoRefill(1000))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		for range 3 {
			res, err := harness.Measure(ctx, harness.Run{Program: harness.Program{Path: build.Bin(t)}, Processes: r.processes, Spec: r.spec(newKey(t))})
			if err != nil {
				t.Fatal(err)
			}
			err = res.Check()
			t.Logf("%d calls: admitted %d, remaining %d: %v", res.Tally.Calls, res.Tally.Admitted, res.Remaining, err)
			if err != nil {
				return
			}
		}
		t.Error("the racy backend stayed within the bounds in 3 runs")
	})
}

// visualize writes porcupine's view of a failed check of r to a file that
// outlives the test, and returns its path.
func visualize(r run, info porcupine.LinearizationInfo) string {
	return visualizeModel(r.model(), info)
}

// visualizeModel writes porcupine's view of a failed check against model
// to a file that outlives the test, and returns its path.
func visualizeModel(model porcupine.Model, info porcupine.LinearizationInfo) string {
	f, err := os.CreateTemp("", "sluice-linearizability-*.html")
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if err := porcupine.Visualize(model, info, f); err != nil {
		return err.Error()
	}
	return f.Name()
}
