package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// The verdicts of a run.
const (
	verdictOK     = "ok"           // within the bound, every call decided
	verdictBroken = "BROKEN"       // more admitted than the bound allows (or fewer than it must)
	verdictFailed = "calls failed" // within the bound, but some calls returned an error
	verdictError  = "error"        // the run could not be made
)

// report is everything a check found; its JSON is what --json writes.
type report struct {
	Server     string `json:"server"`
	Prefix     string `json:"prefix"`
	Processes  int    `json:"processes"`
	Goroutines int    `json:"goroutines"`
	// Calls is the calls on each bucket, shared by the processes.
	Calls    int             `json:"calls_per_bucket"`
	Capacity int64           `json:"capacity"`
	Adapters []adapterReport `json:"adapters"`
	Runs     []runReport     `json:"runs"`
	// Interrupted says that a signal ended the check before every run.
	Interrupted bool `json:"interrupted,omitempty"`
	// KeysDeleted is how many keys the clean-up deleted, and KeysLeft how
	// many a SCAN of the prefix found after it (0 unless CleanError).
	KeysDeleted int    `json:"keys_deleted"`
	KeysLeft    int    `json:"keys_left"`
	CleanError  string `json:"clean_error,omitempty"`
	// OK says that every run held its bound with no call failing.
	OK bool `json:"ok"`
}

// adapterReport is what an adapter's backend Check found.
type adapterReport struct {
	Name string `json:"name"`
	// Settings describe the client as the check built it.
	Settings   []string       `json:"client_settings"`
	Servers    []serverReport `json:"servers"`
	Problems   []string       `json:"problems"`
	CheckError string         `json:"check_error,omitempty"`
}

// serverReport is a redischeck.Server: one server Check reached.
type serverReport struct {
	Addr            string `json:"addr"`
	Version         string `json:"version"`
	MaxmemoryPolicy string `json:"maxmemory_policy"`
}

// runReport is one run: one bucket through one adapter.
type runReport struct {
	Adapter   string `json:"adapter"`
	Bucket    string `json:"bucket"`
	Algorithm string `json:"algorithm"`
	Verdict   string `json:"verdict"`
	// Error says why the run broke its bound, or could not be made.
	Error    string `json:"error,omitempty"`
	Made     int    `json:"calls"`
	Admitted int    `json:"admitted"`
	Denied   int    `json:"denied"`
	Failed   int    `json:"failed"`
	// Unknown are the tokens of the failed calls whose outcome is
	// unknown (harness.Tally's Unknown): they lower the low bound.
	Unknown   int64         `json:"unknown_tokens"`
	Remaining int64         `json:"remaining"`
	Bound     boundReport   `json:"bound"`
	Seconds   float64       `json:"seconds"`
	Latency   latencyReport `json:"latency_ms"`
	Errors    []errorCount  `json:"errors,omitempty"`
}

// boundReport is harness.Bounds: admitted + remaining must lie within
// [Low − unknown tokens, High], and be Low exactly when the two are equal
// and no call's outcome is unknown.
type boundReport struct {
	Low        int64   `json:"low"`
	High       int64   `json:"high"`
	SpanMillis float64 `json:"server_span_ms"`
}

type latencyReport struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

type errorCount struct {
	Error string `json:"error"`
	Count int    `json:"count"`
}

// passed says whether every run held its bound with no call failing.
func (r *report) passed() bool {
	for _, run := range r.Runs {
		if run.Verdict != verdictOK {
			return false
		}
	}
	return !r.Interrupted && len(r.Runs) > 0
}

// problems says whether Check found a problem, or could not run.
func (r *report) problems() bool {
	for _, a := range r.Adapters {
		if len(a.Problems) > 0 || a.CheckError != "" {
			return true
		}
	}
	return false
}

// exitStatus is the command's exit status for the report.
func (r *report) exitStatus(strict bool) int {
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
	case strict && r.problems():
		return exitBroken
	}
	return exitOK
}

func (r *report) writeJSON(w io.Writer) error {
	r.OK = r.passed()
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func (r *report) writeTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "sluice-verify: %s, prefix %q\n", r.Server, r.Prefix)
	fmt.Fprintf(&b, "%d processes × %d goroutines, %d calls on each bucket of capacity %d\n\n", r.Processes, r.Goroutines, r.Calls, r.Capacity)
	for _, a := range r.Adapters {
		fmt.Fprintf(&b, "Check, %s:\n", a.Name)
		for _, s := range a.Settings {
			fmt.Fprintf(&b, "  %s\n", s)
		}
		for _, s := range a.Servers {
			fmt.Fprintf(&b, "  server %s: Redis %s, maxmemory-policy %s\n", s.Addr, s.Version, s.MaxmemoryPolicy)
		}
		if a.CheckError != "" {
			fmt.Fprintf(&b, "  Check failed: %s\n", a.CheckError)
		}
		for _, p := range a.Problems {
			fmt.Fprintf(&b, "  PROBLEM: %s\n", p)
		}
		if len(a.Problems) == 0 && a.CheckError == "" {
			fmt.Fprintf(&b, "  no problem found\n")
		}
		b.WriteString("\n")
	}
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "adapter\tbucket\tadmitted\tremaining\tbound\tcalls\tdenied\terrors\tp50 ms\tp90 ms\tp99 ms\tmax ms\tcalls/s\tresult")
	for _, run := range r.Runs {
		bound := fmt.Sprint(run.Bound.Low)
		if run.Bound.High != run.Bound.Low {
			bound = fmt.Sprintf("%d-%d", run.Bound.Low, run.Bound.High)
		}
		rate := 0.0
		if run.Seconds > 0 {
			rate = float64(run.Made) / run.Seconds
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%d\t%d\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t%s\n",
			run.Adapter, run.Bucket, run.Admitted, run.Remaining, bound, run.Made, run.Denied, run.Failed,
			run.Latency.P50, run.Latency.P90, run.Latency.P99, run.Latency.Max, rate, run.Verdict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	b.WriteString("\n")
	lines := b.Len()
	for _, run := range r.Runs {
		if run.Error != "" {
			fmt.Fprintf(&b, "%s %s: %s: %s\n", run.Adapter, run.Bucket, run.Verdict, run.Error)
		}
		for _, e := range run.Errors {
			fmt.Fprintf(&b, "%s %s: %d× %s\n", run.Adapter, run.Bucket, e.Count, e.Error)
		}
	}
	if b.Len() > lines {
		b.WriteString("\n")
	}
	if r.Interrupted {
		b.WriteString("Interrupted before every run was made.\n")
	}
	if r.CleanError != "" {
		fmt.Fprintf(&b, "Clean-up failed after deleting %d keys: %s\n", r.KeysDeleted, r.CleanError)
	} else {
		fmt.Fprintf(&b, "Clean-up: deleted %d keys under %q; a SCAN finds %d left.\n", r.KeysDeleted, r.Prefix, r.KeysLeft)
	}
	switch {
	case r.passed():
		b.WriteString("Every bound held: admitted + remaining was within the bound in every run, and no call failed.\n")
	default:
		b.WriteString("NOT VERIFIED: ")
		var why []string
		for _, run := range r.Runs {
			if run.Verdict != verdictOK {
				why = append(why, run.Adapter+" "+run.Bucket+": "+run.Verdict)
			}
		}
		if len(why) == 0 {
			why = append(why, "no run was made")
		}
		b.WriteString(strings.Join(why, "; ") + ".\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
