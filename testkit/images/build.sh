#!/usr/bin/env bash
# Builds the test kit's container images from this machine's own Debian
# binaries, for machines that cannot pull from an image registry:
#
#   localhost/sluice/redis:7-debian          /usr/bin/redis-server (+ redis-cli)
#   localhost/sluice/postgres:<major>-debian /usr/lib/postgresql/<major> (15 on bookworm)
#
# Each image is `FROM scratch` + `ADD rootfs.tar`: the binaries, the shared
# libraries ldd lists for them, a static busybox (Debian's busybox-static,
# fetched with `apt-get download` unless installed) for the entrypoint's
# shell, and an entrypoint after the official image's (see */Containerfile
# and */docker-entrypoint.sh beside this script).
#
# Usage: build.sh [--force] [redis|postgres|all]   (default: all; as root)
#   ENGINE                the engine's command line, word-split
#                         (default: podman; e.g. "docker -H unix:///run/x.sock")
#   SLUICE_TESTKIT_CACHE  where busybox-static's .deb is kept
#                         (default: /var/cache/sluice-testkit)
#   PG_MAJOR              PostgreSQL major version (default: newest installed)
#
# An image is rebuilt only when missing, when --force is given, or when its
# inputs changed: the label org.sluicehq.testkit.inputs holds a hash of this
# script, the image's directory and the host binaries. Stdout gets one line
# per image, SLUICE_REDIS_IMAGE=<ref> and SLUICE_POSTGRES_IMAGE=<ref>;
# progress, sizes and timings go to stderr. Exit status 3 means the engine
# failed to build; others, that the inputs could not be put together.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
read -r -a engine <<<"${ENGINE:-podman}"
cache=${SLUICE_TESTKIT_CACHE:-/var/cache/sluice-testkit}
label=org.sluicehq.testkit.inputs
redis_ref=localhost/sluice/redis:7-debian

log() { printf '[build.sh %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
# since T0: seconds from $EPOCHREALTIME T0 to now, to a tenth
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

workdirs=()
cleanup() { [ "${#workdirs[@]}" -eq 0 ] || rm -rf "${workdirs[@]}"; }
trap cleanup EXIT

force=
what=all
for arg in "$@"; do
	case "$arg" in
	--force) force=1 ;;
	redis | postgres | all) what=$arg ;;
	-h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
	*) die "unknown argument: $arg" ;;
	esac
done

pg_major() {
	if [ -n "${PG_MAJOR:-}" ]; then echo "$PG_MAJOR"; return; fi
	local d
	d=$(ls -d /usr/lib/postgresql/*/bin/postgres 2>/dev/null | sort -V | tail -n 1)
	[ -n "$d" ] || die "no /usr/lib/postgresql/*/bin/postgres: apt-get install postgresql"
	d=${d#/usr/lib/postgresql/}
	echo "${d%%/*}"
}

# static_busybox: the path of a statically linked busybox.
static_busybox() {
	local b
	for b in /usr/bin/busybox /bin/busybox; do
		if [ -x "$b" ] && ! ldd "$b" >/dev/null 2>&1; then
			echo "$b"
			return
		fi
	done
	b=$cache/busybox-static/bin/busybox
	if [ ! -x "$b" ]; then
		mkdir -p "$cache"
		rm -f "$cache"/busybox-static_*.deb
		log "apt-get download busybox-static"
		# _apt cannot write to a directory of root's: download as root, quietly
		if ! (cd "$cache" && apt-get download -q busybox-static >/dev/null 2>&1); then
			apt-get update -q >&2
			(cd "$cache" && apt-get download -q busybox-static >/dev/null 2>&1) ||
				die "apt-get download busybox-static failed"
		fi
		rm -rf "$cache/busybox-static"
		dpkg-deb -x "$cache"/busybox-static_*.deb "$cache/busybox-static"
	fi
	[ -x "$b" ] || die "no static busybox in busybox-static's package"
	echo "$b"
}

# new_rootfs DIR: a skeleton with the host's merged-/usr links, busybox and
# its applets, /etc/passwd and /etc/group with root only, and /tmp.
new_rootfs() {
	local r=$1 d bb a
	mkdir -p "$r"/{etc,tmp,root,usr/bin,usr/sbin,usr/lib,usr/local/bin,var/run,var/tmp,dev,proc,sys}
	chmod 1777 "$r/tmp" "$r/var/tmp"
	chmod 700 "$r/root"
	for d in bin sbin lib lib64; do
		if [ -L "/$d" ]; then
			ln -s "$(readlink "/$d")" "$r/$d"
			mkdir -p "$r/$(readlink -f "/$d")"
		elif [ -d "/$d" ]; then
			mkdir -p "$r/$d"
		fi
	done
	bb=$(static_busybox)
	install -m 755 "$bb" "$r/usr/bin/busybox"
	for a in $("$bb" --list-full); do
		[ -e "$r/$a" ] || [ -L "$r/$a" ] || ln -s /usr/bin/busybox "$r/$a"
	done
	printf 'root:x:0:0:root:/root:/bin/sh\n' >"$r/etc/passwd"
	printf 'root:x:0:\n' >"$r/etc/group"
	printf 'passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n' >"$r/etc/nsswitch.conf"
	printf '/bin/sh\n' >"$r/etc/shells"
}

# ldd_deps FILE...: one line "FILE LIBRARY" for each library ldd lists for
# each FILE ("FILE -" for one not found); nothing for static or non-ELF files.
# One ldd for all: it is most of the build's time otherwise.
ldd_deps() {
	{ ldd "$@" 2>/dev/null || true; } | awk -v n="$#" -v first="$1" '
		BEGIN { file = (n == 1) ? first : "" }
		/^[^ \t].*:$/ { file = substr($0, 1, length($0) - 1); next }
		/not found/ { print file, "-"; next }
		/=> \// { print file, $3; next }
		/^[ \t]+\// { print file, $1 }'
}

# copy_in ROOTFS PATH...: each PATH (symlinks followed) at the same place.
copy_in() {
	local r=$1 f
	shift
	for f in "$@"; do
		[ -e "$r$f" ] && continue
		mkdir -p "$r$(dirname "$f")" && cp -L "$f" "$r$f" || die "copying $f into the image failed"
	done
}

# add_files ROOTFS FILE...: the files and the shared libraries ldd lists for
# them; a library not found fails the build.
add_files() {
	local r=$1 deps libs l
	shift
	deps=$(ldd_deps "$@")
	if grep -q ' -$' <<<"$deps"; then
		die "libraries not found for: $(grep ' -$' <<<"$deps" | cut -d' ' -f1 | sort -u | tr '\n' ' ')"
	fi
	copy_in "$r" "$@"
	libs=$(cut -d' ' -f2 <<<"$deps" | sort -u)
	# shellcheck disable=SC2086
	copy_in "$r" $libs
	# the loader must stay executable, or exec fails with permission denied
	for l in $libs; do
		case "$l" in */ld-linux*) chmod 755 "$r$l" ;; *) chmod 644 "$r$l" ;; esac
	done
}

