#!/bin/sh
# scriptcost.sh counts, with callgrind, the instructions redis-server runs
# per decision for sluice's token bucket and GCRA (one and two greedy
# bandwidths), its fixed window, sliding window counter and sliding log
# (one), and for redis_rate, and per PING on the same connection, so that
# the difference
# isolates the script's call (see cmd/scriptcost).
#
# Usage: benchmarks/scriptcost.sh [OUTDIR]   (default: bench/scriptcost, in the SDK root; git ignores bench/)
#
# Environment: N decisions per case (default 2000), KEYS per case (default
# 100), CASES a regular expression naming the cases to measure (default
# all; PING always), SCRIPTCOST_DIR a checkout whose benchmarks module is measured
# instead of this one (to compare two versions on one server in one run:
# the server, and so the counts, are this run's).
#
# Into OUTDIR go env.txt (the machine, the versions and the settings),
# scriptcost.txt (one line per case, in the Go benchmark format),
# callgrind.out.N (callgrind's dump of each case) and redis-server.log. Needs valgrind (callgrind_control) and redis-server on
# PATH. The server runs under callgrind, so it is some fifty times slower:
# about a minute at the defaults.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-bench/scriptcost}
n=${N:-2000}
keys=${KEYS:-100}
cases=${CASES:-}
src=${SCRIPTCOST_DIR:-$root}

cd "$root"
mkdir -p "$out"
out=$(cd "$out" && pwd)
# The server runs under callgrind (callgrind's pid is the server's:
# valgrind runs it in-process), and answers some fifty times slower.
tmp=$(mktemp -d)
server_prefix="valgrind --tool=callgrind --callgrind-out-file=$tmp/callgrind.out --log-file=$tmp/valgrind.log"
server_tries=300
# shellcheck source=benchmarks/server.sh
. "$root/benchmarks/server.sh"

{
	date -u '+%Y-%m-%dT%H:%M:%SZ'
	echo "commit $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown) ($src)"
	go version
	redis-server --version
	valgrind --version
	echo "N=$n KEYS=$keys CASES=$cases"
	echo "uncommitted changes:"
	git -C "$src" status --porcelain 2>/dev/null || true
} >"$out/env.txt"

(cd "$src/benchmarks" && go build -o "$tmp/scriptcost" ./cmd/scriptcost)

"$tmp/scriptcost" -addr "127.0.0.1:$port" -pid "$pid" -out "$tmp/callgrind.out" -n "$n" -keys "$keys" -cases "$cases" |
	tee "$out/scriptcost.txt"
# callgrind's dumps, one per case in order (callgrind.out.1 is PING's): on
# a redis-server with symbols (Debian's is stripped), callgrind_annotate
# says where a case's instructions go.
cp "$tmp"/callgrind.out.* "$out/"
