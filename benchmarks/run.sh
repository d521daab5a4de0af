#!/bin/sh
# run.sh runs the in-memory benchmarks of ns/op and allocations
# (backend/memory's BenchmarkMemoryAllow, and BenchmarkAllow and
# BenchmarkParallelCeiling here) and compares them with benchstat. The full
# comparison with the peers, in memory and on Redis, is peers.sh's.
#
# Usage: benchmarks/run.sh [OUTDIR]   (default: bench, in the SDK root; git ignores it)
#
# Each of COUNT rounds (default 6) runs every benchmark once, so the samples
# of every implementation are spread over the same stretch of time: a burst
# of load from elsewhere on the machine then widens every implementation's
# spread instead of shifting one of them. (go test -count=6 runs one
# benchmark six times in a row.)
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-bench}
count=${COUNT:-6}
benchstat="go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da"

cd "$root"
mkdir -p "$out"
: >"$out/memory.txt"
: >"$out/peers.txt"
i=0
while [ "$i" -lt "$count" ]; do
	i=$((i + 1))
	echo "round $i of $count" >&2
	go test -run='^$' -bench=BenchmarkMemoryAllow -benchmem -count=1 ./backend/memory >>"$out/memory.txt"
	(cd benchmarks && go test -run='^$' -bench='^Benchmark(Allow|ParallelCeiling)$' -benchmem -count=1 -cpu=1,2 .) >>"$out/peers.txt"
done

units='.unit:(sec/op OR allocs/op)'
{
	echo "## sluice memory backend: serial vs parallel"
	$benchstat -col /mode -filter "$units" "$out/memory.txt"
	echo
	echo "## sluice vs peers (baseline: x/time/rate, one Limiter per key in a sync.Map)"
	$benchstat -col '/impl@(xrate sluice sethvargo ulule throttled)' -filter "$units" "$out/peers.txt"
	echo
	echo "## serial vs parallel, per implementation"
	$benchstat -col /mode -filter "$units" "$out/peers.txt"
} | tee "$out/benchstat.txt"
