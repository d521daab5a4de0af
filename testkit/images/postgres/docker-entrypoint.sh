#!/bin/sh
# Entrypoint of localhost/sluice/postgres:15-debian: a POSIX-sh port of the
# official postgres image's docker-entrypoint.sh (which is bash; this image
# has only busybox), keeping what testcontainers-go's modules/postgres and
# ordinary users rely on:
#   - options alone run `postgres` with them;
#   - POSTGRES_USER (postgres), POSTGRES_PASSWORD (required unless
#     POSTGRES_HOST_AUTH_METHOD=trust), POSTGRES_DB ($POSTGRES_USER),
#     POSTGRES_INITDB_ARGS, POSTGRES_INITDB_WALDIR, POSTGRES_HOST_AUTH_METHOD,
#     PGDATA, and the *_FILE variants of the first three;
#   - on an empty PGDATA: initdb, a temporary server on the Unix socket only
#     (logging "database system is ready to accept connections" a first time),
#     POSTGRES_DB created, /docker-entrypoint-initdb.d/* run (*.sh executed or
#     sourced, *.sql, *.sql.gz, *.sql.xz fed to psql), the temporary server
#     stopped, then the real one started (logging it a second time);
#   - started as root, it prepares the directories and re-runs itself as the
#     postgres user (busybox su, in place of gosu).
# Not ported: nss_wrapper for arbitrary --user ids, *.sql.zst, *.sql.bz2.
set -eu

# file_env VAR [DEFAULT]: VAR from $VAR or from the file named by $VAR_FILE.
file_env() {
	var=$1
	fileVar=${var}_FILE
	def=${2:-}
	eval "val=\${$var:-}"
	eval "fileVal=\${$fileVar:-}"
	if [ -n "$val" ] && [ -n "$fileVal" ]; then
		echo >&2 "error: both $var and $fileVar are set (but are exclusive)"
		exit 1
	fi
	if [ -n "$fileVal" ]; then
		val=$(cat "$fileVal")
	elif [ -z "$val" ]; then
		val=$def
	fi
	export "$var=$val"
	unset "$fileVar" 2>/dev/null || true
}

# quote ARG...: the arguments, each single-quoted for a shell (pg_ctl -o).
quote() {
	for q in "$@"; do
		printf "'%s' " "$(printf '%s' "$q" | sed "s/'/'\\\\''/g")"
	done
}

docker_setup_env() {
	file_env POSTGRES_PASSWORD
	file_env POSTGRES_USER postgres
	file_env POSTGRES_DB "$POSTGRES_USER"
	file_env POSTGRES_INITDB_ARGS
	: "${POSTGRES_HOST_AUTH_METHOD:=}"
	DATABASE_ALREADY_EXISTS=
	if [ -s "$PGDATA/PG_VERSION" ]; then
		DATABASE_ALREADY_EXISTS=true
	fi
}

docker_create_db_directories() {
	mkdir -p "$PGDATA"
	chmod 00700 "$PGDATA" 2>/dev/null || :
	mkdir -p /var/run/postgresql || :
	chmod 03775 /var/run/postgresql 2>/dev/null || :
	if [ -n "${POSTGRES_INITDB_WALDIR:-}" ]; then
		mkdir -p "$POSTGRES_INITDB_WALDIR"
		if [ "$(id -u)" = 0 ]; then
			find "$POSTGRES_INITDB_WALDIR" \! -user postgres -exec chown postgres '{}' +
		fi
		chmod 700 "$POSTGRES_INITDB_WALDIR"
	fi
	if [ "$(id -u)" = 0 ]; then
		find "$PGDATA" \! -user postgres -exec chown postgres '{}' +
		find /var/run/postgresql \! -user postgres -exec chown postgres '{}' +
	fi
}

docker_verify_minimum_env() {
	if [ -z "$POSTGRES_PASSWORD" ] && [ "$POSTGRES_HOST_AUTH_METHOD" != trust ]; then
		cat >&2 <<-'EOE'
			Error: Database is uninitialized and superuser password is not specified.
			       You must specify POSTGRES_PASSWORD to a non-empty value for the
			       superuser. For example, "-e POSTGRES_PASSWORD=password" on "docker run".

			       You may also use "POSTGRES_HOST_AUTH_METHOD=trust" to allow all
			       connections without a password. This is *not* recommended.
		EOE
		exit 1
	fi
	if [ "$POSTGRES_HOST_AUTH_METHOD" = trust ]; then
		echo >&2 'WARNING: POSTGRES_HOST_AUTH_METHOD has been set to "trust": no password needed.'
	fi
}

docker_init_database_dir() {
	if [ -n "${POSTGRES_INITDB_WALDIR:-}" ]; then
		set -- --waldir "$POSTGRES_INITDB_WALDIR" "$@"
	fi
	pwfile=$(mktemp)
	printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
	# POSTGRES_INITDB_ARGS is split on blanks, as in the official image
	# shellcheck disable=SC2086
	initdb --username="$POSTGRES_USER" --pwfile="$pwfile" $POSTGRES_INITDB_ARGS "$@"
	rm -f "$pwfile"
}

