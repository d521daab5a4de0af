#!/bin/sh
# redis.sh runs sluice's Redis benchmarks against a redis-server of its own
# and compares the limiters with benchstat.
#
# Usage: benchmarks/redis.sh [OUTDIR]   (default: bench/redis, in the SDK root; git ignores bench/)
#
# Environment: COUNT rounds (default 6), BENCHTIME per benchmark (default
# 2s), CEILING_DURATION per ceiling run (default 5s).
#
# One redis-server serves the whole run, so every limiter, round and ceiling
# meets the same server: it persists nothing and listens on a free port of
# 127.0.0.1, and it is killed on exit. Into OUTDIR go
#   env.txt             the machine, the versions and the settings;
#   memory.txt          Redis memory per bucket key (cmd/redismemory);
#   redis.txt           BenchmarkRedis, COUNT rounds;
#   ceiling.txt         the server's ceiling per script (cmd/redisceiling);
#   redis-benchmark.csv redis-benchmark's ceiling for redis_rate's script,
#                       a check on cmd/redisceiling (redis-benchmark cannot
#                       send sluice's binary argument);
#   benchstat.txt       the tables;
#   load.log            every 10s: the load average and the processes
#                       using the most CPU (ps's lifetime average), to tell
#                       a noisy round by;
#   redis-server.log.
# Each round runs everything once, so a burst of load from elsewhere on the
# machine widens every limiter's spread instead of shifting one of them.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-bench/redis}
count=${COUNT:-6}
benchtime=${BENCHTIME:-2s}
ceiling_duration=${CEILING_DURATION:-5s}
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
	echo "COUNT=$count BENCHTIME=$benchtime CEILING_DURATION=$ceiling_duration"
	echo "sha1 of internal/redisscript/tokenbucket.lua: $(sha1sum internal/redisscript/tokenbucket.lua | cut -d' ' -f1)"
	echo "uncommitted changes:"
	git status --porcelain 2>/dev/null || true
} >"$out/env.txt"

cd benchmarks
go build -o "$tmp/redisceiling" ./cmd/redisceiling
go run ./cmd/redismemory | tee "$out/memory.txt"
redis_rate_command=$("$tmp/redisceiling" -impl redis_rate -print-command)
impls_re='redis_rate|sluice-goredis|sluice-rueidis'

: >"$out/redis.txt"
: >"$out/ceiling.txt"
echo '"keys","test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"' >"$out/redis-benchmark.csv"
i=0
while [ "$i" -lt "$count" ]; do
	i=$((i + 1))
	echo "round $i of $count" >&2
	echo "$(date +%T) round $i of $count" >>"$out/load.log"
	# The three limiters its tables compare; peers.sh runs every peer.
	go test -run='^$' -bench="^BenchmarkRedis\$/keys/goroutines/impl=($impls_re)\$" -benchtime="$benchtime" -count=1 . >>"$out/redis.txt"
	for keys in 10000 1; do
		for impl in redis_rate sluice; do
			"$tmp/redisceiling" -impl "$impl" -keys "$keys" -c 4 -P 64 -duration "$ceiling_duration" >>"$out/ceiling.txt"
		done
		# Without -r every call is on one key, the literal
		# rate:ceiling:__rand_int__; with it, on one of $keys keys.
		random=
		if [ "$keys" -gt 1 ]; then
			random="-r $keys"
		fi
		# shellcheck disable=SC2086 # the command and $random are words
		redis-benchmark -h 127.0.0.1 -p "$port" -c 4 -P 64 -n 200000 $random --csv $redis_rate_command |
			sed -n "2s/^/\"$keys\",/p" >>"$out/redis-benchmark.csv"
	done
done

impls='/impl@(redis_rate sluice-goredis sluice-rueidis)'
{
	echo "## BenchmarkRedis: decisions/s, latency (µs) and sec/op; baseline redis_rate"
	$benchstat -col "$impls" -filter '.unit:(decisions/s OR p50-µs OR p99-µs OR sec/op)' "$out/redis.txt"
	echo
	echo "## BenchmarkRedis: CPU µs per decision, this process and the server"
	$benchstat -col "$impls" -filter '.unit:(client-µs/op OR server-µs/op)' "$out/redis.txt"
	echo
	echo "## The server's ceiling per script: -c 4 -P 64, calls replayed by cmd/redisceiling"
	$benchstat -col '/impl@(redis_rate sluice)' -filter '.unit:(requests/s OR server-µs/op OR script-µs/op)' "$out/ceiling.txt"
	echo
	echo "## redis-benchmark -c 4 -P 64 -n 200000 on redis_rate's script (requests/s, one line a round)"
	cat "$out/redis-benchmark.csv"
	echo
	echo "## Redis memory per bucket key"
	cat "$out/memory.txt"
} | tee "$out/benchstat.txt"
