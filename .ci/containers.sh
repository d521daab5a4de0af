#!/usr/bin/env bash
# Container engine for the test kit (testkit/, testcontainers-go) on CI
# machines that reach no image registry: Debian's package archive and the Go
# module proxy only. Runs as root; every step is skipped when already done.
#
#   eval "$(bash .ci/containers.sh up)"
#       1. installs podman (Debian's 4.3, with runc, conmon, netavark,
#          iptables...) when missing, configured by testkit/images/containers.conf
#          (runc with cgroupfs, ulimits under this sandbox's hard limits);
#       2. starts podman's Docker-compatible API service on
#          unix:///run/sluice-containers/podman.sock unless it answers already;
#       3. builds localhost/sluice/redis:7-debian and
#          localhost/sluice/postgres:15-debian from this machine's own Debian
#          binaries when missing or stale (testkit/images/build.sh), and runs
#          one container as a smoke test;
#       4. prints, on stdout and nothing else, `export NAME=value` lines:
#          DOCKER_HOST, TESTCONTAINERS_RYUK_DISABLED=true (Ryuk's image cannot
#          be pulled), TESTCONTAINERS_HOST_OVERRIDE=127.0.0.1 (/.dockerenv
#          makes testcontainers look for a gateway otherwise),
#          SLUICE_REDIS_IMAGE, SLUICE_POSTGRES_IMAGE and CONTAINERS_CONF.
#       Should podman fail at any step, it falls back to docker.io (20.10,
#       dockerd on unix:///run/sluice-containers/docker.sock).
#       Progress and timings go to stderr.
#
#   bash .ci/containers.sh down [--purge]
#       removes the containers and networks labelled org.testcontainers=true
#       (testcontainers makes a "reaper_default" network on Podman), stops the
#       API service (or dockerd) and the conmon processes left for containers
#       that are gone, removes the iptables rules and chains netavark or dockerd
#       added, and puts back the filter policies and ip_forward as they were
#       before `up`; --purge also removes the images and podman's storage
#       (podman system reset).
#
#   bash .ci/containers.sh env
#       prints the export lines of a running `up`, changing nothing.
#
# SLUICE_CONTAINER_ENGINE=podman|docker forces an engine (default: auto);
# SLUICE_CONTAINERS_DIR moves the state directory (/run/sluice-containers).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
images=$repo/testkit/images
state=${SLUICE_CONTAINERS_DIR:-/run/sluice-containers}
want=${SLUICE_CONTAINER_ENGINE:-auto}