pg_setup_hba_conf() {
	if [ "${1:-}" = postgres ]; then shift; fi
	if [ -z "$POSTGRES_HOST_AUTH_METHOD" ]; then
		POSTGRES_HOST_AUTH_METHOD=$(postgres -C password_encryption "$@")
	fi
	{
		printf '\n'
		if [ "$POSTGRES_HOST_AUTH_METHOD" = trust ]; then
			printf '# warning trust is enabled for all connections\n'
		fi
		printf 'host all all all %s\n' "$POSTGRES_HOST_AUTH_METHOD"
	} >>"$PGDATA/pg_hba.conf"
}

docker_temp_server_start() {
	if [ "${1:-}" = postgres ]; then shift; fi
	set -- "$@" -c listen_addresses='' -p "${PGPORT:-5432}"
	NOTIFY_SOCKET= PGUSER="${PGUSER:-$POSTGRES_USER}" \
		pg_ctl -D "$PGDATA" -o "$(quote "$@")" -w start
}

docker_temp_server_stop() {
	PGUSER="${PGUSER:-postgres}" pg_ctl -D "$PGDATA" -m fast -w stop
}

# docker_process_sql [psql options]: psql on the temporary server's socket.
docker_process_sql() {
	if [ -n "$POSTGRES_DB" ]; then
		set -- --dbname "$POSTGRES_DB" "$@"
	fi
	PGHOST= PGHOSTADDR= psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --no-password --no-psqlrc "$@"
}

docker_setup_db() {
	exists=$(POSTGRES_DB= docker_process_sql --dbname postgres --set db="$POSTGRES_DB" --tuples-only <<-'EOSQL'
		SELECT 1 FROM pg_database WHERE datname = :'db' ;
	EOSQL
	)
	if [ -z "$(echo "$exists" | tr -d ' \n')" ]; then
		POSTGRES_DB= docker_process_sql --dbname postgres --set db="$POSTGRES_DB" <<-'EOSQL'
			CREATE DATABASE :"db" ;
		EOSQL
		printf '\n'
	fi
}

docker_process_init_files() {
	printf '\n'
	for f in "$@"; do
		[ -e "$f" ] || continue
		case "$f" in
		*.sh)
			if [ -x "$f" ]; then
				printf '%s: running %s\n' "$0" "$f"
				"$f"
			else
				printf '%s: sourcing %s\n' "$0" "$f"
				# shellcheck disable=SC1090
				. "$f"
			fi
			;;
		*.sql) printf '%s: running %s\n' "$0" "$f"; docker_process_sql -f "$f"; printf '\n' ;;
		*.sql.gz) printf '%s: running %s\n' "$0" "$f"; gunzip -c "$f" | docker_process_sql; printf '\n' ;;
		*.sql.xz) printf '%s: running %s\n' "$0" "$f"; xzcat "$f" | docker_process_sql; printf '\n' ;;
		*) printf '%s: ignoring %s\n' "$0" "$f" ;;
		esac
		printf '\n'
	done
}

# _pg_want_help ARG...: true when the arguments ask postgres for help or its
# version, which must not initialise anything.
_pg_want_help() {
	for arg in "$@"; do
		case "$arg" in
		-'?' | --help | --describe-config | -V | --version) return 0 ;;
		esac
	done
	return 1
}

if [ $# -eq 0 ] || [ "${1#-}" != "$1" ]; then
	set -- postgres "$@"
fi

if [ "$1" = postgres ] && ! _pg_want_help "$@"; then
	: "${PGDATA:=/var/lib/postgresql/data}"
	export PGDATA
	docker_setup_env
	docker_create_db_directories
	if [ "$(id -u)" = 0 ]; then
		# restart this script as postgres, keeping the environment; "--" ends
		# su's options, or it would take the server's "-c name=value" as its own
		exec su -p -s /bin/sh -c 'exec "$0" "$@"' -- postgres /usr/local/bin/docker-entrypoint.sh "$@"
	fi

	if [ -z "$DATABASE_ALREADY_EXISTS" ]; then
		docker_verify_minimum_env
		# fails early on an unreadable directory
		ls /docker-entrypoint-initdb.d/ >/dev/null
		docker_init_database_dir
		pg_setup_hba_conf "$@"
		export PGPASSWORD="${PGPASSWORD:-$POSTGRES_PASSWORD}"
		docker_temp_server_start "$@"
		docker_setup_db
		# the glob sorts by name, in the C locale of busybox
		docker_process_init_files /docker-entrypoint-initdb.d/*
		docker_temp_server_stop
		unset PGPASSWORD
		printf '\nPostgreSQL init process complete; ready for start up.\n\n'
	else
		printf '\nPostgreSQL Database directory appears to contain a database; Skipping initialization\n\n'
	fi
fi

exec "$@"
