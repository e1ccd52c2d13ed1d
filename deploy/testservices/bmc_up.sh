#!/usr/bin/env bash
# Start two real BMC services on 127.0.0.1 for the `bmc` tests (idempotent):
#   - OpenIPMI's ipmi_sim (Debian package `openipmi`), an IPMI 2.0 LAN BMC, with a System Event Log
#     holding one power-supply "Failure detected" entry; read it with ipmitool (package `ipmitool`);
#   - sushy-emulator --fake (PyPI `sushy-tools`), a Redfish service with Chassis Thermal + thresholds.
# Usage: deploy/testservices/bmc_up.sh   (root installs what is missing: apt openipmi ipmitool, pip sushy-tools)
# Environment: BMC_ROOT (default /tmp/gpuops-bmc), BMC_IPMI_PORT (16230), BMC_REDFISH_PORT (16231),
#   PYTHON (python, else python3).
# State, pid files and logs live in $BMC_ROOT; the IPMI user is `gpuops` and its password is in
# $BMC_ROOT/ipmi.pass (mode 600). The last stdout line is
#   export GPUOPS_TEST_BMC=ipmi=127.0.0.1:PORT,redfish=http://127.0.0.1:PORT,passfile=PATH
set -euo pipefail
BMC_ROOT=${BMC_ROOT:-/tmp/gpuops-bmc}
IPMI_PORT=${BMC_IPMI_PORT:-16230}
REDFISH_PORT=${BMC_REDFISH_PORT:-16231}
if [[ -n ${PYTHON:-} ]]; then :; elif command -v python >/dev/null; then PYTHON=python; else PYTHON=python3; fi
log() { printf '[bmc_up] %s\n' "$*" >&2; }

