#!/bin/sh
# algorithms.sh measures sluice's algorithms on one redis-server of its own:
# Redis memory per bucket key (cmd/redismemory) and decisions per second
# (BenchmarkAlgorithms, every algorithm and redis_rate in each round), with
# benchstat tables against the token bucket.
#
# Usage: benchmarks/algorithms.sh [OUTDIR]   (default: bench/algorithms, in the SDK root)
#
# Environment: COUNT rounds (default 6), BENCHTIME per benchmark (default 2s).
# Into OUTDIR go env.txt, memory.txt, algorithms.txt (the raw rounds),
# benchstat.txt, load.log and redis-server.log.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-bench/algorithms}
count=${COUNT:-6}
benchtime=${BENCHTIME:-2s}
benchstat="go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da"

cd "$root"
mkdir -p "$out"
out=$(cd "$out" && pwd)
# shellcheck source=benchmarks/server.sh
. "$root/benchmarks/server.sh"

{
	date -u '+%Y-%m-%dT%H:%M:%SZ'
	echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
	go version
	redis-server --version
	echo "CPUs: $(getconf _NPROCESSORS_ONLN) $(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2)"
	echo "COUNT=$count BENCHTIME=$benchtime"
	echo "uncommitted changes:"
	git status --porcelain 2>/dev/null || true
} >"$out/env.txt"

cd benchmarks
go run ./cmd/redismemory | tee "$out/memory.txt"
# Each round runs every algorithm once, so a burst of load from elsewhere on
# the machine widens every algorithm's spread instead of shifting one.
go test -c -o "$tmp/benchmarks.test" .
: >"$out/algorithms.txt"
i=0
while [ "$i" -lt "$count" ]; do
	i=$((i + 1))
	echo "round $i of $count" >&2
	echo "$(date +%T) round $i of $count" >>"$out/load.log"
	"$tmp/benchmarks.test" -test.run='^$' -test.bench='^BenchmarkAlgorithms$' -test.benchtime="$benchtime" -test.count=1 >>"$out/algorithms.txt"
done

{
	echo "## BenchmarkAlgorithms: decisions/s, latency (µs), sec/op; baseline TokenBucket"
	$benchstat -col '/algorithm@(TokenBucket GCRA FixedWindow SlidingWindowLog SlidingWindowCounter LeakyBucket redis_rate)' \
		-filter '.unit:(decisions/s OR p50-µs OR p99-µs OR sec/op OR server-µs/op)' "$out/algorithms.txt"
	echo
	echo "## Redis memory per bucket key"
	cat "$out/memory.txt"
} | tee "$out/benchstat.txt"
