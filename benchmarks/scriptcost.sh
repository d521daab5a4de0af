#!/bin/sh
# scriptcost.sh counts, with callgrind, the instructions redis-server runs
# per decision for sluice's token bucket and GCRA (one and two greedy
# bandwidths) and for redis_rate, and per PING on the same connection, so
# that the difference isolates the script's call (see cmd/scriptcost).
#
# Usage: benchmarks/scriptcost.sh [OUTDIR]   (default: bench/scriptcost, in the SDK root; git ignores bench/)
#
# Environment: N decisions per case (default 2000), KEYS per case (default
# 100), SCRIPTCOST_DIR a checkout whose benchmarks module is measured
# instead of this one (to compare two versions on one server in one run:
# the server, and so the counts, are this run's).
#
# Into OUTDIR go env.txt (the machine, the versions and the settings),
# scriptcost.txt (one line per case, in the Go benchmark format) and
# redis-server.log. Needs valgrind (callgrind_control) and redis-server on
# PATH. The server runs under callgrind, so it is some fifty times slower:
# about a minute at the defaults.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-bench/scriptcost}
n=${N:-2000}
keys=${KEYS:-100}
src=${SCRIPTCOST_DIR:-$root}

cd "$root"
mkdir -p "$out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d)
pid=
cleanup() {
	if [ -n "$pid" ]; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

{
	date -u '+%Y-%m-%dT%H:%M:%SZ'
	echo "commit $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown) ($src)"
	go version
	redis-server --version
	valgrind --version
	echo "N=$n KEYS=$keys"
	echo "uncommitted changes:"
	git -C "$src" status --porcelain 2>/dev/null || true
} >"$out/env.txt"

(cd "$src/benchmarks" && go build -o "$tmp/scriptcost" ./cmd/scriptcost)

# start_server starts redis-server under callgrind on a random port and
# waits until it answers with its own pid (another server may hold the
# port). Callgrind's pid is the server's: valgrind runs it in-process.
start_server() {
	port=$(($(od -An -N2 -tu2 /dev/urandom) % 20000 + 20000))
	valgrind --tool=callgrind --callgrind-out-file="$tmp/callgrind.out" \
		redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
		--daemonize no --dir "$tmp" --logfile "$out/redis-server.log" 2>"$tmp/valgrind.log" &
	pid=$!
	tries=0
	while [ "$tries" -lt 300 ]; do
		if ! kill -0 "$pid" 2>/dev/null; then
			wait "$pid" || true
			pid=
			return 1
		fi
		if redis-cli -p "$port" INFO server 2>/dev/null | grep -q "^process_id:$pid"; then
			return 0
		fi
		tries=$((tries + 1))
		sleep 0.1
	done
	echo "scriptcost.sh: redis-server on port $port did not answer" >&2
	exit 1
}
attempt=0
until start_server; do
	attempt=$((attempt + 1))
	if [ "$attempt" -ge 5 ]; then
		echo "scriptcost.sh: could not start redis-server under callgrind; see $tmp/valgrind.log" >&2
		exit 1
	fi
done
echo "redis-server 127.0.0.1:$port under callgrind (pid $pid)" >&2

"$tmp/scriptcost" -addr "127.0.0.1:$port" -pid "$pid" -out "$tmp/callgrind.out" -n "$n" -keys "$keys" |
	tee "$out/scriptcost.txt"
