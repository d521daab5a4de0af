#!/bin/sh
# Re-runs the on-call documentation run of docs/observability.md: a
# limiter over a throwaway redis-server, scraped every second by a
# throwaway Prometheus, through baseline, abuse, misconfigured-limit and
# sick-store phases (about 6 minutes). It rewrites
# docs/images/observability-{abuse,misconfigured,sick}.png and
# docs/results/2026-12-02-oncall.txt.
#
#	sh otel/internal/oncall/run.sh
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)

# Debian's packages; the run starts both servers itself, never through
# systemd.
as_root() {
	if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}
missing=""
command -v prometheus >/dev/null 2>&1 || [ -x /usr/bin/prometheus ] || missing="$missing prometheus"
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
if [ -n "$missing" ]; then
	as_root apt-get update
	# shellcheck disable=SC2086 # one word a package
	as_root apt-get install -y $missing
fi

cd "$here"
SLUICE_ONCALL_OUT="$repo/docs" go test -run TestOnCallRun -count=1 -v -timeout 15m .
