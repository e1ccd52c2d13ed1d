#!/usr/bin/env bash
# Stop the test kube-apiserver and etcd started by k8s_up.sh, strictly by their pid files:
# SIGTERM, then SIGKILL after a deadline. Never matches processes by name.
#
# Usage: deploy/testservices/k8s_down.sh [--purge]
#   --purge   also delete $K8S_ROOT (etcd data, certs, token, kubeconfig, logs); the binary
#             cache in $GPUOPS_CACHE is kept
# Environment: K8S_ROOT (default /tmp/gpuops-k8s), K8S_STOP_TIMEOUT_S (default 20)
set -euo pipefail
T0=$(date +%s%N)
K8S_ROOT=${K8S_ROOT:-/tmp/gpuops-k8s}
K8S_STOP_TIMEOUT_S=${K8S_STOP_TIMEOUT_S:-20}
purge=0
for a in "$@"; do
  case $a in
    --purge) purge=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "k8s_down: unknown argument $a" >&2; exit 2 ;;
  esac
done

# alive = exists and is not a zombie
alive() { [[ -r /proc/$1/stat ]] && [[ $(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) != Z ]]; }

stop() {  # $1 = pid file, $2 = binary name; apiserver first, then etcd
  local pid cmd deadline
  [[ -f $1 ]] || { echo "$2 not running"; return 0; }
  pid=$(<"$1")
  cmd=""
  if [[ $pid =~ ^[0-9]+$ ]] && [[ -r /proc/$pid/cmdline ]]; then
    cmd=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | head -1 || true)
  fi
  if [[ $cmd == */"$2" ]]; then                # still our process, not a reused pid
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$(( $(date +%s) + K8S_STOP_TIMEOUT_S ))
    while alive "$pid" && (( $(date +%s) < deadline )); do sleep 0.1; done
    if alive "$pid"; then
      echo "k8s_down: $2 pid $pid ignored SIGTERM for ${K8S_STOP_TIMEOUT_S}s, sending SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
      deadline=$(( $(date +%s) + 10 ))
      while alive "$pid" && (( $(date +%s) < deadline )); do sleep 0.05; done
    fi
    echo "stopped $2 pid $pid"
  else
    echo "$2 not running"
  fi
  rm -f "$1"
}
a=$(stop "$K8S_ROOT/kube-apiserver.pid" kube-apiserver)
e=$(stop "$K8S_ROOT/etcd.pid" etcd)
echo "k8s_down: $a, $e in $(( ($(date +%s%N) - T0) / 1000000 )) ms"

if [[ $purge == 1 ]]; then
  case $K8S_ROOT in
    ""|/|"$HOME") echo "k8s_down: refusing to purge K8S_ROOT=$K8S_ROOT" >&2; exit 1 ;;
  esac
  rm -rf "$K8S_ROOT"
  echo "k8s_down: purged $K8S_ROOT"
fi
