package harness

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/backend/redischeck"
)

// The verdicts of a run in a [Report].
const (
	VerdictOK     = "ok"           // within the bound, every call decided
	VerdictBroken = "BROKEN"       // more admitted than the bound allows (or fewer than it must)
	VerdictFailed = "calls failed" // within the bound, but some calls returned an error
	VerdictError  = "error"        // the run could not be made
)

// Report is everything a check of admission runs found: what sluice-verify
// prints, as a table ([Report.WriteTable]) or as JSON (--json,
// [Report.WriteJSON]), and what testkit's two-instance check fails a test
// with.
type Report struct {
	// Title starts the table's first line; empty means "sluice-verify".
	Title      string `json:"-"`
	Server     string `json:"server"`
	Prefix     string `json:"prefix"`
	Processes  int    `json:"processes"`
	Goroutines int    `json:"goroutines"`
	// Calls is the calls on each bucket, shared by the processes.
	Calls    int             `json:"calls_per_bucket"`
	Capacity int64           `json:"capacity"`
	Adapters []AdapterReport `json:"adapters"`
	Runs     []RunReport     `json:"runs"`
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

// AdapterReport is what an adapter's backend Check found.
type AdapterReport struct {
	Name string `json:"name"`
	// Settings describe the client as the check built it.
	Settings   []string       `json:"client_settings"`
	Servers    []ServerReport `json:"servers"`
	Problems   []string       `json:"problems"`
	CheckError string         `json:"check_error,omitempty"`
}

// ServerReport is a redischeck.Server: one server Check reached.
type ServerReport struct {
	Addr            string `json:"addr"`
	Version         string `json:"version"`
	MaxmemoryPolicy string `json:"maxmemory_policy"`
}

// RunReport is one run: one bucket through one adapter.
type RunReport struct {
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
	// unknown ([Tally].Unknown): they lower the low bound.
	Unknown   int64         `json:"unknown_tokens"`
	Remaining int64         `json:"remaining"`
	Bound     BoundReport   `json:"bound"`
	Seconds   float64       `json:"seconds"`
	Latency   LatencyReport `json:"latency_ms"`
	Errors    []ErrorCount  `json:"errors,omitempty"`
}

// BoundReport is [Bounds]: admitted + remaining must lie within
// [Low − unknown tokens, High], and be Low exactly when the two are equal
// and no call's outcome is unknown.
type BoundReport struct {
	Low        int64   `json:"low"`
	High       int64   `json:"high"`
	SpanMillis float64 `json:"server_span_ms"`
}

// LatencyReport are the percentiles of the durations of a run's calls
// that returned, in ms.
type LatencyReport struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// ErrorCount is one error the calls of a run returned, and how often.
type ErrorCount struct {
	Error string `json:"error"`
	Count int    `json:"count"`
}

// Passed says whether every run held its bound with no call failing.
func (r *Report) Passed() bool {
	for _, run := range r.Runs {
		if run.Verdict != VerdictOK {
			return false
		}
	}
	return !r.Interrupted && len(r.Runs) > 0
}

// Problems says whether Check found a problem, or could not run.
func (r *Report) Problems() bool {
	for _, a := range r.Adapters {
		if len(a.Problems) > 0 || a.CheckError != "" {
			return true
		}
	}
	return false
}

// WriteJSON writes r as indented JSON, with OK set.
func (r *Report) WriteJSON(w io.Writer) error {
	r.OK = r.Passed()
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes r as sluice-verify prints it: the adapters' Check,
// a table of the runs, their errors, the clean-up and the verdict.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s, prefix %q\n", cmp.Or(r.Title, "sluice-verify"), r.Server, r.Prefix)
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
	case r.Passed():
		b.WriteString("Every bound held: admitted + remaining was within the bound in every run, and no call failed.\n")
	default:
		b.WriteString("NOT VERIFIED: ")
		var why []string
		for _, run := range r.Runs {
			if run.Verdict != VerdictOK {
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

// CheckAdapter is the [AdapterReport] of the adapter name, whose client
// has settings, by check, the backend's Check: the servers it reached and
// the problems it found. Problems are not a failure of Check; any other
// error is.
func CheckAdapter(ctx context.Context, name string, settings []string, check func(context.Context) (redischeck.Report, error)) AdapterReport {
	a := AdapterReport{Name: name, Settings: settings}
	r, err := check(ctx)
	if err != nil && !errors.Is(err, redischeck.ErrUnsafeServer) {
		a.CheckError = err.Error()
	}
	for _, s := range r.Servers {
		a.Servers = append(a.Servers, ServerReport(s))
	}
	a.Problems = r.Problems
	return a
}

// NewRunReport is the [RunReport] of a run of bucket b through adapter:
// of res, what [Measure] returned, or of err, why it could not make the
// run. Its verdict is broken if res breaks its bounds, failed if a call
// failed, else ok.
func NewRunReport(adapter string, b Bucket, res Result, err error) RunReport {
	r := RunReport{Adapter: adapter, Bucket: b.Name, Algorithm: b.Algorithm.String()}
	if err != nil {
		r.Verdict, r.Error = VerdictError, err.Error()
		return r
	}
	n := res.Tally
	r.Made, r.Admitted, r.Denied, r.Failed, r.Unknown = n.Calls, n.Admitted, n.Denied, n.Failed, n.Unknown
	r.Remaining = res.Remaining
	r.Bound = BoundReport{Low: res.Bounds.Low, High: res.Bounds.High, SpanMillis: millis(res.Bounds.Span)}
	r.Seconds = n.Span().Seconds()
	r.Latency = latencies(res.Calls)
	r.Errors = firstErrors(res.Calls, 3)
	switch err := res.Check(); {
	case err != nil:
		r.Verdict, r.Error = VerdictBroken, err.Error()
	case n.Failed > 0:
		r.Verdict = VerdictFailed
	default:
		r.Verdict = VerdictOK
	}
	return r
}

// latencies are the percentiles of the calls' durations, of those that
// returned.
func latencies(calls []Call) LatencyReport {
	var d []time.Duration
	for _, c := range calls {
		if c.End != 0 {
			d = append(d, time.Duration(c.End-c.Start))
		}
	}
	if len(d) == 0 {
		return LatencyReport{}
	}
	slices.Sort(d)
	at := func(q float64) float64 {
		i := int(q*float64(len(d))+0.5) - 1
		return millis(d[min(max(i, 0), len(d)-1)])
	}
	return LatencyReport{P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: millis(d[len(d)-1])}
}

// firstErrors are up to n distinct errors of the calls, each with how
// often it occurred.
func firstErrors(calls []Call, n int) []ErrorCount {
	var out []ErrorCount
	for _, c := range calls {
		if c.Err == "" {
			continue
		}
		i := slices.IndexFunc(out, func(e ErrorCount) bool { return e.Error == c.Err })
		switch {
		case i >= 0:
			out[i].Count++
		case len(out) < n:
			out = append(out, ErrorCount{Error: c.Err, Count: 1})
		}
	}
	return out
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
