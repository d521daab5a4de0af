#!/bin/sh
# peers.sh runs the whole comparison of sluice with its peers, in memory and
# on one redis-server of its own, and writes docs/benchmarks.md and its
# plots (docs/images/bench-*.png) from the results (cmd/benchreport).
#
# Usage: benchmarks/peers.sh [OUTDIR]   (default: bench/peers, in the SDK root; git ignores bench/)
#
# Environment: BENCHTIME per benchmark (default 1s), COUNT runs of each
# (default 1), CEILING_DURATION per ceiling run (default 5s). The defaults
# take about 5 minutes on 2 CPUs.
#
# Into OUTDIR go
#   results.txt  the run's facts (commit, machine, versions, command) as
#                configuration lines, then BenchmarkAllowGoroutines,
#                BenchmarkKeyMemory, BenchmarkRedis and the server's
#                pipelined ceiling (cmd/redisceiling), all in the Go
#                benchmark format;
#   memory.txt   Redis memory per bucket key (cmd/redismemory);
#   load.log     every 10s: the load average and the busiest processes;
#   redis-server.log.
# The commit is that of HEAD; a tree with uncommitted changes is marked
# dirty in the report, which then is not one to publish.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-bench/peers}
benchtime=${BENCHTIME:-1s}
count=${COUNT:-1}
ceiling_duration=${CEILING_DURATION:-5s}

cd "$root"
mkdir -p "$out"
out=$(cd "$out" && pwd)
# shellcheck source=benchmarks/server.sh
. "$root/benchmarks/server.sh"

results=$out/results.txt
{
	run_facts peers.sh
	echo "command: ${PEERS_COMMAND:-sh benchmarks/peers.sh}"
	echo "settings: BENCHTIME=$benchtime COUNT=$count CEILING_DURATION=$ceiling_duration"
} >"$results"

cd benchmarks
go test -c -o "$tmp/benchmarks.test" .
go build -o "$tmp/redisceiling" ./cmd/redisceiling
go build -o "$tmp/benchreport" ./cmd/benchreport
# run FILE COMMAND... runs the command with its output appended to FILE (and
# shown), and stops the script when the command fails: sh has no pipefail.
run() {
	file=$1
	shift
	{ "$@" || echo "$*" >"$tmp/failed"; } | tee -a "$file"
	if [ -f "$tmp/failed" ]; then
		echo "peers.sh: failed: $(cat "$tmp/failed")" >&2
		exit 1
	fi
}
bench() {
	run "$results" "$tmp/benchmarks.test" -test.run='^$' -test.count=1 "$@"
}
# rounds LABEL BENCHMARK runs BENCHMARK COUNT times, in rounds, each run of
# it running every library once: the runs of every library at one
# goroutine count then lie seconds apart, so that a machine whose speed
# drifts over minutes (this one's neighbours, which CPUs it is given)
# widens every library's spread alike, where -test.count=COUNT would run
# all of one library's runs in one stretch and another's in the next.
rounds() {
	i=1
	while [ "$i" -le "$count" ]; do
		echo "$(date +%T) $1, round $i of $count" >>"$out/load.log"
		bench -test.bench="$2" -test.benchtime="$benchtime"
		i=$((i + 1))
	done
}
rounds "in memory" '^BenchmarkAllowGoroutines$'
# Each op of BenchmarkKeyMemory fills a limiter with 100k keys: three are
# plenty for a figure that hardly varies.
bench -test.bench='^BenchmarkKeyMemory$' -test.benchtime=3x
rounds Redis '^BenchmarkRedis$'
echo "$(date +%T) ceilings" >>"$out/load.log"
for keys in 10000 1; do
	for impl in redis_rate sluice; do
		run "$results" "$tmp/redisceiling" -impl "$impl" -keys "$keys" -c 4 -P 64 -duration "$ceiling_duration"
	done
done
: >"$out/memory.txt"
run "$out/memory.txt" go run ./cmd/redismemory

"$tmp/benchreport" -results "$results" -memory "$out/memory.txt" -out "$root/docs/benchmarks.md" -images "$root/docs/images"
