# server.sh is sourced by the benchmark scripts: it starts the one
# redis-server a run uses (no persistence, a free port of 127.0.0.1, killed
# on exit), exports its address as SLUICE_REDIS_ADDR, and samples the load
# into $out/load.log. The sourcing script sets out (an absolute directory)
# before sourcing it, and gets tmp, pid and port. It may also set tmp (a
# directory of its own, which is removed on exit like the one made here),
# server_prefix (a command to run redis-server under, as scriptcost.sh runs
# it under callgrind) and server_tries (how many tenths of a second to
# wait for the server to answer; 100 unless set).
tmp=${tmp:-$(mktemp -d)}
pid=
sampler=
cleanup() {
	if [ -n "$sampler" ]; then
		kill "$sampler" 2>/dev/null || true
	fi
	if [ -n "$pid" ]; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# run_facts prints a run's facts as configuration lines (commit, whether
# the tree is dirty, date, Go, CPU, kernel, Redis), for a results file's
# head; $1 names the script in the warning of a dirty tree, whose results
# are not ones to publish.
run_facts() {
	dirty=false
	if [ -n "$(git status --porcelain 2>/dev/null)" ]; then
		dirty=true
		echo "$1: the tree has uncommitted changes; the results say dirty" >&2
	fi
	echo "commit: $(git rev-parse --short HEAD)"
	echo "dirty: $dirty"
	echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo "go_version: $(go version)"
	echo "cpu_model: $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
	echo "cpus: $(getconf _NPROCESSORS_ONLN)"
	echo "kernel: $(uname -sr)"
	echo "redis_server: $(redis-server --version)"
}

# start_server starts redis-server on a random port and waits until it
# answers. It fails when the port is taken, and redis-cli could then reach
# another server on it, so the answer must carry this server's pid.
start_server() {
	port=$(($(od -An -N2 -tu2 /dev/urandom) % 20000 + 20000))
	# shellcheck disable=SC2086 # the prefix is a command and its arguments
	${server_prefix:-} redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
		--daemonize no --dir "$tmp" --logfile "$out/redis-server.log" &
	pid=$!
	tries=0
	while [ "$tries" -lt "${server_tries:-100}" ]; do
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
	echo "redis.sh: redis-server on port $port did not answer" >&2
	exit 1
}
attempt=0
until start_server; do
	attempt=$((attempt + 1))
	if [ "$attempt" -ge 5 ]; then
		echo "redis.sh: could not start redis-server; see $out/redis-server.log" >&2
		exit 1
	fi
done
addr=127.0.0.1:$port
export SLUICE_REDIS_ADDR="$addr"
echo "redis-server $addr (pid $pid)" >&2

# The machine is shared, so the log says what else ran meanwhile.
sample_load() {
	while :; do
		echo "$(date +%T) $(cut -d' ' -f1-3 /proc/loadavg) $(ps -eo pcpu=,comm= --sort=-pcpu | head -4 | awk '{printf "%s %s; ", $1, $2}')"
		sleep 10
	done
}
: >"$out/load.log"
sample_load >>"$out/load.log" 2>/dev/null &
sampler=$!

