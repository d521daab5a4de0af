package distributed_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit"
)

// masterPaused pauses the cluster master that holds the bucket for 1s,
// shorter than the cluster's 2s node timeout, so there is no failover.
// Calls with a shorter timeout fail, and those already sent run at the
// resume; calls with a longer one wait.
var masterPaused = &fault{name: "MasterPaused", inject: func(t *testing.T, c client, r run, key string, _ *testkit.Instances) {
	master := c.master(t, r.top, key)
	master.Pause(t)
	time.Sleep(time.Second)
	master.Resume(t)
}}

// instanceKilled kills instance 0 with SIGKILL; its calls in flight may
// have taken effect unreported.
var instanceKilled = &fault{name: "InstanceKilled", inject: func(t *testing.T, _ client, _ run, _ string, in *testkit.Instances) {
	in.Kill(t, 0)
}}

// TestFaults makes the count and linearizability runs again, through each
// Redis adapter, with a fault in the middle: a paused cluster master, and
// a killed instance (standalone and cluster). Calls that fail or go
// unreported may or may not have taken effect, so the count checks bound
// the bucket's count from both sides and porcupine lets them fall
// anywhere after their start; nothing may be admitted beyond the limit,
// and the instances still running must go on deciding.
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
					t.Run("Admission", func(t *testing.T) {
						r := admissionRun(top, backend, noRefill(1000))
						r.fault, r.faultAfter, r.timeout = f, 500, 200*time.Millisecond
						checkAdmission(t, c, r)
					})
					t.Run("Linearizable", func(t *testing.T) {
						// Calls outlast the pause: each call that fails may
						// take effect anywhere after its start, and the
						// dozens a 200ms timeout makes can keep porcupine
						// searching for minutes. The Admission run has them.
						r := linearizabilityRun(top, backend)
						r.fault, r.faultAfter, r.timeout = f, 100, 2*time.Second
						checkLinearizable(t, c, r)
					})
				})
			}
		}
	})
}