apt_missing=()
command -v ipmi_sim >/dev/null || apt_missing+=(openipmi)
command -v ipmitool >/dev/null || apt_missing+=(ipmitool)
if (( ${#apt_missing[@]} )); then
  [[ $(id -u) == 0 ]] || { log "missing ${apt_missing[*]}: apt-get install ${apt_missing[*]} (as root)"; exit 1; }
  log "installing ${apt_missing[*]} (apt)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" >/dev/null ||
    { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" >/dev/null; }
fi
if ! "$PYTHON" -c 'import sushy_tools' 2>/dev/null; then
  log "installing sushy-tools (pip)"
  "$PYTHON" -m pip install -q sushy-tools >&2
fi
SUSHY=$("$PYTHON" -c 'import shutil, sys, os; p = os.path.join(os.path.dirname(sys.executable), "sushy-emulator"); print(p if os.path.exists(p) else (shutil.which("sushy-emulator") or ""))')
[[ -n $SUSHY ]] || { log "sushy-emulator not found after installing sushy-tools"; exit 1; }

mkdir -p "$BMC_ROOT/state" "$BMC_ROOT/log"
chmod 700 "$BMC_ROOT"
[[ -f $BMC_ROOT/ipmi.pass ]] || { (umask 077; printf 'gpuops-bmc-pass' >"$BMC_ROOT/ipmi.pass"); }
PASS=$(<"$BMC_ROOT/ipmi.pass")

alive() {  # $1 = pid file, $2 = word its cmdline must contain
  local p
  [[ -f $1 ]] && p=$(<"$1") && [[ -r /proc/$p/cmdline ]] && [[ $(tr '\0' ' ' <"/proc/$p/cmdline") == *"$2"* ]]
}

cat >"$BMC_ROOT/lan.conf" <<CONF
name "gpuops-test-bmc"
set_working_mc 0x20
  startlan 1
    addr 127.0.0.1 $IPMI_PORT
    priv_limit admin
    allowed_auths_callback none md2 md5 straight
    allowed_auths_user none md2 md5 straight
    allowed_auths_operator none md2 md5 straight
    allowed_auths_admin none md2 md5 straight
    guid a123456789abcdefa123456789abcdef
  endlan
  user 2 true "gpuops" "$PASS" admin 10 none md2 md5 straight
CONF
# SEL record: type 0x02 (system event), generator 0x20, EvM rev 0x04, sensor type 0x08 (power supply),
# sensor 0x01, event type 0x6f (sensor-specific, asserted), offset 0x01 = Failure detected.
cat >"$BMC_ROOT/cmds.emu" <<'CMDS'
mc_setbmc 0x20
mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr
sel_enable 0x20 1000 0x0a
mc_enable 0x20
CMDS

if alive "$BMC_ROOT/ipmi_sim.pid" ipmi_sim; then
  log "ipmi_sim already running (pid $(<"$BMC_ROOT/ipmi_sim.pid"))"
else
  # ipmi_sim runs its command file only with its console on (no -n): the console reads a FIFO that a
  # `sleep` holds open, so it never sees end-of-file; bmc_down.sh stops both.
  rm -f "$BMC_ROOT/console"; mkfifo "$BMC_ROOT/console"
  setsid sleep infinity >"$BMC_ROOT/console" &
  echo $! >"$BMC_ROOT/console_holder.pid"
  setsid ipmi_sim -c "$BMC_ROOT/lan.conf" -f "$BMC_ROOT/cmds.emu" -s "$BMC_ROOT/state" \
    <"$BMC_ROOT/console" >"$BMC_ROOT/log/ipmi_sim.log" 2>&1 &
  echo $! >"$BMC_ROOT/ipmi_sim.pid"
  log "ipmi_sim started (pid $!) on 127.0.0.1:$IPMI_PORT"
fi
if alive "$BMC_ROOT/sushy.pid" sushy-emulator; then
  log "sushy-emulator already running (pid $(<"$BMC_ROOT/sushy.pid"))"
else
  setsid "$SUSHY" --fake -i 127.0.0.1 -p "$REDFISH_PORT" </dev/null >"$BMC_ROOT/log/sushy.log" 2>&1 &
  echo $! >"$BMC_ROOT/sushy.pid"
  log "sushy-emulator started (pid $!) on 127.0.0.1:$REDFISH_PORT"
fi

# -C 3 (RMCP+ with HMAC-SHA1 + AES): ipmi_sim does not answer "Get Channel Cipher Suites", and
# ipmitool's default negotiation then takes seconds of retries before failing with -C 17
ipmi() { IPMI_PASSWORD=$PASS timeout 10 ipmitool -I lanplus -C 3 -H 127.0.0.1 -p "$IPMI_PORT" -U gpuops -E "$@"; }
ok=0
for _ in $(seq 1 50); do
  if ipmi mc info >/dev/null 2>&1; then ok=1; break; fi
  alive "$BMC_ROOT/ipmi_sim.pid" ipmi_sim || break
  sleep 0.1
done
[[ $ok == 1 ]] || { log "ipmi_sim did not answer; see $BMC_ROOT/log/ipmi_sim.log"; exit 1; }
# the PSU failure entry, once per state directory (the SEL persists in $BMC_ROOT/state)
if [[ ! -f $BMC_ROOT/sel_seeded ]]; then
  ipmi raw 0x0a 0x44 0x00 0x00 0x02 0x00 0x00 0x00 0x00 0x20 0x00 0x04 0x08 0x01 0x6f 0x01 0xff 0xff >/dev/null
  touch "$BMC_ROOT/sel_seeded"
fi
ok=0
for _ in $(seq 1 150); do
  if [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$REDFISH_PORT/redfish/v1/Chassis" 2>/dev/null) == 200 ]]; then ok=1; break; fi
  alive "$BMC_ROOT/sushy.pid" sushy-emulator || break
  sleep 0.1
done
[[ $ok == 1 ]] || { log "sushy-emulator did not answer; see $BMC_ROOT/log/sushy.log"; exit 1; }
echo "export GPUOPS_TEST_BMC=ipmi=127.0.0.1:$IPMI_PORT,redfish=http://127.0.0.1:$REDFISH_PORT,passfile=$BMC_ROOT/ipmi.pass"
