#!/usr/bin/env bash
# Start a real Kubernetes API server (kube-apiserver + etcd, no controllers, no kubelet)
# on 127.0.0.1 for gpuops tests (shared/DESIGN.md, "Test services"). Node and Pod objects
# are created by the tests themselves.
#
# Usage: deploy/testservices/k8s_up.sh
#   then: export GPUOPS_TEST_K8S=$K8S_ROOT/kubeconfig     (the last line it prints)
# Stop:  deploy/testservices/k8s_down.sh [--purge]
#
# Environment (all optional):
#   K8S_ROOT          state, certs, kubeconfig, logs, pid files  (default /tmp/gpuops-k8s)
#   GPUOPS_CACHE      binary cache, outside the repository      (default $HOME/.cache/gpuops)
#   K8S_VERSION       kube-apiserver version                     (default v1.34.4)
#   K8S_PORT          kube-apiserver secure port                 (default 16443)
#   ETCD_CLIENT_PORT  etcd client port                           (default 12379)
#   ETCD_PEER_PORT    etcd peer port                             (default 12380)
#   K8S_START_TIMEOUT_S  wait for etcd health and /readyz        (default 60)
#
# The binaries are built from the Go module proxy once (k8s_build.sh: ~3.5 min cold, 2.1 GB
# peak memory) into $GPUOPS_CACHE/k8s/$K8S_VERSION; later starts reuse them. Idempotent: an
# apiserver from $K8S_ROOT that answers /readyz is reused. Certificates and the admin token
# are made once per $K8S_ROOT (k8s_down.sh --purge removes them).
set -euo pipefail
T0=$(date +%s%N)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
K8S_ROOT=${K8S_ROOT:-/tmp/gpuops-k8s}
GPUOPS_CACHE=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
K8S_VERSION=${K8S_VERSION:-v1.34.4}
K8S_PORT=${K8S_PORT:-16443}
ETCD_CLIENT_PORT=${ETCD_CLIENT_PORT:-12379}
ETCD_PEER_PORT=${ETCD_PEER_PORT:-12380}
K8S_START_TIMEOUT_S=${K8S_START_TIMEOUT_S:-60}
BIN=$GPUOPS_CACHE/k8s/$K8S_VERSION
PKI=$K8S_ROOT/pki
KUBECONFIG_OUT=$K8S_ROOT/kubeconfig
SERVER=https://127.0.0.1:$K8S_PORT
ETCD_URL=http://127.0.0.1:$ETCD_CLIENT_PORT

ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
log() { printf '[k8s_up +%6sms] %s\n' "$(ms "$T0")" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# a pid file that names a live process whose argv[0] ends in $2 (guards against pid reuse)
our_pid() {  # $1 = pid file, $2 = binary name
  local p cmd
  [[ -f $1 ]] || return 1
  p=$(<"$1")
  [[ $p =~ ^[0-9]+$ ]] && [[ -r /proc/$p/cmdline ]] || return 1
  cmd=$(tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | head -1) || return 1
  [[ $cmd == */"$2" ]] || return 1
  echo "$p"
}
token() { [[ -f $PKI/admin.token ]] && cat "$PKI/admin.token"; }
readyz() {  # 0 when the apiserver answers /readyz with "ok"
  local out
  out=$(curl -sS --max-time 3 --cacert "$PKI/ca.crt" -H "Authorization: Bearer $(token)" \
        "$SERVER/readyz" 2>/dev/null) || return 1
  [[ $out == ok ]]
}
etcd_healthy() {
  local out
  out=$(curl -sS --max-time 2 "$ETCD_URL/health" 2>/dev/null) || return 1
  [[ $out == *'"health":"true"'* ]]
}

# ---- 0. already up? -----------------------------------------------------------------
if pid=$(our_pid "$K8S_ROOT/kube-apiserver.pid" kube-apiserver) && readyz; then
  log "already running (pid $pid) on $SERVER"
  echo "export GPUOPS_TEST_K8S=$KUBECONFIG_OUT"
  exit 0
fi
if pid=$(our_pid "$K8S_ROOT/kube-apiserver.pid" kube-apiserver); then
  die "kube-apiserver pid $pid from $K8S_ROOT is alive but $SERVER/readyz is not ok; run k8s_down.sh"
fi
command -v openssl >/dev/null || die "openssl not found (apt-get install openssl)"
command -v curl >/dev/null || die "curl not found (apt-get install curl)"

# ---- 1. binaries (built once, then the cache) ---------------------------------------
if [[ ! -x $BIN/kube-apiserver ]] || [[ ! -x $BIN/etcd ]]; then
  log "no cached binaries in $BIN: building them (once; minutes)"
  GPUOPS_CACHE=$GPUOPS_CACHE K8S_VERSION=$K8S_VERSION "$HERE/k8s_build.sh" >/dev/null
fi
T_BIN=$(date +%s%N)

# ---- 2. certificates, service-account keys, admin token (once per K8S_ROOT) -----------
mkdir -p "$PKI" "$K8S_ROOT/log" "$K8S_ROOT/etcd"
chmod 700 "$PKI"
if [[ ! -f $PKI/.complete ]]; then
  log "generating a self-signed serving cert (IP SAN 127.0.0.1), service-account keys and an admin token"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=gpuops-test-apiserver" \
    -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" \
    -keyout "$PKI/apiserver.key" -out "$PKI/ca.crt" 2>/dev/null
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PKI/admin.token"
  # token,user,uid,"group1,group2": system:masters bypasses RBAC
  printf '%s,gpuops-admin,gpuops-admin,"system:masters"\n' "$(token)" >"$PKI/tokens.csv"
  touch "$PKI/.complete"
fi
ca_b64=$(base64 -w0 <"$PKI/ca.crt")
cat >"$KUBECONFIG_OUT" <<CONF
# written by deploy/testservices/k8s_up.sh: the admin of the gpuops test apiserver
apiVersion: v1
kind: Config
clusters:
- name: gpuops-test
  cluster:
    server: $SERVER
    certificate-authority-data: $ca_b64
users:
- name: gpuops-admin
  user:
    token: $(token)
contexts:
- name: gpuops-test
  context: {cluster: gpuops-test, user: gpuops-admin}
current-context: gpuops-test
CONF
chmod 600 "$KUBECONFIG_OUT"

# ---- 3. etcd -------------------------------------------------------------------------
if pid=$(our_pid "$K8S_ROOT/etcd.pid" etcd) && etcd_healthy; then
  log "etcd already running (pid $pid)"
else
  [[ -n ${pid:-} ]] && die "etcd pid $pid from $K8S_ROOT is alive but not healthy; run k8s_down.sh"
  for p in "$ETCD_CLIENT_PORT" "$ETCD_PEER_PORT" "$K8S_PORT"; do
    port_open "$p" && die "port $p is taken by another process (set ETCD_CLIENT_PORT / ETCD_PEER_PORT / K8S_PORT)"
  done
  nohup "$BIN/etcd" --name gpuops-test --data-dir "$K8S_ROOT/etcd" \
    --listen-client-urls "$ETCD_URL" --advertise-client-urls "$ETCD_URL" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "gpuops-test=http://127.0.0.1:$ETCD_PEER_PORT" \
    --quota-backend-bytes 1073741824 --log-level warn \
    </dev/null >"$K8S_ROOT/log/etcd.log" 2>&1 &
  echo $! >"$K8S_ROOT/etcd.pid"
  deadline=$(( $(date +%s) + K8S_START_TIMEOUT_S ))
  until etcd_healthy; do
    kill -0 "$(<"$K8S_ROOT/etcd.pid")" 2>/dev/null || { tail -20 "$K8S_ROOT/log/etcd.log" >&2; die "etcd exited during start-up"; }
    (( $(date +%s) < deadline )) || die "etcd not healthy after ${K8S_START_TIMEOUT_S}s (log: $K8S_ROOT/log/etcd.log)"
    sleep 0.1
  done
  log "etcd healthy on $ETCD_URL"
fi
T_ETCD=$(date +%s%N)

# ---- 4. kube-apiserver -------------------------------------------------------------------
port_open "$K8S_PORT" && die "port $K8S_PORT is taken by another process (set K8S_PORT)"
nohup "$BIN/kube-apiserver" \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$K8S_PORT" \
  --etcd-servers="$ETCD_URL" --etcd-prefix=/gpuops-test \
  --tls-cert-file="$PKI/ca.crt" --tls-private-key-file="$PKI/apiserver.key" \
  --service-account-issuer=https://kubernetes.default.svc \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --token-auth-file="$PKI/tokens.csv" --authorization-mode=RBAC \
  --service-cluster-ip-range=10.0.0.0/24 \
  </dev/null >"$K8S_ROOT/log/kube-apiserver.log" 2>&1 &
pid=$!
echo "$pid" >"$K8S_ROOT/kube-apiserver.pid"
log "started kube-apiserver pid $pid; waiting up to ${K8S_START_TIMEOUT_S}s for /readyz"
deadline=$(( $(date +%s) + K8S_START_TIMEOUT_S ))
until readyz; do
  if ! kill -0 "$pid" 2>/dev/null; then
    tail -30 "$K8S_ROOT/log/kube-apiserver.log" >&2
    rm -f "$K8S_ROOT/kube-apiserver.pid"
    die "kube-apiserver exited during start-up (log: $K8S_ROOT/log/kube-apiserver.log)"
  fi
  (( $(date +%s) < deadline )) || die "kube-apiserver not ready after ${K8S_START_TIMEOUT_S}s (pid $pid still running; stop it with k8s_down.sh)"
  sleep 0.1
done
log "ready on $SERVER: binaries $(( (T_BIN-T0)/1000000 ))ms, etcd $(( (T_ETCD-T_BIN)/1000000 ))ms, apiserver $(ms "$T_ETCD")ms, total $(ms "$T0")ms"
echo "export GPUOPS_TEST_K8S=$KUBECONFIG_OUT"
