package oncall

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/test/servers"
)

// envOut names the directory the run writes into, in its images and
// results subdirectories: the repository's docs directory, for run.sh.
const envOut = "SLUICE_ONCALL_OUT"

// resultsFile is the run's numbers, in the results subdirectory.
const resultsFile = "2026-12-02-oncall.txt"

// seed fixes the traffic's draws.
const seed = 20261202

// TestOnCallRun is the documentation run of docs/observability.md's "On
// call" section; see the package doc. It skips unless $SLUICE_ONCALL_OUT
// names the output directory. It fails if Redis or Prometheus does not
// come up, or a phase does not show the situation it stages; it asserts
// nothing about timings.
func TestOnCallRun(t *testing.T) {
	out := os.Getenv(envOut)
	if out == "" {
		t.Skipf("a documentation run: set %s to the output directory (run.sh does)", envOut)
	}
	for _, d := range []string{"images", "results"} {
		if err := os.MkdirAll(filepath.Join(out, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	began := time.Now()

	// DEBUG SLEEP makes the store slow: Redis 7 refuses DEBUG unless it
	// is enabled.
	rds := servers.StartRedis(t, "--enable-debug-command", "yes")
	svc := startService(t, rds.Addr())
	prom := startPrometheus(t, svc.metricsURL)

	sched := newSchedule(time.Now().Truncate(time.Second).Add(time.Second))
	t.Logf("schedule:\n%s", sched.describe())
	var c counts
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var gen sync.WaitGroup
	gen.Go(func() { generate(ctx, svc.limiter, seed, sched.start, sched.end(), sched.phaseAt, &c) })

	// The sick phase's faults, on this goroutine: Pause and Resume may
	// fail the test.
	admin := redis.NewClient(&redis.Options{Addr: rds.Addr(), ReadTimeout: 5 * time.Second, MaxRetries: -1})
	defer admin.Close()
	waitUntil(t, sched.at(sickAt), &c)
	stop := sleeper(admin, slowSleep)
	waitUntil(t, sched.at(slowerAt), &c)
	stop()
	stop = sleeper(admin, slowerSleep)
	waitUntil(t, sched.at(pausedAt), &c)
	stop()
	rds.Pause(t)
	waitUntil(t, sched.at(resumedAt), &c)
	rds.Resume(t)
	gen.Wait()
	t.Logf("traffic: %s", &c)

	// Two scrapes more, so the last step has its samples.
	time.Sleep(2500 * time.Millisecond)
	names := scrapedNames(t, svc.metricsURL)

	from, to := sched.start.Add(-5*time.Second), sched.end().Add(2*time.Second)
	results := map[string][]series{}
	for _, q := range allQueries {
		ss, err := prom.rangeQuery(q.expr, from, to)
		if err != nil {
			t.Fatalf("oncall: query %s: %v", q.id, err)
		}
		results[q.id] = ss
	}
	if len(results[qRejectedKeys.id]) == 0 {
		t.Fatalf("oncall: Prometheus has no sluice_rate_limit_rejected_keys series")
	}

	for _, fig := range figures {
		path := filepath.Join(out, "images", fig.file)
		if err := render(fig, results, sched, path); err != nil {
			t.Fatalf("oncall: render %s: %v", path, err)
		}
		t.Logf("wrote %s", path)
	}
	took := time.Since(began)
	path := filepath.Join(out, "results", resultsFile)
	if err := os.WriteFile(path, []byte(report(sched, names, results, &c, took)), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s; the run took %v", path, took.Round(time.Second))

	check(t, sched, results, &c)
}

// waitUntil sleeps until at, logging the traffic once in a while.
func waitUntil(t *testing.T, at time.Time, c *counts) {
	t.Helper()
	for {
		d := time.Until(at)
		if d <= 0 {
			return
		}
		time.Sleep(min(d, 30*time.Second))
		if time.Until(at) > 0 {
			t.Logf("traffic so far: %s", c)
		}
	}
}

// sleeper makes the store slow: it sends DEBUG SLEEP secs back to back,
// so that Redis spends most of its time asleep and every decision waits
// for the sleep it arrived during. The returned func stops it and
// returns once the last sleep is over.
func sleeper(client *redis.Client, secs string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			// A failure (the context's end) ends the loop next time.
			_ = client.Do(context.Background(), "DEBUG", "SLEEP", secs).Err()
		}
	}()
	return func() { cancel(); <-done }
}

// scrapedNames are the sluice series the run's /metrics served, each
// name with its label names (the exporter's otel_scope_* left out): the
// names the queries use, as seen, not guessed.
func scrapedNames(t *testing.T, url string) []string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("oncall: scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "sluice_") {
			continue
		}
		name, rest, _ := strings.Cut(line, "{")
		labels, _, _ := strings.Cut(rest, "}")
		var keys []string
		for _, kv := range splitLabels(labels) {
			k, _, _ := strings.Cut(kv, "=")
			if !strings.HasPrefix(k, "otel_scope_") {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		seen[name+"{"+strings.Join(keys, ",")+"}"] = true
	}
	return slices.Sorted(func(yield func(string) bool) {
		for k := range seen {
			if !yield(k) {
				return
			}
		}
	})
}

// splitLabels splits a label list at the commas outside quotes.
func splitLabels(s string) []string {
	var out []string
	quoted, start := false, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			quoted = !quoted
		case ',':
			if !quoted {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// report is results.txt: how the run went, then each query as run and
// its values at the read points.
func report(sched schedule, names []string, results map[string][]series, c *counts, took time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "On-call run of docs/observability.md (otel/internal/oncall, TestOnCallRun)\n")
	fmt.Fprintf(&b, "run at %s, took %v; re-run: sh otel/internal/oncall/run.sh\n", sched.start.UTC().Format(time.RFC3339), took.Round(time.Second))
	fmt.Fprintf(&b, "%s; %s; scrape and query step 1s\n", versionOf("redis-server", "--version"), versionOf(promBinary(), "--version"))
	fmt.Fprintf(&b, "limiter: redis backend (LowLatency client), failpolicy Local (50ms deadline, breaker 5 failures / 1s), otel decorator outermost\n")
	fmt.Fprintf(&b, "traffic (seed %d, Poisson per 10ms): %d customers search 1/s (limit 5/s, burst 10; %d heavy ones 6/s) and export 0.5/s (limit 60/min, burst 10; misconfigured: 24/min, burst 4);\n", seed, customers, heavyUsers)
	fmt.Fprintf(&b, "  %d addresses search 0.5/s (limit 2/s, burst 5); abuse: %s search %.0f/s each\n", anonymous, strings.Join(abusers, ", "), abuserRate)
	fmt.Fprintf(&b, "decisions: %s\n\n", c)
	fmt.Fprintf(&b, "phases, seconds from the start of the run:\n%s\n", sched.describe())
	fmt.Fprintf(&b, "series served on /metrics (otel_scope_* labels left out):\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %s\n", n)
	}
	pts := sched.readPoints()
	for _, q := range allQueries {
		fmt.Fprintf(&b, "\n== %s: %s\n", q.id, q.what)
		for line := range strings.SplitSeq(q.expr, "\n") {
			fmt.Fprintf(&b, "    %s\n", line)
		}
		ss := results[q.id]
		slices.SortFunc(ss, func(a, b series) int { return strings.Compare(seriesName(a.Metric), seriesName(b.Metric)) })
		if len(ss) == 0 {
			fmt.Fprintf(&b, "  no series\n")
			continue
		}
		for _, p := range pts {
			fmt.Fprintf(&b, "  %-56s %6.0fs ", p.name, sched.secs(p.at))
			for _, s := range ss {
				v, ok := s.at(float64(p.at.Unix()))
				val := "-"
				if ok {
					val = formatValue(v)
				}
				fmt.Fprintf(&b, " %s=%s", seriesName(s.Metric), val)
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("\n(- : no value at that time, as when nothing was rejected on that route yet)\n")
	return b.String()
}

func formatValue(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case v == 0:
		return "0"
	case math.Abs(v) < 0.01:
		return fmt.Sprintf("%.5f", v)
	case math.Abs(v) < 10:
		return fmt.Sprintf("%.3f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func promBinary() string {
	if p, err := exec.LookPath("prometheus"); err == nil {
		return p
	}
	return prometheusBin
}

// versionOf is the first line of a binary's version output.
func versionOf(bin, flag string) string {
	out, err := exec.Command(bin, flag).CombinedOutput()
	if err != nil {
		return filepath.Base(bin) + " (version unknown)"
	}
	first, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(first)
}

// valueAt is series name's value in a query's results at t, or NaN.
func valueAt(results map[string][]series, q query, name string, t time.Time) float64 {
	for _, s := range results[q.id] {
		if seriesName(s.Metric) == name {
			if v, ok := s.at(float64(t.Unix())); ok {
				return v
			}
		}
	}
	return math.NaN()
}

// orZero is v, or 0 for no value: a series that is not there counted
// nothing.
func orZero(v float64) float64 {
	if math.IsNaN(v) {
		return 0
	}
	return v
}

// maxOver is the largest value of series name of q between from and to.
func maxOver(results map[string][]series, q query, name string, from, to time.Time) float64 {
	m := math.NaN()
	for _, s := range results[q.id] {
		if seriesName(s.Metric) != name {
			continue
		}
		for i, ts := range s.Times {
			if ts >= float64(from.Unix()) && ts <= float64(to.Unix()) && !(s.Values[i] <= m) {
				m = s.Values[i]
			}
		}
	}
	return m
}

// check fails the test when a phase does not show what it stages. The
// thresholds are far below what the traffic makes, so that they catch a
// phase that did nothing, not a slow machine.
func check(t *testing.T, sched schedule, results map[string][]series, c *counts) {
	t.Helper()
	if c.sent.Load() == 0 {
		t.Fatal("oncall: no traffic was sent")
	}
	pts := sched.readPoints()
	at := func(name string) time.Time {
		for _, p := range pts {
			if strings.HasPrefix(p.name, name) {
				return p.at
			}
		}
		t.Fatalf("oncall: no read point %q", name)
		return time.Time{}
	}
	fail := func(format string, args ...any) { t.Errorf("oncall: "+format, args...) }

	abuseMid, abuseEnd := at("abuse, middle"), at("abuse, end")
	if v := orZero(valueAt(results, qRejections, "/v1/search anonymous", abuseMid)) + orZero(valueAt(results, qRejections, "/v1/search customer", abuseMid)); !(v > 50) {
		fail("abuse phase: %v rejections/s on /v1/search, want many", v)
	}
	misMid, misEnd := at("misconfigured, middle"), at("misconfigured, end")
	if v := valueAt(results, qCustomerShare, "/v1/export", misMid); !(v > 0.05) {
		fail("misconfigured phase: %v of customer exports rejected, want some", v)
	}
	if v := valueAt(results, qRejectedKeys, "/v1/search anonymous", abuseEnd); !(v >= 1 && v <= 20) {
		fail("abuse phase: %v anonymous keys rejected on /v1/search, want a few", v)
	}
	if v := valueAt(results, qRejectedCustomers, "/v1/export", misEnd); !(v >= 100) {
		fail("misconfigured phase: %v customers rejected on /v1/export, want many", v)
	}
	slowMid, pausedMid := at("sick: store slower"), at("sick: store paused")
	base := valueAt(results, qP99, "all", at("baseline"))
	if v := valueAt(results, qP99, "all", slowMid); !(v > base) {
		fail("sick phase: p99 %vs while the store was slow, not above the baseline's %vs", v, base)
	}
	if v := orZero(valueAt(results, qDegraded, "breaker_open", pausedMid)) + orZero(valueAt(results, qDegraded, "timeout", pausedMid)); !(v > 0) {
		fail("sick phase: %v degraded decisions/s while the store was paused, want some", v)
	}
	if v := maxOver(results, qBreakers, "open", sched.at(pausedAt), sched.at(resumedAt)); !(v >= 1) {
		fail("sick phase: no breaker open while the store was paused (max %v)", v)
	}
	if t.Failed() {
		t.FailNow()
	}
}
