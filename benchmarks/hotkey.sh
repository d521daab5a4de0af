#!/bin/sh
# hotkey.sh measures one hot key on a 3-master Redis Cluster, unsplit and
# split by the sharding package (internal/test/distributed's BenchmarkHotKey),
# and what the decorator costs a key it passes through (sharding's
# BenchmarkPassThrough, on the memory backend); and one hot key shared by
# two processes on one standalone server, with and without the lease
# package (BenchmarkHotKeyLeased): six rounds of each, with benchstat tables
# of decisions/s, p99, store calls and server CPU per decision, ns/op and
# allocs/op.
#
# Usage: benchmarks/hotkey.sh [OUTDIR]
#   (default: benchmarks/results/<UTC date>-<short HEAD>-hotkey)
#
# Into OUTDIR go env.txt, hotkey.txt, passthrough.txt, leased.txt (the raw
# go test output) and benchstat.txt. Each round of BenchmarkHotKey starts a
# cluster of its own, and each of BenchmarkHotKeyLeased a server, on free
# ports of 127.0.0.1, from the redis-server on $PATH.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
rev=$(git rev-parse --short HEAD)
out=${1:-benchmarks/results/$(date -u +%Y-%m-%d)-$rev-hotkey}
count=${COUNT:-6}
mkdir -p "$out"

{
	date -u '+%Y-%m-%dT%H:%M:%SZ'
	echo "commit $rev"
	echo "\$ go version"
	go version
	echo "\$ redis-server --version"
	redis-server --version
	echo "\$ nproc"
	nproc
	echo "CPU: $(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2)"
	echo "uncommitted changes in the checkout:"
	git status --porcelain 2>/dev/null || true
} >"$out/env.txt"

go test -run '^$' -bench 'HotKey$' -benchtime 20000x -count "$count" ./internal/test/distributed | tee "$out/hotkey.txt"
go test -run '^$' -bench PassThrough -count "$count" ./sharding | tee "$out/passthrough.txt"
# 20000x is 2s of load a row: BenchmarkHotKeyLeased's b.N counts 100µs.
go test -run '^$' -bench HotKeyLeased -benchtime 20000x -count "$count" ./internal/test/distributed | tee "$out/leased.txt"

# The version run.sh pins.
benchstat="go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da"
{
	echo "# one hot key: split=bare is the backend alone, pass the decorator passing the key through, n3 and n6 the key split 3 and 6 ways"
	$benchstat -col /split "$out/hotkey.txt"
	echo
	echo "# a key no rule matches, on the memory backend"
	$benchstat -col /backend "$out/passthrough.txt"
	echo
	echo "# one hot key, 2 processes on one server: lease=off is the backend alone, on the lease decorator over it"
	$benchstat -col /lease "$out/leased.txt"
} | tee "$out/benchstat.txt"
