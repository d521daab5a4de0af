package main

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func readSample(t *testing.T) *results {
	t.Helper()
	f, err := os.Open("testdata/results.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := parseResults(f, "testdata/results.txt")
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestParseResults(t *testing.T) {
	res := readSample(t)
	for key, want := range map[string]string{
		"commit": "1234abc", "dirty": "false", "cpus": "2",
		"command": "make bench-peers", "redis_server": "Redis server v=7.0.15",
	} {
		if got := res.facts[key]; got != want {
			t.Errorf("facts[%q] = %q, want %q", key, got, want)
		}
	}
	if res.dirty() {
		t.Error("dirty() = true for dirty: false")
	}
	if res.gomaxprocs != "-2" {
		t.Errorf("gomaxprocs = %q, want -2", res.gomaxprocs)
	}
	for _, c := range []struct {
		bench, key string
		want       []string
	}{
		{memoryBench, "impl", []string{"xrate", "sluice"}},
		{memoryBench, "goroutines", []string{"1", "16"}},
		{memoryBench, "keys", []string{"100k", "1"}},
		{redisBench, "impl", []string{"redis_rate", "sluice-goredis"}},
		{ceilingBench, "impl", []string{"redis_rate", "sluice"}},
	} {
		if got := res.levels[c.bench][c.key]; !slices.Equal(got, c.want) {
			t.Errorf("levels[%s][%s] = %q, want %q", c.bench, c.key, got, c.want)
		}
	}
	for _, c := range []struct {
		unit  string
		parts []string
		want  float64
		ok    bool
	}{
		// Two runs: the median is their mean.
		{"decisions/s", []string{memoryBench, "keys=100k", "goroutines=1", "impl=xrate"}, 4_500_000, true},
		{"p99.9-µs", []string{memoryBench, "keys=100k", "goroutines=1", "impl=xrate"}, 3, true},
		// Units as printed, not tidied to sec/op.
		{"ns/op", []string{memoryBench, "keys=100k", "goroutines=1", "impl=sluice"}, 250, true},
		{"B/key", []string{keyMemory, "impl=sluice"}, 162.4, true},
		{"requests/s", []string{ceilingBench, "keys=10k", "impl=sluice"}, 400_000, true},
		{"decisions/s", []string{memoryBench, "keys=1", "goroutines=1", "impl=sluice"}, 0, false},
	} {
		got, ok := res.median(c.unit, c.parts...)
		if got != c.want || ok != c.ok {
			t.Errorf("median(%q, %q) = %v, %v; want %v, %v", c.unit, c.parts, got, ok, c.want, c.ok)
		}
	}
}

func TestParseResultsRejects(t *testing.T) {
	for name, input := range map[string]string{
		"no results": "commit: 1234abc\n",
		"bad line":   "BenchmarkRedis/keys=1-2 12 many ns/op\n",
	} {
		if _, err := parseResults(strings.NewReader(input), name); err == nil {
			t.Errorf("%s: parseResults succeeded", name)
		}
	}
}

func TestGoroutineTable(t *testing.T) {
	res := readSample(t)
	decisions := func(parts ...string) string { return formatCount(res, "decisions/s", parts) }
	latency := func(parts ...string) string { return formatLatency(res, parts) }
	for _, c := range []struct {
		name string
		got  string
		want string
	}{
		{"memory throughput", goroutineTable(res, memoryBench, memoryKeys, decisions), `| impl | 1 goroutine | 16 goroutines |
| --- | ---: | ---: |
| ` + "`xrate`" + ` | 4,500,000 | 9,000,000 |
| ` + "`sluice`" + ` | 4,000,000 | 8,000,000 |`},
		{"redis latency", goroutineTable(res, redisBench, redisKeys, latency), `| impl | 1 goroutine | 16 goroutines |
| --- | ---: | ---: |
| ` + "`redis_rate`" + ` | 40.0 / 90.0 / 400 | 500 / 1,200 / 2,500 |
| ` + "`sluice-goredis`" + ` | 38.0 / 80.0 / 300 | 450 / 1,100 / 2,400 |`},
		{"hot key, a figure missing", goroutineTable(res, memoryBench, hotKey, decisions), `| impl | 1 goroutine | 16 goroutines |
| --- | ---: | ---: |
| ` + "`xrate`" + ` | 8,000,000 | – |
| ` + "`sluice`" + ` | – | – |`},
		{"key memory", keyMemoryTable(res), `| impl | heap bytes per key |
| --- | ---: |
| ` + "`xrate`" + ` | 222 |
| ` + "`sluice`" + ` | 162 |`},
		{"ceiling", ceilingTable(res), `| keys | impl | decisions/s | server CPU µs per decision | µs inside the script |
| --- | ---: | ---: | ---: | ---: |
| 10k | ` + "`redis_rate`" + ` | 333,333 | 2.90 | 1.50 |
| 10k | ` + "`sluice`" + ` | 400,000 | 2.40 | 1.20 |`},
	} {
		if c.got != c.want {
			t.Errorf("%s:\n%s\nwant\n%s", c.name, c.got, c.want)
		}
	}
}

func TestFormatValue(t *testing.T) {
	for _, c := range []struct {
		v      float64
		ok     bool
		digits int
		want   string
	}{
		{0, false, 3, noValue},
		{0, true, 3, "0"},
		{0.12345, true, 3, "0.123"},
		{1.5, true, 3, "1.50"},
		{22.84, true, 3, "22.8"},
		{999.4, true, 3, "999"},
		{1234.5, true, 3, "1,235"},
		{1234567, true, 0, "1,234,567"},
		{-1234, true, 0, "-1,234"},
		{12, true, 0, "12"},
	} {
		if got := formatValue(c.v, c.ok, c.digits); got != c.want {
			t.Errorf("formatValue(%v, %v, %d) = %q, want %q", c.v, c.ok, c.digits, got, c.want)
		}
	}
}

// sampleImages names each plot in a folder images beside the report.
func sampleImages() map[string]string {
	images := map[string]string{}
	for _, f := range figures {
		images[f.name] = "images/" + f.file
	}
	return images
}

// renderSample is the report of res, with sampleImages.
func renderSample(t *testing.T, res *results) string {
	t.Helper()
	var b bytes.Buffer
	if err := writeReport(&b, res, "redismemory's table\n", "the raw results\n", sampleImages()); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestWriteReport(t *testing.T) {
	res := readSample(t)
	render := func() string { return renderSample(t, res) }
	report := render()
	for _, want := range []string{
		"| commit | `1234abc` |",
		"| command | `make bench-peers` (BENCHTIME=1s COUNT=2 CEILING_DURATION=5s) |",
		"| CPU | AMD EPYC, 2 CPUs, GOMAXPROCS 2 |",
		"| Redis | Redis server v=7.0.15, on the same machine, over loopback |",
		"| `xrate` | 4,500,000 | 9,000,000 |",
		"| 10k | `sluice` | 400,000 | 2.40 | 1.20 |",
		"```\nredismemory's table\n```",
		"```\nthe raw results\n```",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("the report has no %q", want)
		}
	}
	for _, f := range figures {
		if !strings.Contains(report, "](images/"+f.file+")") {
			t.Errorf("the report does not show %s", f.file)
		}
	}
	if strings.Contains(report, "<no value>") || strings.Contains(report, "dirty") {
		t.Errorf("a clean run's report has a missing field or says dirty:\n%s", report)
	}

	delete(res.facts, "kernel")
	var b bytes.Buffer
	if err := writeReport(&b, res, "", "", sampleImages()); err == nil {
		t.Error("writeReport succeeded on results without the kernel")
	}
	res.facts["kernel"] = "Linux"

	res.facts["dirty"] = "true"
	if report := render(); !strings.Contains(report, "Not a publishable run") || !strings.Contains(report, "`1234abc` (dirty)") {
		t.Error("a dirty run's report does not say so")
	}
}

func TestRun(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "docs", "benchmarks.md")
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := run("testdata/results.txt", "testdata/memory.txt", out, filepath.Join(dir, "docs", "images")); err != nil {
		t.Fatal(err)
	}
	report, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range figures {
		if !bytes.Contains(report, []byte("](images/"+f.file+")")) {
			t.Errorf("the report does not show images/%s", f.file)
		}
		img, err := os.Open(filepath.Join(dir, "docs", "images", f.file))
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := png.DecodeConfig(img)
		img.Close()
		if err != nil || cfg.Width == 0 || cfg.Height == 0 {
			t.Errorf("%s: %+v, %v; want a PNG", f.file, cfg, err)
		}
	}
}

func TestLogTicks(t *testing.T) {
	for _, c := range []struct {
		min, max float64
		want     []string
	}{
		{0.03, 25, []string{"0.05", "0.1", "0.2", "0.5", "1", "2", "5", "10", "20"}},
		{300, 2500, []string{"500", "1,000", "2,000"}},
		{0.03, 25000, []string{"0.1", "1", "10", "100", "1,000", "10,000"}},
	} {
		var labels []string
		for _, tick := range (logTicks{}).Ticks(c.min, c.max) {
			labels = append(labels, tick.Label)
		}
		if !slices.Equal(labels, c.want) {
			t.Errorf("logTicks(%v, %v) = %q, want %q", c.min, c.max, labels, c.want)
		}
	}
}

// TestStanding: the first paragraph's table divides sluice's decisions/s
// by each peer's (medians), bolds and lists where sluice is behind, and
// leaves a comparison the run lacks blank.
func TestStanding(t *testing.T) {
	res := readSample(t)
	table, behind, all := standingTable(res)
	for _, want := range []string{
		// 4,000,000 ÷ median(5,000,000, 4,000,000); 8,000,000 ÷ 9,000,000.
		"| in memory, 100,000 keys: `sluice` ÷ `xrate` | **0.89×** | **0.89×** |",
		// No sluice row for one key.
		"| in memory, one hot key: `sluice` ÷ `xrate` | – | – |",
		// 23,000 ÷ 22,000; 35,000 ÷ 30,000.
		"| Redis, 10,000 keys: `sluice-goredis` ÷ `redis_rate` | 1.05× | 1.17× |",
		"sluice's over redis_rate's: 1.20× on 10k keys.",
		// The lowest peer p99.9 over sluice's: median(2, 4) ÷ 3; 250 ÷ 260.
		"| in memory, 100,000 keys: p99.9 latency of one call | 1.00× (`xrate`) | **0.96×** (`xrate`) |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("the standing table has no %q:\n%s", want, table)
		}
	}
	// Behind: xrate at 1 and 16 goroutines, and the p99.9 at 16; ahead:
	// goredis at 1 and 16, the p99.9 at 1, and the ceiling.
	if behind != 3 || all != 7 {
		t.Errorf("behind in %d of %d ratios, want 3 of 7", behind, all)
	}
	if report := renderSample(t, res); !strings.Contains(report, "sluice is behind in 3 of these 7 ratios") {
		t.Error("the report does not say where sluice is behind")
	}
}
