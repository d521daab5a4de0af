#!/bin/sh
# rls.sh measures sluice-server against envoyproxy/ratelimit, the server of
# Envoy's rate limit service it replaces: decisions/s and the p50 and p99
# latency of ShouldRateLimit over gRPC (cmd/rlsload), with sluice-server's
# buckets in memory and on one redis-server of its own through each of its
# Redis clients, and envoyproxy/ratelimit (built from the Go module proxy)
# on the same redis-server, with benchstat tables against
# envoyproxy/ratelimit.
#
# Usage: benchmarks/rls.sh [OUTDIR]   (default: bench/server, in the SDK root; git ignores bench/)
#
# Environment: COUNT rounds (default 6), DURATION of each timed run
# (default 3s), WARMUP of untimed calls before it (default 1s), KEYS, the
# distinct descriptor values of a run (default "10000 1": 1 is one hot
# key), GOROUTINES calling at once (default "16 64"), RATELIMIT_VERSION,
# envoyproxy/ratelimit's module version (default the one below),
# REDIS_PIPELINE_WINDOW and REDIS_POOL_SIZE, envoyproxy/ratelimit's
# (default 150us and 10). The defaults take about 7 minutes on 2 CPUs, and
# a minute more the first time, to build envoyproxy/ratelimit.
#
# Every server gets the same limit: domain rlsbench, descriptor key client,
# 1,000,000 a second (sluice-server's ceiling for one second), so nearly
# every call is allowed and is one counter update: without an algorithm,
# sluice-server counts it in a fixed window aligned to the second, as
# envoyproxy/ratelimit does. Each server gets its best documented settings:
#   sluice-server  --fail-mode error (the default: no fail policy, as
#                  envoyproxy/ratelimit has none) --response-headers none
#                  (envoyproxy/ratelimit adds none by default);
#   envoyproxy/ratelimit  REDIS_TYPE=single, its README's recommended
#                  REDIS_PIPELINE_WINDOW (150us-500us: 150us; the version
#                  measured applies it to REDIS_TYPE=cluster only, so on
#                  one redis-server each call's INCRBY and EXPIRE go out
#                  as one pipeline flushed at once), its default
#                  REDIS_POOL_SIZE, no REDIS_PIPELINE_LIMIT (deprecated, no
#                  effect since radix v4), and DISABLE_STATS=true: no
#                  metrics, its fastest documented setting (USE_PROMETHEUS
#                  sends every call's timer through a channel to a
#                  statsd mapper, USE_STATSD=false alone logs it, and
#                  the default needs a statsd server). sluice-server keeps
#                  its Prometheus metrics, which it cannot turn off.
#
# Each round runs every configuration once (the servers' order turns by
# one each round), so a burst of load from elsewhere on the machine widens
# every server's spread instead of shifting one. Each server is started
# fresh in each round and the redis-server is flushed after it, so no
# server meets another's keys. Into OUTDIR go
#   results.txt  the run's facts (commit, machine, versions, settings, each
#                server's command) as configuration lines, then one
#                BenchmarkShouldRateLimit line per run;
#   benchstat.txt the tables;
#   load.log     every 10s: the load average and the busiest processes;
#   sluice-server.log, envoy-ratelimit.log, redis-server.log.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-bench/server}
count=${COUNT:-6}
duration=${DURATION:-3s}
warmup=${WARMUP:-1s}
keys_list=${KEYS:-10000 1}
goroutines_list=${GOROUTINES:-16 64}
ratelimit_version=${RATELIMIT_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}
pipeline_window=${REDIS_PIPELINE_WINDOW:-150us}
pool_size=${REDIS_POOL_SIZE:-10}
benchstat="go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da"
servers='sluice-memory sluice-goredis sluice-rueidis envoy-ratelimit'
# Each module is built by its own go.mod, as the Makefile builds it.
export GOWORK=off

cd "$root"
mkdir -p "$out"
out=$(cd "$out" && pwd)
# shellcheck source=benchmarks/server.sh
. "$root/benchmarks/server.sh"
peer=
# stop_peer stops the server under test, if one runs.
stop_peer() {
	if [ -n "$peer" ]; then
		kill "$peer" 2>/dev/null || true
		wait "$peer" 2>/dev/null || true
		peer=
	fi
}
trap 'stop_peer; cleanup' EXIT

echo "rls.sh: building sluice-server, envoyproxy/ratelimit $ratelimit_version and rlsload" >&2
(cd cmd/sluice-server && go build -o "$tmp/sluice-server" .)
GOBIN="$tmp/bin" go install "github.com/envoyproxy/ratelimit/src/service_cmd@$ratelimit_version"
(cd benchmarks && go build -o "$tmp/rlsload" ./cmd/rlsload)

# envoyproxy/ratelimit reads $RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/config/*.yaml;
# sluice-server the same file.
config=$tmp/runtime/rlsbench/config/rlsbench.yaml
mkdir -p "$(dirname "$config")"
cat >"$config" <<'EOF'
domain: rlsbench
descriptors:
  - key: client
    rate_limit:
      unit: second
      requests_per_unit: 1000000
EOF

