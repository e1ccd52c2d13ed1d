#!/usr/bin/env bash
# Bring up a real single-host Slurm 22.05 "cluster" for gpuops tests: a private munged,
# one slurmctld and N slurmd daemons on 127.0.0.1 (Debian's build runs several slurmd per
# host with `slurmd -N <node>`), nodes gpu-node-01..N each declaring Gres=gpu:h100:8 whose
# device files are symlinks to /dev/null. All state under $SLURM_ROOT.
# Facility layout (for gpuops' facility grouping): every NODES_PER_RACK consecutive nodes form a
# rack (node Feature rack_r01, rack_r02, ...) under one leaf switch (topology/tree, topology.conf:
# leaf-01, leaf-02, ... under one spine), as a real cluster's racks each have a top-of-rack leaf.
# Adapted from shared/infra/slurm_up.sh (see shared/infra/slurm_transcript.txt).
#
# Usage: deploy/testservices/slurm_up.sh [NUM_NODES]        (default 4)
#   then: export SLURM_CONF=$SLURM_ROOT/etc/slurm.conf      (the last line it prints)
# Stop:  deploy/testservices/slurm_down.sh [--purge]
#
# Environment (all optional):
#   SLURM_ROOT        state, config, logs, pid files   (default /tmp/gpuops-slurm)
#   CTLD_PORT         slurmctld port                   (default 16917)
#   SLURMD_BASE_PORT  node i listens on BASE+i         (default 17100)
#   GPUS_PER_NODE     emulated GPUs per node           (default 8)
#   NODES_PER_RACK    nodes per rack and leaf switch   (default 2)
#   SLURM_START_TIMEOUT_S  wait for controller / idle nodes (default 30)
#   SKIP_APT=1        never apt-get install slurm/munge
#
# Idempotent: daemons already running from $SLURM_ROOT are kept. A freshly started
# slurmctld starts clean (`slurmctld -c`: no jobs or node states left over from a
# previous run), so every test session begins with all nodes idle.
set -euo pipefail
T0=$(date +%s%N)
NUM_NODES=${1:-${NUM_NODES:-4}}
SLURM_ROOT=${SLURM_ROOT:-/tmp/gpuops-slurm}
CTLD_PORT=${CTLD_PORT:-16917}
SLURMD_BASE_PORT=${SLURMD_BASE_PORT:-17100}
SLURM_START_TIMEOUT_S=${SLURM_START_TIMEOUT_S:-30}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NODES_PER_RACK=${NODES_PER_RACK:-2}
export SLURM_CONF=$SLURM_ROOT/etc/slurm.conf

[[ $NUM_NODES =~ ^[1-9][0-9]?$ ]] || { echo "slurm_up: NUM_NODES must be 1..99, got $NUM_NODES" >&2; exit 2; }
[[ $NODES_PER_RACK =~ ^[1-9][0-9]?$ ]] || { echo "slurm_up: NODES_PER_RACK must be 1..99, got $NODES_PER_RACK" >&2; exit 2; }

ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
log() { printf '[slurm_up +%5sms] %s\n' "$(ms "$T0")" "$*" >&2; }
deadline_in() { echo $(( $(date +%s) + $1 )); }

