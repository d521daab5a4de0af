package distributed_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/test/harness"
	"github.com/sluicehq/sluice/internal/test/servers"
)

// pauseFor is how long masterPaused keeps the master paused at least:
// long enough for the calls with a 200ms timeout to fail, far shorter
// than the cluster's node timeout, so the other masters never mark it
// failed.
const pauseFor = time.Second

// masterPaused pauses the cluster master that holds the bucket with
// SIGSTOP, for pauseFor or until every call during the fault has started,
// whichever is later. Calls with a shorter timeout fail, and those
// already sent run at the resume; calls with a longer one wait. No call
// sent during the pause can decide before the resume. It strikes once no
// call is in flight: a call of the first phase caught by the pause would
// hold its goroutine, and so the pause, for up to its 10s timeout, and a
// master paused past the node timeout leaves the cluster down.
var masterPaused = &fault{
	name:   "MasterPaused",
	quiet:  true,
	stalls: true,
	inject: func(t *testing.T, c client, r run, key string, _ *servers.Instances) func() {
		master := c.master(t, r.top, key)
		master.Pause(t)
		struck := time.Now()
		return func() {
			time.Sleep(time.Until(struck.Add(pauseFor)))
			master.Resume(t)
		}
	},
	during: func(c harness.Call, m marks) error {
		if c.Err == "" && c.End < m.healing {
			return fmt.Errorf("instance %d, attempt %d decided %v after the pause and before the resume: the master was not paused",
				c.Instance, c.Attempt, time.Duration(c.End-m.struck))
		}
		return nil
	},
}

// instanceKilled releases instance 0 alone into the fault's phase, and
// kills it with SIGKILL once each of its goroutines has started a call
// there: they are in flight, or just done, and may have taken effect
// unreported. Instance 0 cannot have finished: at worst it holds at the
// end of the phase. The others go on, and every call they make after the
// kill must decide.
var instanceKilled = &fault{
	name: "InstanceKilled",
	inject: func(t *testing.T, _ client, r run, _ string, in *servers.Instances) func() {
		in.Release(t, 0)
		in.WaitStarted(t, 0, r.faultAfter/r.processes+r.goroutines)
		in.Kill(t, 0)
		return func() {}
	},
	during: func(c harness.Call, _ marks) error {
		switch {
		case c.Instance == 0:
			return fmt.Errorf("instance 0 started attempt %d after it was killed: the kill did not strike", c.Attempt)
		case c.Err != "":
			return fmt.Errorf("instance %d, attempt %d, after instance 0 was killed: %s", c.Instance, c.Attempt, c.Err)
		}
		return nil
	},
}

// faultAdmissionRun is admissionRun with fault f after 500 calls; each
// goroutine makes 4 calls during it. On a fault that stalls they time out
// after 200ms, so that on a paused master they fail, one after another;
// on a killed instance the others' calls keep the default timeout, and
// must decide.
func faultAdmissionRun(top topology, backend string, f *fault) run {
	r := admissionRun(top, backend, harness.NoRefill(1000))
	r.fault, r.faultAfter, r.faultCalls = f, 500, 4
	if f.stalls {
		r.faultTimeout = 200 * time.Millisecond
	}
	return r
}

// faultLinearizabilityRun is linearizabilityRun with fault f after 100
// calls, and one call a goroutine during it. On a fault that stalls its
// calls time out after 2s, outlasting the pause: each call that fails may
// take effect anywhere after its start, and the dozens a 200ms timeout
// makes can keep porcupine searching for minutes. The count runs have
// them.
func faultLinearizabilityRun(top topology, backend string, f *fault) run {
	r := linearizabilityRun(top, backend)
	r.fault, r.faultAfter, r.faultCalls = f, 100, 1
	if f.stalls {
		r.faultTimeout = 2 * time.Second
	}
	return r
}

// TestFaults makes the count and linearizability runs again, through each
// Redis adapter, with a fault between their phases: a paused cluster
// master, and a killed instance (standalone and cluster). Calls that fail
// or go unreported may or may not have taken effect, so the count checks
// bound the bucket's count from both sides and porcupine lets them fall
// anywhere after their start; nothing may be admitted beyond the limit.
// Each run checks that the fault was in place (checkFault), and that every
// call that started after it was over decided.
func TestFaults(t *testing.T) {
	skipShort(t)
	onEachTopology(t, func(t *testing.T, top topology, c client) {
		faults := []*fault{instanceKilled}
		if top.cluster {
			faults = append(faults, masterPaused)
		}
		for _, f := range faults {
			for _, backend := range adapters {
				t.Run(f.name+"/"+backend, func(t *testing.T) {
					t.Run("Admission", func(t *testing.T) { checkAdmission(t, c, faultAdmissionRun(top, backend, f)) })
					t.Run("Linearizable", func(t *testing.T) { checkLinearizable(t, c, faultLinearizabilityRun(top, backend, f)) })
				})
			}
		}
	})
}

// TestMissedFaultsAreCaught shows that checkFault can fail: with a fault
// that never strikes, the killed instance goes on calling and the "paused"
// server goes on deciding, and checkFault must say so.
func TestMissedFaultsAreCaught(t *testing.T) {
	skipShort(t)
	top := standalone(t)
	c := newClient(t, top)
	for _, f := range []*fault{masterPaused, instanceKilled} {
		t.Run(f.name, func(t *testing.T) {
			r := faultAdmissionRun(top, harness.BackendGoRedis, &fault{
				name:   f.name,
				quiet:  f.quiet,
				inject: func(*testing.T, client, run, string, *servers.Instances) func() { return func() {} },
				during: f.during,
			})
			calls, m := execute(t, c, r, r.spec(newKey(t)))
			err := checkFault(r, calls, m)
			if err == nil {
				t.Fatal("checkFault passed a run whose fault never struck")
			}
			t.Logf("checkFault: %v", err)
		})
	}
}