sluice_flags='--fail-mode error --response-headers none'
ratelimit_env="REDIS_TYPE=single REDIS_SOCKET_TYPE=tcp BACKEND_TYPE=redis REDIS_PIPELINE_WINDOW=$pipeline_window REDIS_POOL_SIZE=$pool_size DISABLE_STATS=true USE_STATSD=false LOG_LEVEL=warn RUNTIME_WATCH_ROOT=false"
results=$out/results.txt
{
	run_facts rls.sh
	echo "envoy_ratelimit: github.com/envoyproxy/ratelimit $ratelimit_version ($(go version -m "$tmp/bin/service_cmd" | awk '$2 == "github.com/mediocregopher/radix/v4" {print "radix", $3}'))"
	echo "envoy_ratelimit_env: $ratelimit_env"
	echo "sluice_server_flags: $sluice_flags --redis ADDR --client go-redis|rueidis (none in memory)"
	echo "limit: domain rlsbench, descriptor (client, k0...kN-1), 1000000 a second, fixed window"
	echo "command: ${RLS_COMMAND:-sh benchmarks/rls.sh}"
	echo "settings: COUNT=$count DURATION=$duration WARMUP=$warmup KEYS=$keys_list GOROUTINES=$goroutines_list"
} >"$results"
cat "$results" >&2

# free_port prints a port of 127.0.0.1 that nothing listens on now.
free_port() {
	while :; do
		p=$(($(od -An -N2 -tu2 /dev/urandom) % 20000 + 20000))
		if [ -z "$(ss -Hltn "sport = :$p")" ]; then
			echo "$p"
			return
		fi
	done
}

# start_peer starts server NAME on free ports and sets peer (its pid) and
# grpc (its gRPC address) once it listens. It fails if the server exits,
# as it does when another process took a port first.
start_peer() {
	grpc_port=$(free_port)
	http_port=$(free_port)
	grpc=127.0.0.1:$grpc_port
	case $1 in
	sluice-memory)
		# shellcheck disable=SC2086 # the flags are words
		"$tmp/sluice-server" --config "$config" --grpc "$grpc" --http "127.0.0.1:$http_port" \
			$sluice_flags >>"$out/sluice-server.log" 2>&1 &
		;;
	sluice-goredis | sluice-rueidis)
		client=go-redis
		if [ "$1" = sluice-rueidis ]; then
			client=rueidis
		fi
		# shellcheck disable=SC2086 # the flags are words
		"$tmp/sluice-server" --config "$config" --grpc "$grpc" --http "127.0.0.1:$http_port" \
			$sluice_flags --redis "$addr" --client "$client" >>"$out/sluice-server.log" 2>&1 &
		;;
	envoy-ratelimit)
		# shellcheck disable=SC2086 # the settings are words
		env $ratelimit_env REDIS_URL="$addr" RUNTIME_ROOT="$tmp/runtime" RUNTIME_SUBDIRECTORY=rlsbench \
			GRPC_HOST=127.0.0.1 GRPC_PORT="$grpc_port" HOST=127.0.0.1 PORT="$http_port" \
			DEBUG_HOST=127.0.0.1 DEBUG_PORT="$(free_port)" \
			"$tmp/bin/service_cmd" >>"$out/envoy-ratelimit.log" 2>&1 &
		;;
	esac
	peer=$!
	tries=0
	while [ "$tries" -lt 150 ]; do
		if ! kill -0 "$peer" 2>/dev/null; then
			wait "$peer" || true
			peer=
			return 1
		fi
		if [ -n "$(ss -Hltn "sport = :$grpc_port")" ]; then
			return 0
		fi
		tries=$((tries + 1))
		sleep 0.1
	done
	echo "rls.sh: $1 did not listen on $grpc within 15s" >&2
	exit 1
}

# rotate prints its arguments but the first N (its first argument), then
# those N.
rotate() {
	n=$1
	shift
	while [ "$n" -gt 0 ]; do
		first=$1
		shift
		set -- "$@" "$first"
		n=$((n - 1))
	done
	echo "$@"
}

i=0
while [ "$i" -lt "$count" ]; do
	i=$((i + 1))
	# shellcheck disable=SC2086 # the servers are words
	order=$(rotate $(((i - 1) % 4)) $servers)
	echo "round $i of $count: $order" >&2
	echo "$(date +%T) round $i of $count: $order" >>"$out/load.log"
	for server in $order; do
		attempt=0
		until start_peer "$server"; do
			attempt=$((attempt + 1))
			if [ "$attempt" -ge 5 ]; then
				echo "rls.sh: could not start $server; see its log in $out" >&2
				exit 1
			fi
		done
		for keys in $keys_list; do
			for goroutines in $goroutines_list; do
				line=$("$tmp/rlsload" -target "$grpc" -server "$server" -keys "$keys" -goroutines "$goroutines" \
					-duration "$duration" -warmup "$warmup")
				echo "$line" >>"$results"
				echo "$line" >&2
			done
		done
		stop_peer
		if [ "$server" != sluice-memory ]; then
			redis-cli -p "$port" FLUSHALL >/dev/null
		fi
	done
done

{
	echo "## ShouldRateLimit over gRPC: decisions/s and latency (µs); baseline envoy-ratelimit"
	echo "## envoy-ratelimit: $ratelimit_env"
	$benchstat -col "/server@(envoy-ratelimit sluice-goredis sluice-rueidis sluice-memory)" \
		-filter '.unit:(decisions/s OR p50-µs OR p99-µs OR ok/op)' "$results"
} | tee "$out/benchstat.txt"