log() { printf '[containers.sh %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

[ "$(id -u)" -eq 0 ] || die "run as root"

podman_sock=$state/podman.sock
docker_sock=$state/docker.sock

# --- shared helpers --------------------------------------------------------

# apt_install PACKAGE...: installs those not installed yet.
apt_install() {
	local missing=() p
	for p in "$@"; do
		[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
	done
	if [ "${#missing[@]}" -eq 0 ]; then
		log "already installed: $*"
		return 0
	fi
	local t=$EPOCHREALTIME
	log "apt-get install ${missing[*]}"
	# (called where set -e is off: each failure is returned by hand)
	if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; then
		log "apt-get install failed: apt-get update, then again"
		apt-get update -q >&2 || return 1
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 || return 1
	fi
	log "installed ${missing[*]} in $(since "$t")s"
}

# ping SOCKET: the engine's API answers on it.
ping() { [ -S "$1" ] && curl -sf -m 5 --unix-socket "$1" http://d/_ping >/dev/null 2>&1; }

# alive PIDFILE PATTERN: the process in PIDFILE runs and its command line matches PATTERN.
alive() {
	local pid cmdline
	pid=$(cat "$1" 2>/dev/null) || return 1
	[ -n "$pid" ] || return 1
	# read first: `| grep -q` could end tr with SIGPIPE, failing under pipefail
	cmdline=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || return 1
	[[ $cmdline =~ $2 ]]
}

# stop_pid PIDFILE PATTERN: SIGTERM, then SIGKILL after 15 s, to that process only.
stop_pid() {
	local pid i
	alive "$1" "$2" || { rm -f "$1"; return 0; }
	pid=$(cat "$1")
	log "stopping $2 (pid $pid)"
	kill -TERM "$pid" 2>/dev/null || true
	for i in $(seq 150); do
		[ -d "/proc/$pid" ] || break
		sleep 0.1
	done
	if [ -d "/proc/$pid" ]; then
		log "pid $pid still runs: SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$1"
}

# save_network_state: ip_forward and the built-in chains' policies as they
# are before the first engine starts (kept across repeated `up`s until `down`).
save_network_state() {
	mkdir -p "$state"
	[ -e "$state/ip_forward.orig" ] || cat /proc/sys/net/ipv4/ip_forward >"$state/ip_forward.orig"
	local cmd
	for cmd in iptables ip6tables; do
		[ -e "$state/$cmd.policies" ] && continue
		if command -v "$cmd-save" >/dev/null; then
			"$cmd-save" -t filter 2>/dev/null | sed -n 's/^:\(INPUT\|FORWARD\|OUTPUT\) \([A-Z]*\) .*/\1 \2/p' >"$state/$cmd.policies"
		else
			: >"$state/$cmd.policies"
		fi
	done
}

# engine_rules_off CMD: removes what netavark and dockerd add to CMD's tables
# (their chains, NETAVARK* and DOCKER*, the rules jumping to them from other
# chains, and dockerd's rules for docker0), leaving everyone else's rules, and puts back the filter
# table's policies saved by save_network_state (dockerd sets FORWARD to DROP).
engine_rules_off() {
	local cmd=$1 t rules rule chain n=0 engine='NETAVARK|DOCKER'
	command -v "$cmd-save" >/dev/null || return 0
	for t in filter nat mangle raw; do
		rules=$("$cmd-save" -t "$t" 2>/dev/null) || continue
		while read -r rule; do
			[ -n "$rule" ] || continue
			# iptables-save quotes as a shell does: eval splits the rule back
			eval "\"\$cmd\" -t \"\$t\" ${rule/#-A/-D}" 2>/dev/null && n=$((n + 1))
		done < <(grep -E -- "^-A .*( -j ($engine)| -[io] docker0 )" <<<"$rules" | grep -Ev -- "^-A ($engine)" || true)
		for chain in $(sed -nE "s/^:(($engine)[^ ]*) .*/\1/p" <<<"$rules"); do
			"$cmd" -t "$t" -F "$chain" 2>/dev/null || true
		done
		for chain in $(sed -nE "s/^:(($engine)[^ ]*) .*/\1/p" <<<"$rules"); do
			"$cmd" -t "$t" -X "$chain" 2>/dev/null && n=$((n + 1))
		done
	done
	if [ -e "$state/$cmd.policies" ]; then
		local chain policy
		for chain in INPUT FORWARD OUTPUT; do
			policy=$(sed -n "s/^$chain //p" "$state/$cmd.policies")
			"$cmd" -t filter -P "$chain" "${policy:-ACCEPT}" 2>/dev/null || true
		done
	fi
	[ "$n" -eq 0 ] || log "$cmd: removed $n engine rules and chains"
}

# containers.conf: the repository's, unless this machine's hard limits are
# lower than its pinned ulimits; then a copy with them lowered.
containers_conf() {
	local conf=$images/containers.conf nofile nproc hn hp
	nofile=$(sed -n 's/.*"nofile=\([0-9]*\):.*/\1/p' "$conf")
	nproc=$(sed -n 's/.*"nproc=\([0-9]*\):.*/\1/p' "$conf")
	hn=$(ulimit -Hn)
	hp=$(ulimit -Hu)
	if { [ "$hn" != unlimited ] && [ "$hn" -lt "$nofile" ]; } || { [ "$hp" != unlimited ] && [ "$hp" -lt "$nproc" ]; }; then
		[ "$hn" != unlimited ] && [ "$hn" -lt "$nofile" ] && nofile=$hn
		[ "$hp" != unlimited ] && [ "$hp" -lt "$nproc" ] && nproc=$hp
		mkdir -p "$state"
		sed -e "s/\"nofile=[0-9]*:[0-9]*\"/\"nofile=$nofile:$nofile\"/" \
			-e "s/\"nproc=[0-9]*:[0-9]*\"/\"nproc=$nproc:$nproc\"/" "$conf" >"$state/containers.conf"
		conf=$state/containers.conf
	fi
	echo "$conf"
}

# --- podman ----------------------------------------------------------------

podman_install() {
	apt_install podman runc crun conmon netavark aardvark-dns iptables catatonit containernetworking-plugins curl
	command -v podman >/dev/null
}

podman_start() {
	local conf_sum
	conf_sum=$(sha256sum <"$CONTAINERS_CONF" | cut -c1-16)
	if ping "$podman_sock"; then
		if [ "$(cat "$state/podman.conf.sum" 2>/dev/null)" = "$conf_sum" ]; then
			log "podman API already answers on $podman_sock"
			return 0
		fi
		log "$CONTAINERS_CONF changed since the API service started: restarting it"
	fi
	stop_pid "$state/podman.pid" 'podman.*system service'
	save_network_state
	rm -f "$podman_sock"
	local t=$EPOCHREALTIME i
	log "starting podman system service on unix://$podman_sock"
	setsid podman --log-level=warn system service --time=0 "unix://$podman_sock" \
		</dev/null >"$state/podman-service.log" 2>&1 9>&- &
	echo $! >"$state/podman.pid"
	echo "$conf_sum" >"$state/podman.conf.sum"
	await_api "podman API" "$podman_sock" "$state/podman.pid" 300 "$state/podman-service.log" "$t"
}

# await_api NAME SOCKET PIDFILE TRIES LOG START waits, TRIES times 0.1s at
# most, until the API on SOCKET answers, giving up early when the process
# in PIDFILE has exited (its command line is not matched: the child may
# not have exec'd the engine yet); it fails with LOG's tail when the API
# never answered.
await_api() {
	local name=$1 sock=$2 pidfile=$3 tries=$4 logfile=$5 start=$6 i pid
	pid=$(cat "$pidfile")
	for i in $(seq "$tries"); do
		ping "$sock" && break
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if ! ping "$sock"; then
		log "$name did not answer; its log:"
		tail -n 20 "$logfile" >&2 || true
		return 1
	fi
	log "$name answers after $(since "$start")s"
}

# podman_network: testcontainers puts every container on the network
# "bridge", or else on "reaper_default", which it creates when missing; Podman
# has no "bridge", and when tests run in parallel several create
# "reaper_default" at once and all but one fail (Podman 4.3 answers the
# duplicate with an error testcontainers does not take for a conflict).
# Creating it here avoids the race; down removes it by its label.
podman_network() {
	podman network exists reaper_default 2>/dev/null && return 0
	log "creating the network reaper_default for testcontainers"
	podman network create --label org.testcontainers=true reaper_default >/dev/null
}

podman_down() {
	command -v podman >/dev/null || return 0
	local ids pid cid
	ids=$(podman ps -aq --filter label=org.testcontainers=true 2>/dev/null || true)
	ids+=" $(podman ps -aq --filter label=org.sluicehq.testkit=smoke 2>/dev/null || true)"
	if [ -n "${ids// /}" ]; then
		log "removing containers: $(echo $ids)"
		# shellcheck disable=SC2086
		podman rm -f -v -t 2 $ids >/dev/null 2>&1 || true
	fi
	# testcontainers makes a "reaper_default" network on Podman, which has no
	# network called "bridge"
	ids=$(podman network ls -q --filter label=org.testcontainers=true 2>/dev/null || true)
	if [ -n "$ids" ]; then
		log "removing networks: $(echo $ids)"
		# shellcheck disable=SC2086
		podman network rm -f $ids >/dev/null 2>&1 || true
	fi
	stop_pid "$state/podman.pid" 'podman.*system service'
	rm -f "$podman_sock" "$state/podman.conf.sum"
	# conmon of exec sessions (wait strategies, Snapshot's psql) lingers
	# exit_command_delay (300 s by default, 15 in containers.conf)
	# after its container is gone: stop those whose container no longer exists.
	local existing gone=()
	existing=" $(podman ps -aq --no-trunc 2>/dev/null | tr '\n' ' ' || true) "
	for pid in $(pgrep -x conmon || true); do
		cid=$(tr '\0' '\n' 2>/dev/null <"/proc/$pid/cmdline" | sed -n '/^\(-c\|--cid\)$/{n;p;q}' || true)
		if [ -n "$cid" ] && [[ $existing != *" $cid "* ]]; then
			gone+=("$pid")
		fi
	done
	if [ "${#gone[@]}" -gt 0 ]; then
		log "stopping ${#gone[@]} conmon processes whose containers are gone: ${gone[*]}"
		kill -TERM "${gone[@]}" 2>/dev/null || true
	fi
	if [ "${purge:-}" = 1 ]; then
		log "podman system reset -f"
		podman system reset -f >/dev/null 2>&1 || log "podman system reset failed"
	fi
}

# --- docker.io -------------------------------------------------------------

docker_install() {
	apt_install docker.io iptables curl
	command -v dockerd >/dev/null
}

docker_start() {
	if ping "$docker_sock"; then
		log "dockerd already answers on $docker_sock"
		return 0
	fi
	stop_pid "$state/dockerd.pid" dockerd
	save_network_state
	local t=$EPOCHREALTIME i
	log "starting dockerd on unix://$docker_sock"
	setsid dockerd --host "unix://$docker_sock" --pidfile "$state/dockerd.pid.own" \
		</dev/null >"$state/dockerd.log" 2>&1 9>&- &
	echo $! >"$state/dockerd.pid"
	await_api dockerd "$docker_sock" "$state/dockerd.pid" 600 "$state/dockerd.log" "$t"
}

docker_down() {
	local d ids
	read -r -a d <<<"$(engine_cmd docker)"
	if ping "$docker_sock"; then
		ids=$("${d[@]}" ps -aq --filter label=org.testcontainers=true; "${d[@]}" ps -aq --filter label=org.sluicehq.testkit=smoke)
		if [ -n "$ids" ]; then
			log "removing containers: $(echo $ids)"
			# shellcheck disable=SC2086
			"${d[@]}" rm -f -v $ids >/dev/null 2>&1 || true
		fi
		ids=$("${d[@]}" network ls -q --filter label=org.testcontainers=true)
		if [ -n "$ids" ]; then
			log "removing networks: $(echo $ids)"
			# shellcheck disable=SC2086
			"${d[@]}" network rm $ids >/dev/null 2>&1 || true
		fi
		if [ "${purge:-}" = 1 ]; then
			"${d[@]}" system prune -af --volumes >/dev/null 2>&1 || true
		fi
	fi
	stop_pid "$state/dockerd.pid" dockerd
	rm -f "$docker_sock" "$state/dockerd.pid.own"
	if ip link show docker0 >/dev/null 2>&1; then
		ip link delete docker0 2>/dev/null || true
	fi
}

# --- steps -----------------------------------------------------------------

# engine_cmd ENGINE: the command line build.sh and the smoke test use.
engine_cmd() {
	case "$1" in
	podman) echo podman ;;
	# docker.io's own CLI, when there, matches its daemon
	docker) echo "$([ -x /usr/bin/docker ] && echo /usr/bin/docker || echo docker) -H unix://$docker_sock" ;;
	esac
}

# build_images ENGINE: runs build.sh; sets redis_image and postgres_image.
build_images() {
	local t=$EPOCHREALTIME out rc=0
	out=$(ENGINE=$(engine_cmd "$1") bash "$images/build.sh") || rc=$?
	# 3: the engine failed; anything else is no engine's fault: stop
	[ "$rc" -eq 3 ] && return 1
	[ "$rc" -eq 0 ] || die "testkit/images/build.sh failed (exit status $rc)"
	redis_image=$(sed -n 's/^SLUICE_REDIS_IMAGE=//p' <<<"$out")
	postgres_image=$(sed -n 's/^SLUICE_POSTGRES_IMAGE=//p' <<<"$out")
	[ -n "$redis_image" ] && [ -n "$postgres_image" ] || return 1
	log "images ready in $(since "$t")s: $redis_image $postgres_image"
}

# smoke ENGINE: one container answers, on the network testcontainers will use
# (which also sets up its bridge before the first test).
smoke() {
	local t=$EPOCHREALTIME e out net=()
	read -r -a e <<<"$(engine_cmd "$1")"
	[ "$1" = podman ] && net=(--network reaper_default)
	out=$(timeout 120 "${e[@]}" run --rm "${net[@]}" --label org.sluicehq.testkit=smoke "$redis_image" \
		sh -c 'redis-server --port 6390 --daemonize yes >/dev/null && sleep 0.3 && redis-cli -p 6390 ping' \
		2>"$state/smoke.err") || true
	# (stderr apart: podman warns "failed to connect to syslog" without /dev/log)
	if [ "$out" != PONG ]; then
		log "smoke test failed on $1: $out $(cat "$state/smoke.err")"
		return 1
	fi
	log "smoke test passed on $1 in $(since "$t")s"
}

print_env() {
	local engine=$1 sock
	case "$engine" in
	podman) sock=$podman_sock ;;
	docker) sock=$docker_sock ;;
	*) die "no engine recorded in $state/engine: run up" ;;
	esac
	printf 'export %s=%q\n' \
		DOCKER_HOST "unix://$sock" \
		TESTCONTAINERS_RYUK_DISABLED true \
		TESTCONTAINERS_HOST_OVERRIDE 127.0.0.1 \
		SLUICE_REDIS_IMAGE "$redis_image" \
		SLUICE_POSTGRES_IMAGE "$postgres_image"
	if [ "$engine" = podman ]; then
		printf 'export %s=%q\n' CONTAINERS_CONF "$CONTAINERS_CONF"
	fi
}

