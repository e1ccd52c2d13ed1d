#!/usr/bin/env bash
# Start two real BMC services on 127.0.0.1 for the `bmc` tests (idempotent):
#   - OpenIPMI's ipmi_sim (Debian package `openipmi`), an IPMI 2.0 LAN BMC, with a System Event Log
#     holding one power-supply "Failure detected" entry and two threshold sensors with SDRs
#     ("Inlet Temp" 24 degrees C, upper thresholds 40/45/50; "FAN1" 5400 RPM, lower thresholds
#     800/500/250); read them with ipmitool (package `ipmitool`);
#   - sushy-emulator --fake (PyPI `sushy-tools`), a Redfish service with Chassis Thermal + thresholds
#     (sushy-tools 2.2 --fake serves no Chassis Power / PowerSubsystem resource: 404);
#   - sushy-static (the same package's static Redfish responder) serving the mockup in
#     redfish_newer_schema.json (path -> resource, written out as <path>/index.json) over HTTPS with a
#     self-signed certificate for 127.0.0.1 ($BMC_ROOT/redfish-newer.crt, made with openssl), as BMCs
#     ship: a BMC with only the newer schema, shaped like OpenBMC's bmcweb built without the deprecated
#     Thermal and Power (Sensors with Thresholds, PowerSubsystem/PowerSupplies, no $expand), plus an
#     HGX GPU chassis.
# Usage: deploy/testservices/bmc_up.sh   (root installs what is missing: apt openipmi ipmitool, pip sushy-tools)
# Environment: BMC_ROOT (default /tmp/gpuops-bmc), BMC_IPMI_PORT (16230), BMC_REDFISH_PORT (16231),
#   BMC_REDFISH_NEWER_PORT (16232), PYTHON (python, else python3).
# State, pid files and logs live in $BMC_ROOT; the IPMI user is `gpuops` and its password is in
# $BMC_ROOT/ipmi.pass (mode 600). The last stdout line is
#   export GPUOPS_TEST_BMC=ipmi=127.0.0.1:PORT,redfish=http://127.0.0.1:PORT,redfish_newer=https://127.0.0.1:PORT,redfish_ca=PATH,passfile=PATH
set -euo pipefail
BMC_ROOT=${BMC_ROOT:-/tmp/gpuops-bmc}
IPMI_PORT=${BMC_IPMI_PORT:-16230}
REDFISH_PORT=${BMC_REDFISH_PORT:-16231}
REDFISH_NEWER_PORT=${BMC_REDFISH_NEWER_PORT:-16232}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
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
SUSHY_STATIC="$(dirname "$SUSHY")/sushy-static"
[[ -x $SUSHY_STATIC ]] || SUSHY_STATIC=$(command -v sushy-static || true)
[[ -n $SUSHY_STATIC ]] || { log "sushy-static not found beside $SUSHY"; exit 1; }

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
# Sensors: `sensor_add` makes ipmi_sim answer Get Sensor Reading / Thresholds, a Full Sensor Record
# (SDR type 0x01, IPMI 2.0 table 43-1) gives ipmitool its name, unit and conversion. The SDRs are
# added at every start (no persist_sdr: a persisted repository would collect duplicates). Sensor
# numbers 0x10/0x11, not 0x01: the seeded SEL entry names sensor 0x01 and must keep its own name.
#   Inlet Temp: temperature (0x01), threshold type, entity 0x37 air inlet, degrees C, M=1;
#     reading 0x18 = 24; UNR/UCR/UNC 0x32/0x2d/0x28 = 50/45/40 (readable mask 0x38).
#   FAN1: fan (0x04), entity 0x1d, RPM (unit 18), M=50; reading 0x6c = 5400 RPM;
#     LNR/LCR/LNC 0x05/0x0a/0x10 = 250/500/800 RPM (readable mask 0x07).
# sensor_set_threshold lists value5..value0 = UNR UCR UNC LNR LCR LNC; sensor_set_event_support
# "enable scanning" makes the reading available (ipmitool prints "na" for a sensor not scanning).
cat >"$BMC_ROOT/cmds.emu.new" <<'CMDS'
mc_setbmc 0x20
mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02
sel_enable 0x20 1000 0x0a
sensor_add 0x20 0 0x10 0x01 0x01
sensor_set_threshold 0x20 0 0x10 settable 111000 0x32 0x2d 0x28 00 00 00
sensor_set_event_support 0x20 0 0x10 enable scanning per-state 000000000000000 000000000000000 000000000000000 000000000000000
sensor_set_value 0x20 0 0x10 0x18 0
main_sdr_add 0x20 0x00 0x00 0x51 0x01 0x35 0x20 0x00 0x10 0x37 0x01 0x67 0x48 0x01 0x01 0x00 0x00 0x00 0x70 0x38 0x38 0x00 0x01 0x00 0x00 0x01 0x00 0x00 0x00 0x00 0x00 0x01 0x18 0x00 0x00 0xff 0x00 0x32 0x2d 0x28 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0xca 0x49 0x6e 0x6c 0x65 0x74 0x20 0x54 0x65 0x6d 0x70
sensor_add 0x20 0 0x11 0x04 0x01
sensor_set_threshold 0x20 0 0x11 settable 000111 00 00 00 0x05 0x0a 0x10
sensor_set_event_support 0x20 0 0x11 enable scanning per-state 000000000000000 000000000000000 000000000000000 000000000000000
sensor_set_value 0x20 0 0x11 0x6c 0
main_sdr_add 0x20 0x00 0x00 0x51 0x01 0x2f 0x20 0x00 0x11 0x1d 0x01 0x67 0x48 0x04 0x01 0x00 0x70 0x00 0x00 0x07 0x07 0x00 0x12 0x00 0x00 0x32 0x00 0x00 0x00 0x00 0x00 0x01 0x6c 0x00 0x00 0xff 0x00 0x00 0x00 0x00 0x05 0x0a 0x10 0x00 0x00 0x00 0x00 0x00 0xc4 0x46 0x41 0x4e 0x31
mc_enable 0x20
CMDS
# an ipmi_sim started from an older command file (no sensors) is restarted below; the SEL persists
restart_ipmi=0
if [[ -f $BMC_ROOT/cmds.emu ]] && ! cmp -s "$BMC_ROOT/cmds.emu" "$BMC_ROOT/cmds.emu.new"; then restart_ipmi=1; fi
mv "$BMC_ROOT/cmds.emu.new" "$BMC_ROOT/cmds.emu"
rm -f "$BMC_ROOT/state/ipmi_sim/gpuops-test-bmc/sdr.20.main"   # left by persist_sdr in older runs

