// Command benchreport writes docs/benchmarks.md and its plots from one run
// of benchmarks/peers.sh (make bench-peers): the comparison of sluice with
// its peers in memory and on Redis.
//
// Usage:
//
//	benchreport -results bench/peers/results.txt -memory bench/peers/memory.txt -out docs/benchmarks.md -images docs/images
//
// The results file is in the Go benchmark format: the run's facts as file
// configuration lines (commit, dirty, date, go_version, cpu_model, cpus,
// kernel, redis_server, command, settings), then the output of
// BenchmarkAllowGoroutines, BenchmarkKeyMemory, BenchmarkRedis and
// cmd/redisceiling; -memory is cmd/redismemory's output, quoted verbatim.
// Where a benchmark ran more than once (-count) the report gives the
// median.
//
// The report states the commit and marks a run on a tree with uncommitted
// changes as dirty, not to be published. The plots (PNG, gonum.org/v1/plot)
// are decisions/s against goroutines per library, and the p50, p99 and
// p99.9 latency per library at each goroutine count, in memory and on
// Redis: -images/bench-*.png.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
)

func main() {
	resultsFile := flag.String("results", "", "the run's results, in the Go benchmark format")
	memoryFile := flag.String("memory", "", "cmd/redismemory's output")
	out := flag.String("out", "docs/benchmarks.md", "the report to write")
	images := flag.String("images", "docs/images", "the directory of the plots")
	flag.Parse()
	if *resultsFile == "" || *memoryFile == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*resultsFile, *memoryFile, *out, *images); err != nil {
		log.Fatalf("benchreport: %v", err)
	}
}

func run(resultsFile, memoryFile, out, images string) error {
	raw, err := os.ReadFile(resultsFile)
	if err != nil {
		return err
	}
	redisMemory, err := os.ReadFile(memoryFile)
	if err != nil {
		return err
	}
	res, err := parseResults(bytes.NewReader(raw), resultsFile)
	if err != nil {
		return err
	}
	paths, err := writePlots(res, images, filepath.Dir(out))
	if err != nil {
		return err
	}
	var report bytes.Buffer
	if err := writeReport(&report, res, string(redisMemory), string(raw), paths); err != nil {
		return err
	}
	if err := os.WriteFile(out, report.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "benchreport: wrote %s and %d plots: %s\n", out, len(paths), describe(res))
	return nil
}
