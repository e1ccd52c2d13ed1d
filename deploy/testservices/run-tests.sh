#!/usr/bin/env bash
# THE gpuops test command: install what is missing, start the real test services (Kafka,
# Slurm, PostgreSQL, a Kubernetes API server), run pytest against them, stop the services
# again, exit with pytest's status.
#
# Usage: deploy/testservices/run-tests.sh [PYTEST_ARGS...]      (default: -q)
#   e.g. deploy/testservices/run-tests.sh -q -rs tests/services
# Works from any directory (it cd's to the repository root).
#
# What it installs when missing (root, Debian 12): apt packages slurmctld slurmd
# slurm-client munge (slurm_up.sh), a JRE and Maven (kafka_up.sh), postgresql
# (postgres_up.sh), chromium and chromium-driver (the dashboard's browser test); kube-apiserver and etcd, built once with `go` from the Go module proxy
# (k8s_build.sh, ~3.5 min cold) into ${GPUOPS_CACHE}/k8s/<version>; the project with
# `pip install -e '.[service,test,report]'`; helm, built once from the Go module
# proxy (helm_build.sh) into ${GPUOPS_CACHE}/helm/<version> and exported as GPUOPS_HELM; promtool (Debian's prometheus package, for the /metrics
# check); the Kafka jars into ${GPUOPS_CACHE:-~/.cache/gpuops}.
#
# Environment:
#   PYTHON                 interpreter to use (default: python, else python3)
#   GPUOPS_KEEP_SERVICES=1 leave the services running afterwards (faster reruns)
#   GPUOPS_ARTIFACTS       where tests keep screenshots (default: ./artifacts)
#   KAFKA_ROOT, KAFKA_PORT, SLURM_ROOT, PG_ROOT, PG_PORT, K8S_ROOT, K8S_PORT, ...   passed through to the *_up.sh scripts
# Services that were already running when it started are reused and left running; the
# ones it starts begin from purged state and are always stopped on exit (trap EXIT),
# whatever pytest did; their logs stay in $KAFKA_ROOT/log, $SLURM_ROOT/log, $PG_ROOT/log and $K8S_ROOT/log.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"
T0=$(date +%s)
export KAFKA_ROOT=${KAFKA_ROOT:-/tmp/gpuops-kafka}
export SLURM_ROOT=${SLURM_ROOT:-/tmp/gpuops-slurm}
export PG_ROOT=${PG_ROOT:-/tmp/gpuops-pg}
export K8S_ROOT=${K8S_ROOT:-/tmp/gpuops-k8s}
# the browser test's screenshots land here, one folder per test (docs/dashboard.md)
export GPUOPS_ARTIFACTS=${GPUOPS_ARTIFACTS:-$ROOT/artifacts}

log() { printf '[run-tests +%3ss] %s\n' "$(( $(date +%s) - T0 ))" "$*" >&2; }

if [[ -n ${PYTHON:-} ]]; then :
elif command -v python >/dev/null; then PYTHON=python
else PYTHON=python3
fi

# ---- teardown: only what this run started ---------------------------------------------
started_kafka=0
started_slurm=0
started_postgres=0
started_k8s=0
started_bmc=0
export BMC_ROOT=${BMC_ROOT:-/tmp/gpuops-bmc}
teardown() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ ${GPUOPS_KEEP_SERVICES:-0} == 1 ]]; then
    log "GPUOPS_KEEP_SERVICES=1: leaving services running"
  else
    if [[ $started_bmc == 1 ]]; then "$HERE/bmc_down.sh" >&2 || log "bmc_down failed"; fi
    if [[ $started_postgres == 1 ]]; then "$HERE/postgres_down.sh" >&2 || log "postgres_down failed"; fi
    if [[ $started_k8s == 1 ]]; then "$HERE/k8s_down.sh" >&2 || log "k8s_down failed"; fi
    if [[ $started_slurm == 1 ]]; then "$HERE/slurm_down.sh" >&2 || log "slurm_down failed"; fi
    if [[ $started_kafka == 1 ]]; then "$HERE/kafka_down.sh" >&2 || log "kafka_down failed"; fi
  fi
  log "done, exit $rc"
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- 1. python packages -----------------------------------------------------------------
# installed, with its test extras, and from *this* checkout (the `gpuops` command that tests run
# in subprocesses must be this tree's code, not another clone's editable install)
installed_from=$(cd / && "$PYTHON" -c 'import importlib.metadata as m; m.version("gpuops"); import collector, sklearn, numba, pandas, fastapi, matplotlib, pytest, pytest_timeout, kafka, lz4, sqlalchemy, alembic, psycopg, kubernetes, prometheus_client, schemathesis, selenium, os; print(os.path.dirname(os.path.dirname(os.path.realpath(collector.__file__))))' 2>/dev/null || true)
if [[ "$installed_from" != "$(pwd -P)" ]]; then
  log "installing gpuops with pip (editable, [service,test,report]) from $(pwd -P)"
  "$PYTHON" -m pip install -q -e '.[service,test,report]'
fi

# promtool checks the API's /metrics text (tests/api/test_metrics.py); Debian ships it in `prometheus`
if ! command -v promtool >/dev/null && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  log "installing promtool (apt: prometheus)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null ||
    { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }
