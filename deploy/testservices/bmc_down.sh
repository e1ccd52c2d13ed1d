#!/usr/bin/env bash
# Stop the test BMC services started by bmc_up.sh (ipmi_sim, its console holder, sushy-emulator, sushy-static).
# Usage: deploy/testservices/bmc_down.sh [--purge]   (--purge also deletes $BMC_ROOT: SEL, users, logs)
set -euo pipefail
BMC_ROOT=${BMC_ROOT:-/tmp/gpuops-bmc}
stop() {  # $1 = pid file, $2 = word its cmdline must contain (never kill a recycled pid)
  local p
  [[ -f $1 ]] || return 0
  p=$(<"$1")
  if [[ -r /proc/$p/cmdline ]] && [[ $(tr '\0' ' ' <"/proc/$p/cmdline") == *"$2"* ]]; then
    kill "$p" 2>/dev/null || true
    for _ in $(seq 1 50); do [[ -e /proc/$p ]] || break; sleep 0.1; done
    [[ -e /proc/$p ]] && kill -9 "$p" 2>/dev/null || true
  fi
  rm -f "$1"
}
stop "$BMC_ROOT/ipmi_sim.pid" ipmi_sim
stop "$BMC_ROOT/console_holder.pid" sleep
stop "$BMC_ROOT/sushy.pid" sushy-emulator
stop "$BMC_ROOT/sushy_static.pid" sushy-static
if [[ ${1:-} == --purge ]]; then rm -rf "$BMC_ROOT"; fi
echo "[bmc_down] stopped" >&2
