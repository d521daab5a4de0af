package main

import (
	_ "embed"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/template"
)

// The benchmarks the report reads, by their names in the results, and the
// key sets of their main tables and plots.
const (
	memoryBench  = "AllowGoroutines"
	memoryKeys   = "100k"
	keyMemory    = "KeyMemory"
	redisBench   = "Redis"
	redisKeys    = "10k"
	ceilingBench = "RedisCeiling"
	hotKey       = "1"
)

// reportTemplate is docs/benchmarks.md with the prose written once and the
// figures filled in from a run.
//
//go:embed report.md.tmpl
var reportTemplate string

// reportData is what the template fills in.
type reportData struct {
	Facts      map[string]string
	Dirty      bool
	GOMAXPROCS string
	// Standing is the table of sluice's decisions/s over each peer's;
	// Behind of its All ratios are below 1.
	Standing    string
	Behind, All int
	// The tables, in Markdown.
	MemoryThroughput, MemoryLatency, MemoryHotKey, KeyMemory   string
	RedisThroughput, RedisLatency, RedisServerCPU, RedisHotKey string
	Ceiling                                                    string
	// RedisMemory is cmd/redismemory's output, Results the results file:
	// both quoted verbatim.
	RedisMemory, Results string
	// Images are the plots' file names, relative to the report.
	Images map[string]string
}

// writeReport writes the report of res to w; redisMemory and raw are the
// run's cmd/redismemory output and results file, images the plots' paths
// relative to the report by name ([plotNames]).
func writeReport(w io.Writer, res *results, redisMemory, raw string, images map[string]string) error {
	// A results file without one of the facts the report states is not a
	// run of peers.sh: fail rather than print a blank.
	tmpl, err := template.New("report").Option("missingkey=error").Parse(reportTemplate)
	if err != nil {
		return err
	}
	gomaxprocs := strings.TrimPrefix(res.gomaxprocs, "-")
	if gomaxprocs == "" {
		gomaxprocs = "1"
	}
	decisions := func(parts ...string) string { return formatCount(res, "decisions/s", parts) }
	latency := func(parts ...string) string { return formatLatency(res, parts) }
	serverCPU := func(parts ...string) string { return formatMicros(res, "server-µs/op", parts) }
	standing, behind, all := standingTable(res)
	return tmpl.Execute(w, reportData{
		Standing:         standing,
		Behind:           behind,
		All:              all,
		Facts:            res.facts,
		Dirty:            res.dirty(),
		GOMAXPROCS:       gomaxprocs,
		MemoryThroughput: goroutineTable(res, memoryBench, memoryKeys, decisions),
		MemoryLatency:    goroutineTable(res, memoryBench, memoryKeys, latency),
		MemoryHotKey:     goroutineTable(res, memoryBench, hotKey, decisions),
		KeyMemory:        keyMemoryTable(res),
		RedisThroughput:  goroutineTable(res, redisBench, redisKeys, decisions),
		RedisLatency:     goroutineTable(res, redisBench, redisKeys, latency),
		RedisServerCPU:   goroutineTable(res, redisBench, redisKeys, serverCPU),
		RedisHotKey:      goroutineTable(res, redisBench, hotKey, decisions),
		Ceiling:          ceilingTable(res),
		RedisMemory:      strings.TrimSpace(redisMemory),
		Results:          strings.TrimSpace(raw),
		Images:           images,
	})
}

// goroutineTable is a table of bench on keys with a row per impl and a
// column per goroutine count; cell formats the benchmark named by its parts.
func goroutineTable(res *results, bench, keys string, cell func(parts ...string) string) string {
	levels := res.levels[bench]
	header := []string{"impl"}
	for _, g := range levels["goroutines"] {
		header = append(header, goroutinesLabel(g))
	}
	var rows [][]string
	for _, impl := range levels["impl"] {
		row := []string{"`" + impl + "`"}
		for _, g := range levels["goroutines"] {
			row = append(row, cell(bench, "keys="+keys, "goroutines="+g, "impl="+impl))
		}
		rows = append(rows, row)
	}
	return markdownTable(header, rows)
}

func goroutinesLabel(g string) string {
	if g == "1" {
		return "1 goroutine"
	}
	return g + " goroutines"
}

// keyMemoryTable is the heap per key of each in-memory implementation.
func keyMemoryTable(res *results) string {
	var rows [][]string
	for _, impl := range res.levels[keyMemory]["impl"] {
		v, ok := res.median("B/key", keyMemory, "impl="+impl)
		rows = append(rows, []string{"`" + impl + "`", formatValue(v, ok, 0)})
	}
	return markdownTable([]string{"impl", "heap bytes per key"}, rows)
}

// ceilingTable is cmd/redisceiling's figures: a row per key set and impl.
func ceilingTable(res *results) string {
	levels := res.levels[ceilingBench]
	var rows [][]string
	for _, keys := range levels["keys"] {
		for _, impl := range levels["impl"] {
			parts := []string{ceilingBench, "keys=" + keys, "impl=" + impl}
			if _, ok := res.median("requests/s", parts...); !ok {
				continue
			}
			rows = append(rows, []string{keys, "`" + impl + "`",
				formatCount(res, "requests/s", parts),
				formatMicros(res, "server-µs/op", parts),
				formatMicros(res, "script-µs/op", parts)})
		}
	}
	return markdownTable([]string{"keys", "impl", "decisions/s", "server CPU µs per decision", "µs inside the script"}, rows)
}

func markdownTable(header []string, rows [][]string) string {
	var b strings.Builder
	line := func(cells []string) { b.WriteString("| " + strings.Join(cells, " | ") + " |\n") }
	line(header)
	sep := make([]string, len(header))
	for i := range sep {
		sep[i] = "---"
		if i > 0 {
			sep[i] = "---:"
		}
	}
	line(sep)
	for _, r := range rows {
		line(r)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// noValue stands in a table for a figure the run did not produce.
const noValue = "–"

// formatCount is the median of unit as a whole number with thousands
// separators.
func formatCount(res *results, unit string, parts []string) string {
	v, ok := res.median(unit, parts...)
	return formatValue(v, ok, 0)
}

// formatMicros is the median of unit, in µs, to three significant digits.
func formatMicros(res *results, unit string, parts []string) string {
	v, ok := res.median(unit, parts...)
	return formatValue(v, ok, 3)
}

// formatLatency is "p50 / p99 / p99.9" in µs.
func formatLatency(res *results, parts []string) string {
	var cells []string
	for _, unit := range []string{"p50-µs", "p99-µs", "p99.9-µs"} {
		cells = append(cells, formatMicros(res, unit, parts))
	}
	return strings.Join(cells, " / ")
}

// formatValue formats v to digits significant digits (0: rounded to a whole
// number, with thousands separators), or [noValue] when not ok.
func formatValue(v float64, ok bool, digits int) string {
	switch {
	case !ok:
		return noValue
	case v == 0:
		return "0"
	case digits == 0 || math.Abs(v) >= math.Pow(10, float64(digits)):
		return thousands(strconv.FormatFloat(math.Round(v), 'f', 0, 64))
	default:
		return strconv.FormatFloat(v, 'f', max(digits-1-int(math.Floor(math.Log10(math.Abs(v)))), 0), 64)
	}
}

// thousands puts a comma between each three digits of the whole number s.
func thousands(s string) string {
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return sign + s
}

// describe is a one-line summary of the run, for the command's log.
func describe(res *results) string {
	return fmt.Sprintf("commit %s (dirty: %v), %d measurements", res.facts["commit"], res.dirty(), len(res.values))
}