fi

# headless Chromium and its driver for the dashboard's browser test (tests/api/test_dashboard_browser.py)
if { ! command -v chromium >/dev/null || [[ ! -x /usr/bin/chromedriver ]]; } && [[ $(id -u) == 0 ]] &&
   command -v apt-get >/dev/null; then
  log "installing chromium and chromium-driver (apt)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null ||
    { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null; }
fi

# ---- 2. services ---------------------------------------------------------------------------
# last stdout line of an *_up.sh script is `export NAME=VALUE`; take VALUE without eval
export_value() {  # $1 = NAME, $2 = the script's stdout
  local line=${2##*$'\n'}
  [[ $line == "export $1="* ]] || { log "unexpected output from service script: $line"; return 1; }
  printf '%s' "${line#"export $1="}"
}
kafka_running() {
  local p
  [[ -f $KAFKA_ROOT/kafka.pid ]] && p=$(<"$KAFKA_ROOT/kafka.pid") && [[ -r /proc/$p/cmdline ]] &&
    [[ $(tr '\0' ' ' <"/proc/$p/cmdline") == *kafka.Kafka* ]]
}
k8s_running() {
  local p first
  [[ -f $K8S_ROOT/kube-apiserver.pid ]] && p=$(<"$K8S_ROOT/kube-apiserver.pid") && [[ -r /proc/$p/cmdline ]] &&
    IFS= read -r -d '' first <"/proc/$p/cmdline" ; [[ ${first:-} == */kube-apiserver ]]
}
postgres_running() {
  local p
  [[ -f $PG_ROOT/data/postmaster.pid ]] && p=$(head -1 "$PG_ROOT/data/postmaster.pid") &&
    [[ $p =~ ^[0-9]+$ ]] && [[ -r /proc/$p/cmdline ]] && [[ $(tr '\0' ' ' <"/proc/$p/cmdline") == *postgres* ]]
}
bmc_running() {
  local p
  [[ -f $BMC_ROOT/ipmi_sim.pid ]] && p=$(<"$BMC_ROOT/ipmi_sim.pid") && [[ -r /proc/$p/cmdline ]] &&
    [[ $(tr '\0' ' ' <"/proc/$p/cmdline") == *ipmi_sim* ]]
}
slurm_running() {
  [[ -f $SLURM_ROOT/etc/slurm.conf ]] &&
    [[ $(SLURM_CONF=$SLURM_ROOT/etc/slurm.conf timeout 5 scontrol ping 2>/dev/null) == *"is UP"* ]]
}

# A service this run starts begins from empty state (topics, offsets, jobs of an earlier
# run would leak into tests); state is kept after the run for reading the logs.
if ! kafka_running; then started_kafka=1; "$HERE/kafka_down.sh" --purge >/dev/null; fi
out=$("$HERE/kafka_up.sh")
GPUOPS_TEST_KAFKA=$(export_value GPUOPS_TEST_KAFKA "$out")
export GPUOPS_TEST_KAFKA

if ! slurm_running; then started_slurm=1; "$HERE/slurm_down.sh" --purge >/dev/null; fi
out=$("$HERE/slurm_up.sh")
SLURM_CONF=$(export_value SLURM_CONF "$out")
export SLURM_CONF

if ! postgres_running; then started_postgres=1; "$HERE/postgres_down.sh" --purge >/dev/null; fi
out=$("$HERE/postgres_up.sh")
GPUOPS_TEST_POSTGRES=$(export_value GPUOPS_TEST_POSTGRES "$out")
export GPUOPS_TEST_POSTGRES

if ! k8s_running; then started_k8s=1; "$HERE/k8s_down.sh" --purge >/dev/null; fi
out=$("$HERE/k8s_up.sh")
GPUOPS_TEST_K8S=$(export_value GPUOPS_TEST_K8S "$out")
export GPUOPS_TEST_K8S
if ! bmc_running; then started_bmc=1; "$HERE/bmc_down.sh" --purge >/dev/null 2>&1; fi
out=$("$HERE/bmc_up.sh")
GPUOPS_TEST_BMC=$(export_value GPUOPS_TEST_BMC "$out")
export GPUOPS_TEST_BMC
# helm renders the chart (tests/deploy/test_helm.py); built once from the Go module proxy
if [[ -z ${GPUOPS_HELM:-} ]]; then
  GPUOPS_HELM=$("$HERE/helm_build.sh" | tail -1)
  export GPUOPS_HELM
fi
log "services up: GPUOPS_TEST_KAFKA=$GPUOPS_TEST_KAFKA SLURM_CONF=$SLURM_CONF GPUOPS_TEST_POSTGRES=$GPUOPS_TEST_POSTGRES GPUOPS_TEST_K8S=$GPUOPS_TEST_K8S GPUOPS_TEST_BMC=$GPUOPS_TEST_BMC GPUOPS_HELM=$GPUOPS_HELM"

# ---- 3. tests ---------------------------------------------------------------------------------
(( $# )) || set -- -q
log "$PYTHON -m pytest $*"
rc=0
"$PYTHON" -m pytest "$@" || rc=$?
if [[ $rc == 5 ]]; then
  log "pytest collected no tests (exit 5): treated as a failure"
fi
exit "$rc"