# inputs_hash IMAGE_DIR HOST_FILE...: what the image is made from.
inputs_hash() {
	local dir=$1
	shift
	{
		sha256sum "${BASH_SOURCE[0]}" "$dir"/*
		sha256sum "$@"
	} | sha256sum | cut -c1-16
}

current_label() {
	"${engine[@]}" image inspect --format "{{ index .Config.Labels \"$label\" }}" "$1" 2>/dev/null || true
}

# build REF DIR HASH ROOTFS_FUNCTION [BUILD_ARG...]
build() {
	local ref=$1 dir=$2 hash=$3 make_rootfs=$4 work start old size
	shift 4
	if [ -z "$force" ] && [ "$(current_label "$ref")" = "$hash" ]; then
		log "$ref is up to date (inputs $hash)"
		return
	fi
	start=$EPOCHREALTIME
	old=$("${engine[@]}" image inspect --format '{{.Id}}' "$ref" 2>/dev/null || true)
	work=$(mktemp -d /tmp/sluice-image.XXXXXX)
	workdirs+=("$work")
	log "building $ref (inputs $hash) in $work"
	"$make_rootfs" "$work/rootfs"
	tar --numeric-owner -C "$work/rootfs" -cf "$work/rootfs.tar" .
	cp "$dir/Containerfile" "$work/Containerfile"
	local rootfs_s engine_t
	rootfs_s=$(since "$start")
	engine_t=$EPOCHREALTIME
	# exit status 3: the engine failed (the caller may try another engine)
	"${engine[@]}" build -q --label "$label=$hash" "$@" -t "$ref" -f "$work/Containerfile" "$work" >/dev/null ||
		{ log "error: ${engine[*]} build $ref failed"; exit 3; }
	if [ -n "$old" ] && [ "$old" != "$("${engine[@]}" image inspect --format '{{.Id}}' "$ref")" ]; then
		"${engine[@]}" rmi "$old" >/dev/null 2>&1 || true
	fi
	size=$("${engine[@]}" image inspect --format '{{.Size}}' "$ref")
	rm -rf "$work"
	log "built $ref: $((size / 1000000)) MB in $(since "$start")s (rootfs.tar ${rootfs_s}s, ${engine[0]##*/} build $(since "$engine_t")s)"
}

