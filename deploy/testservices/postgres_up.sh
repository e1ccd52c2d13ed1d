#!/usr/bin/env bash
# Bring up a throwaway PostgreSQL 15 server for gpuops tests (the action store): Debian's
# `postgresql` binaries, a private cluster made with `initdb` under $PG_ROOT, listening on
# 127.0.0.1:$PG_PORT only, trust authentication (local test scratch: never expose it), and
# a database `gpuops`. Debian's own cluster (/etc/postgresql/15/main) is never touched.
#
# Usage: deploy/testservices/postgres_up.sh
#   then: export GPUOPS_TEST_POSTGRES=postgresql+psycopg://postgres@127.0.0.1:$PG_PORT/gpuops
#         (the last line it prints)
# Stop:  deploy/testservices/postgres_down.sh [--purge]
#
# Environment (all optional):
#   PG_ROOT              data, socket, log        (default /tmp/gpuops-pg)
#   PG_PORT              TCP port on 127.0.0.1    (default 15432)
#   PG_BIN               directory of initdb/pg_ctl (default: found under /usr/lib/postgresql)
#   PG_START_TIMEOUT_S   wait for the server      (default 30)
#   SKIP_APT=1           never apt-get install postgresql
#
# PostgreSQL refuses to run as root: as root, the cluster belongs to the `postgres` system
# user (made by the Debian package) and every server command runs as that user; as anyone
# else it belongs to the caller. Idempotent: a server already running from $PG_ROOT is kept.
set -euo pipefail
T0=$(date +%s%N)
PG_ROOT=${PG_ROOT:-/tmp/gpuops-pg}
PG_PORT=${PG_PORT:-15432}
PG_START_TIMEOUT_S=${PG_START_TIMEOUT_S:-30}
DATA=$PG_ROOT/data

ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
log() { printf '[postgres_up +%5sms] %s\n' "$(ms "$T0")" "$*" >&2; }

[[ $PG_PORT =~ ^[0-9]+$ ]] && (( PG_PORT > 0 && PG_PORT < 65536 )) ||
  { echo "postgres_up: PG_PORT must be a TCP port, got $PG_PORT" >&2; exit 2; }

# ---- 1. binaries (Debian keeps them off PATH, under /usr/lib/postgresql/<major>/bin) ------
find_bin() {
  if [[ -n ${PG_BIN:-} ]]; then echo "$PG_BIN"; return; fi
  local d
  for d in /usr/lib/postgresql/15/bin /usr/lib/postgresql/*/bin; do
    [[ -x $d/initdb ]] && { echo "$d"; return; }
  done
  command -v initdb >/dev/null && dirname "$(command -v initdb)"
  return 0
}
PG_BIN=$(find_bin)
if [[ -z $PG_BIN ]] && [[ ${SKIP_APT:-0} != 1 ]]; then
  [[ $(id -u) == 0 ]] || { echo "postgres_up: postgresql is not installed; as root: apt-get install postgresql" >&2; exit 1; }
  log "installing postgresql with apt"
  export DEBIAN_FRONTEND=noninteractive
  [[ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit)" ]] || apt-get update -qq
  apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  PG_BIN=$(find_bin)
fi
for b in initdb pg_ctl pg_isready psql createdb; do
  [[ -n $PG_BIN && -x $PG_BIN/$b ]] || { echo "postgres_up: $b not found (apt-get install postgresql; or set PG_BIN)" >&2; exit 1; }
done
T_INST=$(date +%s%N)

# ---- 2. who runs the server -----------------------------------------------------------------
if [[ $(id -u) == 0 ]]; then
  id postgres >/dev/null 2>&1 || { echo "postgres_up: running as root needs the postgres system user (apt-get install postgresql)" >&2; exit 1; }
  as_pg() { runuser -u postgres -- "$@"; }
  OWNER=postgres
else
  as_pg() { "$@"; }
  OWNER=$(id -un)
fi
mkdir -p "$PG_ROOT"/{log,run}
chown "$OWNER" "$PG_ROOT" "$PG_ROOT/log" "$PG_ROOT/run"
chmod 755 "$PG_ROOT"   # the postgres user reaches its files whoever made the directory

# ---- 3. the cluster (once) ------------------------------------------------------------------
if [[ ! -f $DATA/PG_VERSION ]]; then
  rm -rf "$DATA"
  as_pg "$PG_BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --no-locale --no-instructions >"$PG_ROOT/log/initdb.log" 2>&1 ||
    { tail -20 "$PG_ROOT/log/initdb.log" >&2; echo "postgres_up: initdb failed" >&2; exit 1; }
  cat >> "$DATA/postgresql.conf" <<CONF
# gpuops test server (postgres_up.sh): local only
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_ROOT/run'
logging_collector = off
CONF
  log "initdb done ($DATA)"
fi

# ---- 4. the server ------------------------------------------------------------------------------
ready() { "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -d postgres -U postgres; }
if ! as_pg "$PG_BIN/pg_ctl" status -D "$DATA" >/dev/null 2>&1; then
  as_pg "$PG_BIN/pg_ctl" start -D "$DATA" -l "$PG_ROOT/log/postgres.log" -w -t "$PG_START_TIMEOUT_S" \
    -o "-p $PG_PORT -k $PG_ROOT/run" >/dev/null ||
    { tail -20 "$PG_ROOT/log/postgres.log" >&2; echo "postgres_up: server did not start" >&2; exit 1; }
fi
dl=$(( $(date +%s) + PG_START_TIMEOUT_S ))
until ready || (( $(date +%s) >= dl )); do sleep 0.1; done
ready || { tail -20 "$PG_ROOT/log/postgres.log" >&2; echo "postgres_up: not accepting connections on 127.0.0.1:$PG_PORT" >&2; exit 1; }
log "server up (pid $(head -1 "$DATA/postmaster.pid"), 127.0.0.1:$PG_PORT)"

# ---- 5. the database ----------------------------------------------------------------------------
psql_() { "$PG_BIN/psql" -X -q -h 127.0.0.1 -p "$PG_PORT" -U postgres "$@"; }
if [[ $(psql_ -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'gpuops'") != 1 ]]; then
  "$PG_BIN/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres gpuops
  log "database gpuops created"
fi
log "ready: install phase $(( (T_INST-T0)/1000000 ))ms, total $(ms "$T0")ms"
echo "export GPUOPS_TEST_POSTGRES=postgresql+psycopg://postgres@127.0.0.1:$PG_PORT/gpuops"
