#!/usr/bin/env bash
# Stop everything slurm_up.sh started, strictly by pid file: cancel jobs while the
# daemons are still up (slurmstepd and job processes survive a slurmd shutdown otherwise),
# SIGTERM the slurmd daemons and slurmctld, SIGKILL after a deadline, munged last.
# Adapted from shared/infra/slurm_down.sh. Never matches processes by name.
#
# Usage: deploy/testservices/slurm_down.sh [--purge]
#   --purge   also delete $SLURM_ROOT (config, state, logs, munge key)
# Environment: SLURM_ROOT (default /tmp/gpuops-slurm), SLURM_STOP_TIMEOUT_S (default 10)
#
# Teardown keeps going past individual errors (no `set -e`), and always exits 0.
set -uo pipefail
SLURM_ROOT=${SLURM_ROOT:-/tmp/gpuops-slurm}
SLURM_STOP_TIMEOUT_S=${SLURM_STOP_TIMEOUT_S:-10}
T0=$(date +%s%N)
export SLURM_CONF=$SLURM_ROOT/etc/slurm.conf
purge=0
for a in "$@"; do
  case $a in
    --purge) purge=1 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "slurm_down: unknown argument $a" >&2; exit 2 ;;
  esac
done

# alive = exists and is not a zombie (a PID 1 that does not reap would keep zombies forever)
alive() { [[ -r /proc/$1/stat ]] && [[ $(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) != Z ]]; }
# wait until none of the given pids is alive, or the deadline passes
wait_gone() {
  local dl=$(( $(date +%s) + $1 )); shift
  local p any
  while :; do
    any=0; for p in "$@"; do alive "$p" && any=1; done
    [[ $any == 0 ]] && return 0
    (( $(date +%s) < dl )) || return 1
    sleep 0.1
  done
}

# 1. cancel all jobs while the daemons are still up
if [[ -f $SLURM_CONF ]] && [[ $(timeout 5 scontrol ping 2>/dev/null) == *'is UP'* ]]; then
  jobs=$(squeue -h -o %A 2>/dev/null)
  if [[ -n $jobs ]]; then
    # shellcheck disable=SC2086  # one argument per job id
    scancel $jobs 2>/dev/null
    dl=$(( $(date +%s) + SLURM_STOP_TIMEOUT_S ))
    while [[ -n $(squeue -h -t R,CG -o %A 2>/dev/null) ]] && (( $(date +%s) < dl )); do sleep 0.1; done
  fi
fi

# 2. slurmd daemons and slurmctld, by pid file
pids=()
for f in "$SLURM_ROOT"/run/slurmd-*.pid "$SLURM_ROOT/run/slurmctld.pid"; do
  [[ -f $f ]] || continue
  p=$(cat "$f" 2>/dev/null)
  if [[ $p =~ ^[0-9]+$ ]] && alive "$p"; then kill -TERM "$p" 2>/dev/null && pids+=("$p"); fi
  rm -f "$f"
done
if (( ${#pids[@]} )) && ! wait_gone "$SLURM_STOP_TIMEOUT_S" "${pids[@]}"; then
  for p in "${pids[@]}"; do alive "$p" && { echo "slurm_down: SIGKILL $p" >&2; kill -KILL "$p" 2>/dev/null; }; done
  wait_gone 5 "${pids[@]}"
fi

# 3. munge last (slurmctld needs it while shutting down)
if [[ -f $SLURM_ROOT/munge/munged.pid ]]; then
  p=$(cat "$SLURM_ROOT/munge/munged.pid" 2>/dev/null)
  if [[ $p =~ ^[0-9]+$ ]] && alive "$p"; then
    kill -TERM "$p" 2>/dev/null
    wait_gone 5 "$p" || { kill -KILL "$p" 2>/dev/null; wait_gone 5 "$p"; }
  fi
  rm -f "$SLURM_ROOT/munge/munged.pid"
fi
echo "slurm_down: stopped ${#pids[@]} slurm daemons + munged in $(( ($(date +%s%N) - T0) / 1000000 )) ms"

if [[ $purge == 1 ]]; then
  case $SLURM_ROOT in
    ""|/|"$HOME") echo "slurm_down: refusing to purge SLURM_ROOT=$SLURM_ROOT" >&2; exit 1 ;;
  esac
  rm -rf "$SLURM_ROOT"
  echo "slurm_down: purged $SLURM_ROOT"
fi
exit 0
