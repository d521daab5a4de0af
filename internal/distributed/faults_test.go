package distributed_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit"
)

// masterPaused pauses the cluster master that holds the bucket for 1s,
// longer than the calls' 200ms timeout and shorter than the cluster's 2s
// node timeout: calls time out, and those already sent run at the resume.
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
						r := linearizabilityRun(top, backend)
						r.fault, r.faultAfter, r.timeout = f, 100, 200*time.Millisecond
						checkLinearizable(t, c, r)
					})
				})
			}
		}
	})
}
