#!/bin/sh
# burst.sh measures healthy decision latency under a burst (cmd/burstlatency):
# two replica processes × 100 simultaneous calls on one key, for go-redis
# (default pool, pool of 100) and rueidis: on the idle machine, with a CPU
# burner spinning on every core, and idle again.
#
# Usage: benchmarks/burst.sh [OUTDIR]
#   (default: benchmarks/results/<UTC date>-<short HEAD>-burst)
#
# Environment: BURSTS per client (default 300), BURN threads of the loaded
# run (default: the number of CPUs), SOURCE=head (default: build the SDK as
# committed at HEAD, from git archive, with this checkout's
# cmd/burstlatency) or SOURCE=worktree (build the checkout as it is).
# Into OUTDIR go env.txt, idle.txt, loaded.txt, idle-again.txt (idle once
# more, after the loaded run) and load.log. Each run starts and stops a
# redis-server of its own.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
rev=$(git rev-parse --short HEAD)
out=${1:-benchmarks/results/$(date -u +%Y-%m-%d)-$rev-burst}
bursts=${BURSTS:-300}
burn=${BURN:-$(getconf _NPROCESSORS_ONLN)}
source=${SOURCE:-head}
mkdir -p "$out"
out=$(cd "$out" && pwd)

tmp=$(mktemp -d)
sampler=
cleanup() {
	if [ -n "$sampler" ]; then
		kill "$sampler" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

case $source in
head)
	git archive HEAD | tar -x -C "$tmp"
	mkdir -p "$tmp/benchmarks/cmd/burstlatency"
	cp benchmarks/cmd/burstlatency/*.go "$tmp/benchmarks/cmd/burstlatency/"
	src=$tmp
	;;
worktree) src=$root ;;
*)
	echo "burst.sh: SOURCE=$source: want head or worktree" >&2
	exit 2
	;;
esac
(cd "$src/benchmarks" && go build -o "$tmp/burstlatency" ./cmd/burstlatency)

{
	date -u '+%Y-%m-%dT%H:%M:%SZ'
	echo "commit $rev"
	if [ "$source" = head ]; then
		echo "built from: git archive HEAD, plus the checkout's benchmarks/cmd/burstlatency (not committed)"
	else
		echo "built from: the checkout as it is (uncommitted changes below included)"
	fi
	echo "\$ go version"
	go version
	echo "\$ redis-server --version"
	redis-server --version
	echo "\$ nproc"
	nproc
	echo "\$ uname -a"
	uname -a
	echo "CPU: $(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2)"
	echo "BURSTS=$bursts BURN=$burn SOURCE=$source"
	echo "uncommitted changes in the checkout:"
	git status --porcelain 2>/dev/null || true
} >"$out/env.txt"

# The machine may be shared, so the log says what else ran meanwhile:
# every 5s the load average, the share of CPU time busy over those 5s (from
# /proc/stat), and the commands of the processes running at that moment.
cpu_times() { head -1 /proc/stat; }
sample_load() {
	prev=$(cpu_times)
	while :; do
		sleep 5
		cur=$(cpu_times)
		busy=$(printf '%s\n%s\n' "$prev" "$cur" | awk '{idle = $5 + $6; total = 0; for (i = 2; i <= NF; i++) total += $i; if (NR == 1) { i0 = idle; t0 = total } else printf "%.0f", 100 * (1 - (idle - i0) / (total - t0)) }')
		prev=$cur
		echo "$(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg) cpu-busy ${busy}% running: $(ps -eo stat=,comm= | awk '$1 ~ /^R/ {printf "%s ", $2}')"
	done
}
: >"$out/load.log"
sample_load >>"$out/load.log" 2>/dev/null &
sampler=$!

echo "$(date +%T) idle run" >>"$out/load.log"
"$tmp/burstlatency" -bursts "$bursts" | tee "$out/idle.txt"
echo "$(date +%T) loaded run, burner on $burn threads" >>"$out/load.log"
"$tmp/burstlatency" -bursts "$bursts" -burn "$burn" | tee "$out/loaded.txt"
# Idle again, to see how much the machine's other work moved the idle run.
echo "$(date +%T) idle run again" >>"$out/load.log"
"$tmp/burstlatency" -bursts "$bursts" | tee "$out/idle-again.txt"
echo "$(date +%T) done" >>"$out/load.log"
