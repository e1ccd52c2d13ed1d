#!/usr/bin/env bash
# Stop the test broker started by kafka_up.sh, strictly by its pid file: SIGTERM (controlled
# shutdown), then SIGKILL after a deadline. Never matches processes by name.
#
# Usage: deploy/testservices/kafka_down.sh [--purge]
#   --purge   also delete $KAFKA_ROOT (topics, offsets, logs); the jar cache is kept
# Environment: KAFKA_ROOT (default /tmp/gpuops-kafka), KAFKA_STOP_TIMEOUT_S (default 30)
set -euo pipefail
T0=$(date +%s%N)
KAFKA_ROOT=${KAFKA_ROOT:-/tmp/gpuops-kafka}
KAFKA_STOP_TIMEOUT_S=${KAFKA_STOP_TIMEOUT_S:-30}
PIDFILE=$KAFKA_ROOT/kafka.pid
purge=0
for a in "$@"; do
  case $a in
    --purge) purge=1 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "kafka_down: unknown argument $a" >&2; exit 2 ;;
  esac
done

# alive = exists and is not a zombie (a PID 1 that does not reap would keep zombies forever)
alive() { [[ -r /proc/$1/stat ]] && [[ $(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) != Z ]]; }

stopped="not running"
if [[ -f $PIDFILE ]]; then
  pid=$(<"$PIDFILE")
  cmd=""
  if [[ $pid =~ ^[0-9]+$ ]] && [[ -r /proc/$pid/cmdline ]]; then
    cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)
  fi
  if [[ $cmd == *kafka.Kafka* ]]; then       # the pid is still our broker, not a reused pid
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$(( $(date +%s) + KAFKA_STOP_TIMEOUT_S ))
    while alive "$pid" && (( $(date +%s) < deadline )); do sleep 0.1; done
    if alive "$pid"; then
      echo "kafka_down: pid $pid ignored SIGTERM for ${KAFKA_STOP_TIMEOUT_S}s, sending SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
      deadline=$(( $(date +%s) + 10 ))
      while alive "$pid" && (( $(date +%s) < deadline )); do sleep 0.05; done
    fi
    stopped="stopped pid $pid"
  fi
  rm -f "$PIDFILE"
fi
echo "kafka_down: $stopped in $(( ($(date +%s%N) - T0) / 1000000 )) ms"

if [[ $purge == 1 ]]; then
  case $KAFKA_ROOT in
    ""|/|"$HOME") echo "kafka_down: refusing to purge KAFKA_ROOT=$KAFKA_ROOT" >&2; exit 1 ;;
  esac
  rm -rf "$KAFKA_ROOT"
  echo "kafka_down: purged $KAFKA_ROOT"
fi