redis_rootfs() {
	local r=$1
	new_rootfs "$r"
	local files=(/usr/bin/redis-server)
	[ -x /usr/bin/redis-cli ] && files+=(/usr/bin/redis-cli)
	add_files "$r" "${files[@]}"
	# as in the official image: the name alone starts Sentinel mode
	ln -s redis-server "$r/usr/bin/redis-sentinel"
	install -m 755 "$here/redis/docker-entrypoint.sh" "$r/usr/local/bin/docker-entrypoint.sh"
	mkdir -p "$r/data"
}

postgres_rootfs() {
	local r=$1 m f base
	m=$(pg_major)
	new_rootfs "$r"
	# the official image's user and group ids
	printf 'postgres:x:999:999:PostgreSQL:/var/lib/postgresql:/bin/sh\n' >>"$r/etc/passwd"
	printf 'postgres:x:999:\n' >>"$r/etc/group"
	local bins=() links=() mods=() missing
	for f in /usr/lib/postgresql/"$m"/bin/*; do
		if [ -L "$f" ]; then links+=("$f"); else bins+=("$f"); fi
	done
	# extension modules whose libraries are all installed; LLVM JIT would add
	# libLLVM (over 100 MB): without llvmjit.so JIT is just off
	missing=" $(ldd_deps /usr/lib/postgresql/"$m"/lib/*.so | sed -n 's/ -$//p' | sort -u | tr '\n' ' ') "
	for f in /usr/lib/postgresql/"$m"/lib/*.so; do
		base=${f##*/}
		[ "$base" = llvmjit.so ] && continue
		if [[ $missing == *" $f "* ]]; then
			log "leaving out $f: a library it needs is not installed"
			continue
		fi
		mods+=("$f")
	done
	add_files "$r" "${bins[@]}" "${mods[@]}"
	for f in "${links[@]}"; do
		cp -P "$f" "$r$f"
	done
	mkdir -p "$r/usr/share/postgresql"
	cp -a "/usr/share/postgresql/$m" "$r/usr/share/postgresql/$m"
	rm -rf "$r/usr/share/postgresql/$m/man"
	# as the official image: listen on every address by default
	sed -ri "s!^#?(listen_addresses)\s*=\s*\S+.*!\1 = '*'!" "$r/usr/share/postgresql/$m/postgresql.conf.sample"
	grep -q "^listen_addresses = '\*'" "$r/usr/share/postgresql/$m/postgresql.conf.sample" ||
		die "postgresql.conf.sample: listen_addresses not set"
	mkdir -p "$r/usr/share" "$r/usr/lib/locale"
	cp -a /usr/share/zoneinfo "$r/usr/share/zoneinfo"
	rm -rf "$r/usr/share/zoneinfo/right"
	cp -a /usr/lib/locale/C.utf8 "$r/usr/lib/locale/C.utf8"
	# initdb imports collations from `locale -a`: these are all there are
	printf '#!/bin/sh\n[ "${1:-}" = -a ] && printf "C\\nC.utf8\\nPOSIX\\n"\n' >"$r/usr/bin/locale"
	chmod 755 "$r/usr/bin/locale"
	install -m 755 "$here/postgres/docker-entrypoint.sh" "$r/usr/local/bin/docker-entrypoint.sh"
	ln -s usr/local/bin/docker-entrypoint.sh "$r/docker-entrypoint.sh"
	mkdir -p "$r/docker-entrypoint-initdb.d" "$r/var/lib/postgresql/data" "$r/var/run/postgresql"
	chown -R 999:999 "$r/var/lib/postgresql" "$r/var/run/postgresql"
	chmod 700 "$r/var/lib/postgresql/data"
	chmod 3777 "$r/var/run/postgresql"
}

command -v "${engine[0]}" >/dev/null || die "${engine[0]} is not installed"
command -v ldd >/dev/null || die "ldd is not installed"

if [ "$what" = all ] || [ "$what" = redis ]; then
	[ -x /usr/bin/redis-server ] || die "no /usr/bin/redis-server: apt-get install redis-server"
	hosts=(/usr/bin/redis-server)
	[ -x /usr/bin/redis-cli ] && hosts+=(/usr/bin/redis-cli)
	build "$redis_ref" "$here/redis" "$(inputs_hash "$here/redis" "${hosts[@]}")" redis_rootfs
	echo "SLUICE_REDIS_IMAGE=$redis_ref"
fi

if [ "$what" = all ] || [ "$what" = postgres ]; then
	m=$(pg_major)
	pg_ref=localhost/sluice/postgres:$m-debian
	build "$pg_ref" "$here/postgres" "$(inputs_hash "$here/postgres" "/usr/lib/postgresql/$m/bin/postgres")" \
		postgres_rootfs --build-arg "PG_MAJOR=$m"
	echo "SLUICE_POSTGRES_IMAGE=$pg_ref"
fi