# ---- 1. install (idempotent; ~8 s on a warm Debian mirror) -------------------
if [[ "${SKIP_APT:-0}" != 1 ]] && { ! command -v slurmctld || ! command -v slurmd || ! command -v munged || ! command -v sinfo; } >/dev/null 2>&1; then
  log "installing slurm + munge with apt"
  export DEBIAN_FRONTEND=noninteractive
  [[ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit)" ]] || apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi
for b in slurmctld slurmd munged munge scontrol sinfo; do
  command -v "$b" >/dev/null || { echo "slurm_up: $b not found (install slurmctld slurmd slurm-client munge)" >&2; exit 1; }
done
T_INST=$(date +%s%N)

# ---- 2. directories ------------------------------------------------------------
mkdir -p "$SLURM_ROOT"/{etc,state,log,run,spool,munge,bin,dev}
chmod 711 "$SLURM_ROOT/munge"
# fake GPU device files: symlinks to /dev/null pass slurmd's "is a char device" check
for i in $(seq 0 $((GPUS_PER_NODE-1))); do ln -sfn /dev/null "$SLURM_ROOT/dev/nvidia$i"; done

# ---- 3. munge (private socket + key; no /etc, /run involvement) ----------------
MUNGE_SOCK=$SLURM_ROOT/munge/munge.socket.2
if ! [[ -S $MUNGE_SOCK ]] || ! munge -n -S "$MUNGE_SOCK" >/dev/null 2>&1; then
  [[ -f $SLURM_ROOT/munge/munge.key ]] || { dd if=/dev/urandom of="$SLURM_ROOT/munge/munge.key" bs=1024 count=1 status=none; chmod 400 "$SLURM_ROOT/munge/munge.key"; }
  munged --force --socket="$MUNGE_SOCK" --key-file="$SLURM_ROOT/munge/munge.key" \
         --pid-file="$SLURM_ROOT/munge/munged.pid" --log-file="$SLURM_ROOT/log/munged.log" \
         --seed-file="$SLURM_ROOT/munge/munged.seed" --num-threads=2
  dl=$(deadline_in 10)
  until munge -n -S "$MUNGE_SOCK" >/dev/null 2>&1 || (( $(date +%s) >= dl )); do sleep 0.1; done
fi
munge -n -S "$MUNGE_SOCK" | unmunge -S "$MUNGE_SOCK" >/dev/null
log "munged up (pid $(cat "$SLURM_ROOT/munge/munged.pid"))"

# ---- 4. config -----------------------------------------------------------------
OLD_CONF=$(cat "$SLURM_CONF" "$SLURM_ROOT/etc/topology.conf" 2>/dev/null || true)
LAST=$(printf '%02d' "$NUM_NODES")
NUM_RACKS=$(( (NUM_NODES + NODES_PER_RACK - 1) / NODES_PER_RACK ))
rack_range() {  # $1 = rack number (1-based) -> "FIRST LAST" node numbers
  local lo=$(( ($1 - 1) * NODES_PER_RACK + 1 )) hi=$(( $1 * NODES_PER_RACK ))
  (( hi > NUM_NODES )) && hi=$NUM_NODES
  echo "$lo $hi"
}
node_lines() {  # one NodeName line per rack: its nodes carry the Feature rack_rNN
  local r lo hi
  for r in $(seq 1 "$NUM_RACKS"); do
    read -r lo hi < <(rack_range "$r")
    printf 'NodeName=gpu-node-[%02d-%02d] NodeHostname=gpu-node-[%02d-%02d] NodeAddr=127.0.0.1 Port=[%d-%d] CPUs=8 Boards=1 SocketsPerBoard=2 CoresPerSocket=4 ThreadsPerCore=1 RealMemory=64000 Gres=gpu:h100:%d Features=rack_r%02d State=UNKNOWN\n' \
      "$lo" "$hi" "$lo" "$hi" $((SLURMD_BASE_PORT+lo)) $((SLURMD_BASE_PORT+hi)) "$GPUS_PER_NODE" "$r"
  done
}
topology_conf() {  # topology/tree: a leaf switch per rack, one spine over them
  local r lo hi
  for r in $(seq 1 "$NUM_RACKS"); do
    read -r lo hi < <(rack_range "$r")
    printf 'SwitchName=leaf-%02d Nodes=gpu-node-[%02d-%02d]\n' "$r" "$lo" "$hi"
  done
  printf 'SwitchName=spine-01 Switches=leaf-[01-%02d]\n' "$NUM_RACKS"
}
cat > "$SLURM_CONF" <<CONF
ClusterName=gpuops
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCK
StateSaveLocation=$SLURM_ROOT/state
SlurmdSpoolDir=$SLURM_ROOT/spool/%n
SlurmctldPidFile=$SLURM_ROOT/run/slurmctld.pid
SlurmdPidFile=$SLURM_ROOT/run/slurmd-%n.pid
SlurmctldLogFile=$SLURM_ROOT/log/slurmctld.log
SlurmdLogFile=$SLURM_ROOT/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=1
GresTypes=gpu
RebootProgram=$SLURM_ROOT/bin/fake_reboot.sh
ResumeTimeout=60
SlurmdTimeout=30
MessageTimeout=10
KillWait=5
MinJobAge=300
InactiveLimit=0
JobRequeue=1
MailProg=/bin/true
TopologyPlugin=topology/tree
$(node_lines)
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
topology_conf >"$SLURM_ROOT/etc/topology.conf"
cat > "$SLURM_ROOT/etc/gres.conf" <<CONF
AutoDetect=off
NodeName=gpu-node-[01-$LAST] Name=gpu Type=h100 File=$SLURM_ROOT/dev/nvidia[0-$((GPUS_PER_NODE-1))]
CONF
# fake reboot: slurmd runs this; we restart *that* slurmd with -b (report "rebooted now")
cat > "$SLURM_ROOT/bin/fake_reboot.sh" <<'RB'
#!/bin/bash
# slurmd executes RebootProgram; FAKE_NODE/FAKE_PORT are in slurmd's environment
exec >>"${SLURM_ROOT}/log/fake_reboot.log" 2>&1
echo "$(date +%T) fake reboot of $FAKE_NODE (pid $PPID) args=$*"
setsid bash -c "sleep 1; kill \$(cat $SLURM_ROOT/run/slurmd-$FAKE_NODE.pid); sleep 2; \
  FAKE_NODE=$FAKE_NODE SLURM_ROOT=$SLURM_ROOT slurmd -f $SLURM_ROOT/etc/slurm.conf -N $FAKE_NODE -b" </dev/null >/dev/null 2>&1 &
RB
chmod 755 "$SLURM_ROOT/bin/fake_reboot.sh"
log "config written ($SLURM_CONF, $NUM_NODES nodes)"

# ---- 5. slurmctld --------------------------------------------------------------
ctld_up() { [[ $(scontrol ping 2>/dev/null) == *"is UP"* ]]; }   # no `| grep -q` under pipefail (SIGPIPE race)
if ! ctld_up; then
  # -c: start clean (test scratch state); daemonizes and writes its pid file
  # shellcheck disable=SC2086
  slurmctld -c -f "$SLURM_CONF" ${SLURMCTLD_EXTRA:-}
elif [[ $(scontrol show config 2>/dev/null) != *"topology/tree"* ]]; then
  # started by an older slurm_up.sh: slurmctld loads TopologyPlugin only at start, so restart it,
  # keeping its state (no -c: jobs and node states stay); the slurmds re-register by themselves
  log "slurmctld runs without topology/tree: restarting it (state kept) to load topology.conf"
  pid=$(cat "$SLURM_ROOT/run/slurmctld.pid")
  kill "$pid"
  dl=$(deadline_in "$SLURM_START_TIMEOUT_S")
  while kill -0 "$pid" 2>/dev/null && (( $(date +%s) < dl )); do sleep 0.1; done
  # shellcheck disable=SC2086
  slurmctld -f "$SLURM_CONF" ${SLURMCTLD_EXTRA:-}
elif [[ $(cat "$SLURM_CONF" "$SLURM_ROOT/etc/topology.conf") != "$OLD_CONF" ]]; then
  scontrol reconfigure   # node features and the like from the rewritten config
fi
dl=$(deadline_in "$SLURM_START_TIMEOUT_S")
until ctld_up || (( $(date +%s) >= dl )); do sleep 0.1; done
ctld_up || { tail -20 "$SLURM_ROOT/log/slurmctld.log" >&2; echo "slurm_up: slurmctld not up" >&2; exit 1; }
log "slurmctld up (pid $(cat "$SLURM_ROOT/run/slurmctld.pid"))"

# ---- 6. one slurmd per emulated node -------------------------------------------
for i in $(seq 1 "$NUM_NODES"); do
  n=$(printf 'gpu-node-%02d' "$i")
  mkdir -p "$SLURM_ROOT/spool/$n"
  if [[ -f $SLURM_ROOT/run/slurmd-$n.pid ]] && kill -0 "$(cat "$SLURM_ROOT/run/slurmd-$n.pid")" 2>/dev/null; then continue; fi
  FAKE_NODE=$n SLURM_ROOT=$SLURM_ROOT slurmd -f "$SLURM_CONF" -N "$n"
done
# ---- 7. wait until every node is idle --------------------------------------------
dl=$(deadline_in "$SLURM_START_TIMEOUT_S")
while :; do
  states=$(sinfo -h -N -o '%N %t')
  busy=$(awk '$2!="idle"' <<<"$states" | wc -l)
  [[ $busy == 0 ]] && [[ -n $states ]] && break
  (( $(date +%s) < dl )) || break
  sleep 0.1
done
sinfo -N -o '%N %t %G %E' >&2
[[ $busy == 0 ]] || { echo "slurm_up: nodes not idle after ${SLURM_START_TIMEOUT_S}s" >&2; exit 1; }
log "ready: install phase $(( (T_INST-T0)/1000000 ))ms, daemons+wait $(ms "$T_INST")ms, total $(ms "$T0")ms"
echo "export SLURM_CONF=$SLURM_CONF"
