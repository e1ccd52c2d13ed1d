#!/usr/bin/env bash
# Stop the test server started by postgres_up.sh: `pg_ctl stop -m fast` on its data
# directory (the server's own pid file), then SIGKILL of that pid, checked to still be a
# postgres process, if it outlives the deadline. Never matches processes by name.
#
# Usage: deploy/testservices/postgres_down.sh [--purge]
#   --purge   also delete $PG_ROOT (the cluster, its databases, logs)
# Environment: PG_ROOT (default /tmp/gpuops-pg), PG_BIN (default: found under
#   /usr/lib/postgresql), PG_STOP_TIMEOUT_S (default 30)
set -euo pipefail
T0=$(date +%s%N)
PG_ROOT=${PG_ROOT:-/tmp/gpuops-pg}
PG_STOP_TIMEOUT_S=${PG_STOP_TIMEOUT_S:-30}
DATA=$PG_ROOT/data
purge=0
for a in "$@"; do
  case $a in
    --purge) purge=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "postgres_down: unknown argument $a" >&2; exit 2 ;;
  esac
done

if [[ -z ${PG_BIN:-} ]]; then
  for d in /usr/lib/postgresql/15/bin /usr/lib/postgresql/*/bin; do [[ -x $d/pg_ctl ]] && { PG_BIN=$d; break; }; done
  [[ -n ${PG_BIN:-} ]] || { command -v pg_ctl >/dev/null && PG_BIN=$(dirname "$(command -v pg_ctl)"); } || true
fi
if [[ $(id -u) == 0 ]] && id postgres >/dev/null 2>&1; then as_pg() { runuser -u postgres -- "$@"; }
else as_pg() { "$@"; }
fi
# alive = exists and is not a zombie (a PID 1 that does not reap would keep zombies forever)
alive() { [[ -r /proc/$1/stat ]] && [[ $(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) != Z ]]; }

stopped="not running"
if [[ -f $DATA/postmaster.pid ]]; then
  pid=$(head -1 "$DATA/postmaster.pid")
  if [[ $pid =~ ^[0-9]+$ ]] && alive "$pid" && [[ $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) == *postgres* ]]; then
    if [[ -n ${PG_BIN:-} ]]; then
      as_pg "$PG_BIN/pg_ctl" stop -D "$DATA" -m fast -w -t "$PG_STOP_TIMEOUT_S" >/dev/null 2>&1 || true
    else
      kill -INT "$pid" 2>/dev/null || true   # fast shutdown, as pg_ctl -m fast sends
      deadline=$(( $(date +%s) + PG_STOP_TIMEOUT_S ))
      while alive "$pid" && (( $(date +%s) < deadline )); do sleep 0.1; done
    fi
    if alive "$pid"; then
      echo "postgres_down: pid $pid still up after ${PG_STOP_TIMEOUT_S}s, sending SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
    stopped="stopped pid $pid"
  fi
fi
echo "postgres_down: $stopped in $(( ($(date +%s%N) - T0) / 1000000 )) ms"

if [[ $purge == 1 ]]; then
  case $PG_ROOT in
    ""|/|"$HOME") echo "postgres_down: refusing to purge PG_ROOT=$PG_ROOT" >&2; exit 1 ;;
  esac
  rm -rf "$PG_ROOT"
  echo "postgres_down: purged $PG_ROOT"
fi