if alive "$BMC_ROOT/ipmi_sim.pid" ipmi_sim && [[ $restart_ipmi == 1 ]]; then
  log "ipmi_sim runs an older command file: restarting it (its SEL persists)"
  old_pid=$(<"$BMC_ROOT/ipmi_sim.pid"); kill "$old_pid"
  for _ in $(seq 1 50); do kill -0 "$old_pid" 2>/dev/null || break; sleep 0.1; done
  if alive "$BMC_ROOT/console_holder.pid" sleep; then kill "$(<"$BMC_ROOT/console_holder.pid")" 2>/dev/null || true; fi
fi
if alive "$BMC_ROOT/ipmi_sim.pid" ipmi_sim; then
  log "ipmi_sim already running (pid $(<"$BMC_ROOT/ipmi_sim.pid"))"
else
  # ipmi_sim runs its command file only with its console on (no -n): the console reads a FIFO that a
  # `sleep` holds open, so it never sees end-of-file; bmc_down.sh stops both.
  rm -f "$BMC_ROOT/console"; mkfifo "$BMC_ROOT/console"
  setsid sleep infinity >"$BMC_ROOT/console" 2>/dev/null </dev/null &
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
# the newer-schema mockup, written afresh at every start (sushy-static reads the files per request)
rm -rf "$BMC_ROOT/redfish-newer"
"$PYTHON" - "$HERE/redfish_newer_schema.json" "$BMC_ROOT/redfish-newer" <<'PY'
import json, pathlib, sys
root = pathlib.Path(sys.argv[2])
for path, resource in json.loads(pathlib.Path(sys.argv[1]).read_text()).items():
    d = root / path.removeprefix("/redfish/v1").strip("/")
    d.mkdir(parents=True, exist_ok=True)
    (d / "index.json").write_text(json.dumps(resource, indent=1))
PY
CRT=$BMC_ROOT/redfish-newer.crt
if [[ ! -s $CRT || ! -s $BMC_ROOT/redfish-newer.key ]]; then
  command -v openssl >/dev/null || { log "openssl is needed for the HTTPS test BMC's certificate (apt-get install openssl)"; exit 1; }
  (umask 077; openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=gpuops-test-bmc" \
     -addext "subjectAltName=IP:127.0.0.1" -keyout "$BMC_ROOT/redfish-newer.key" -out "$CRT" 2>/dev/null)
  if alive "$BMC_ROOT/sushy_static.pid" sushy-static; then kill "$(<"$BMC_ROOT/sushy_static.pid")"; sleep 0.5; fi
fi
if alive "$BMC_ROOT/sushy_static.pid" sushy-static; then
  log "sushy-static already running (pid $(<"$BMC_ROOT/sushy_static.pid"))"
else
  # unbuffered: it prints each request's headers to its log, which a test reads (the Authorization header)
  PYTHONUNBUFFERED=1 setsid "$PYTHON" "$SUSHY_STATIC" -i 127.0.0.1 -p "$REDFISH_NEWER_PORT" -m "$BMC_ROOT/redfish-newer" \
    -c "$CRT" -k "$BMC_ROOT/redfish-newer.key" </dev/null >"$BMC_ROOT/log/sushy_static.log" 2>&1 &
  echo $! >"$BMC_ROOT/sushy_static.pid"
  log "sushy-static started (pid $!) on https://127.0.0.1:$REDFISH_NEWER_PORT"
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
ok=0
for _ in $(seq 1 100); do
  if [[ $(curl -s --cacert "$CRT" -o /dev/null -w '%{http_code}' "https://127.0.0.1:$REDFISH_NEWER_PORT/redfish/v1/Chassis" 2>/dev/null) == 200 ]]; then ok=1; break; fi
  alive "$BMC_ROOT/sushy_static.pid" sushy-static || break
  sleep 0.1
done
[[ $ok == 1 ]] || { log "sushy-static did not answer; see $BMC_ROOT/log/sushy_static.log"; exit 1; }
echo "export GPUOPS_TEST_BMC=ipmi=127.0.0.1:$IPMI_PORT,redfish=http://127.0.0.1:$REDFISH_PORT,redfish_newer=https://127.0.0.1:$REDFISH_NEWER_PORT,redfish_ca=$CRT,passfile=$BMC_ROOT/ipmi.pass"
