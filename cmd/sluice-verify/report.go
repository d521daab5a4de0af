package main

import "github.com/sluicehq/sluice/internal/test/harness"

// The report and its verdicts are the harness's, which testkit's
// two-instance check fails a test with too.
type (
	report    = harness.Report
	runReport = harness.RunReport
)

// The verdicts of a run.
const (
	verdictOK     = harness.VerdictOK
	verdictBroken = harness.VerdictBroken
	verdictFailed = harness.VerdictFailed
	verdictError  = harness.VerdictError
)

// exitStatus is the command's exit status for the report.
func exitStatus(r *report, strict bool) int {
	cannot := r.Interrupted || r.CleanError != "" || r.KeysLeft > 0
	for _, run := range r.Runs {
		switch run.Verdict {
		case verdictBroken, verdictFailed:
			return exitBroken
		case verdictError:
			cannot = true
		}
	}
	switch {
	case cannot:
		return exitCannot
	case strict && r.Problems():
		return exitBroken
	}
	return exitOK
}
