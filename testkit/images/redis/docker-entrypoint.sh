#!/bin/sh
# Entrypoint of localhost/sluice/redis:7-debian, after the official redis:7
# image's: options alone (or nothing, or a *.conf file first) run redis-server
# with them. The official image compiles protected mode off; Debian's binary
# has it on, so `--protected-mode no` is passed unless the arguments or the
# config file set protected-mode themselves (later options win, so a caller's
# `--protected-mode yes` still does). Runs as root: no user switch.
set -e

if [ $# -eq 0 ] || [ "${1#-}" != "$1" ] || [ "${1%.conf}" != "$1" ]; then
	set -- redis-server "$@"
fi

if [ "$1" = redis-server ]; then
	shift
	conf=
	# redis-server takes a config file (or "-" for stdin) only as its first argument.
	if [ $# -gt 0 ] && { [ "$1" = - ] || [ "${1#-}" = "$1" ]; }; then
		conf=$1
		shift
	fi
	want=yes
	# options redis-server takes only alone, first
	case "${1:-}" in -v | --version | -h | --help | --test-memory | --check-system) want=no ;; esac
	for a in "$@"; do
		[ "$a" = --protected-mode ] && want=no
	done
	if [ -n "$conf" ] && [ "$conf" != - ] && [ -r "$conf" ] &&
		grep -Eq '^[[:space:]]*protected-mode[[:space:]]' "$conf"; then
		want=no
	fi
	if [ "$want" = yes ]; then
		set -- --protected-mode no "$@"
	fi
	if [ -n "$conf" ]; then
		set -- "$conf" "$@"
	fi
	set -- redis-server "$@"
	# the official image's umask: files redis writes are private
	[ "$(umask)" = 0022 ] && umask 0077
fi

exec "$@"