# try ENGINE: install, start, build, smoke; false at the first failure.
try() {
	local engine=$1
	"${engine}_install" || { log "$engine could not be installed"; return 1; }
	"${engine}_start" || return 1
	if [ "$engine" = podman ]; then
		podman_network || { log "podman network create failed"; return 1; }
	fi
	build_images "$engine" || { log "building the images on $engine failed"; return 1; }
	smoke "$engine" || return 1
	echo "$engine" >"$state/engine"
}

up() {
	local t=$EPOCHREALTIME engine=
	case "$want" in
	podman | docker) try "$want" && engine=$want ;;
	auto)
		# podman first, unless an earlier up fell back to docker already
		local first=podman second=docker
		if [ "$(cat "$state/engine" 2>/dev/null)" = docker ]; then
			first=docker second=podman
		fi
		if try "$first"; then
			engine=$first
		else
			log "$first does not work here: falling back to $second"
			"${first}_down"
			try "$second" && engine=$second
		fi
		;;
	*) die "SLUICE_CONTAINER_ENGINE: podman, docker or auto, not $want" ;;
	esac
	[ -n "$engine" ] || die "no container engine works"
	log "up on $engine in $(since "$t")s"
	print_env "$engine" >"$state/env"
	cat "$state/env"
}

down() {
	log "down"
	podman_down
	docker_down
	engine_rules_off iptables
	engine_rules_off ip6tables
	if [ -e "$state/ip_forward.orig" ]; then
		cat "$state/ip_forward.orig" >/proc/sys/net/ipv4/ip_forward
		log "ip_forward back to $(cat /proc/sys/net/ipv4/ip_forward)"
	fi
	rm -f "$state"/{engine,env,ip_forward.orig,iptables.policies,ip6tables.policies,containers.conf}
}

mkdir -p "$state"
CONTAINERS_CONF=$(containers_conf)
export CONTAINERS_CONF

# one run at a time
exec 9>"$state/lock"
flock 9

redis_image=
postgres_image=
purge=
case "${1:-}" in
up) up ;;
down)
	[ "${2:-}" = --purge ] && purge=1
	down
	;;
env)
	[ -s "$state/env" ] || die "not up: run up"
	cat "$state/env"
	;;
*)
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
	;;
esac
