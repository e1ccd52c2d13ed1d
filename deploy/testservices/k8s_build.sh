#!/usr/bin/env bash
# Build kube-apiserver and etcd from the Go module proxy into a cache outside the
# repository, once per version (shared/infra/README.md: no release download site here).
#
# Usage: deploy/testservices/k8s_build.sh        (k8s_up.sh calls it when binaries are missing)
# Prints the binary directory as its last stdout line.
#
# Environment (all optional):
#   GPUOPS_CACHE   cache root, outside the repository   (default $HOME/.cache/gpuops)
#   K8S_VERSION    k8s.io/kubernetes version            (default v1.34.4)
#   ETCD_VERSION   go.etcd.io/etcd/server/v3 version    (default v3.6.4)
#
# Binaries land in $GPUOPS_CACHE/k8s/$K8S_VERSION/{kube-apiserver,etcd}; a binary is only
# moved there once its build succeeded, so a half build is never used. The build modules
# (go.mod + tools.go) are generated under $GPUOPS_CACHE/k8s/$K8S_VERSION/src:
#  - kube-apiserver: `require k8s.io/kubernetes` plus one `replace k8s.io/X => k8s.io/X
#    v0.MINOR.PATCH` for each `=> ./staging/...` replace in kubernetes' own go.mod (those
#    point into its repository and do not resolve from the proxy); the -X flags stamp the
#    version, without them the server reports v0.0.0-master and kubectl refuses it.
#  - etcd: its own small module (inside the Kubernetes module the versions clash).
# Cold: about 3.5 min and 2.1 GB peak memory on 2 cores, 2.5 GB Go build cache; runs under
# `nice` because the machine is shared.
set -euo pipefail
T0=$(date +%s)
GPUOPS_CACHE=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
K8S_VERSION=${K8S_VERSION:-v1.34.4}
ETCD_VERSION=${ETCD_VERSION:-v3.6.4}
OUT=$GPUOPS_CACHE/k8s/$K8S_VERSION
SRC=$OUT/src
log() { printf '[k8s_build +%4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
command -v go >/dev/null || die "go not found: install Go >= 1.21 (the official tarball in /usr/local/go; Debian 12 golang-go 1.19 is too old); a Go older than the go.mod line fetches the newer toolchain from the module proxy itself"
export GOFLAGS=-mod=mod
mkdir -p "$SRC/kube" "$SRC/etcd"

# staging version: v1.34.4 -> v0.34.4
[[ $K8S_VERSION =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "K8S_VERSION must look like v1.34.4, got $K8S_VERSION"
STAGING=v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}
MINOR=${BASH_REMATCH[1]}

if [[ ! -x $OUT/kube-apiserver ]]; then
  log "kube-apiserver $K8S_VERSION: generating the build module in $SRC/kube"
  cd "$SRC/kube"
  cat >go.mod <<MOD
module gpuops.local/k8sbuild

go 1.24

require k8s.io/kubernetes $K8S_VERSION
MOD
  cat >tools.go <<'GO'
//go:build tools

// Package tools pins kube-apiserver as a dependency of this build-only module.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
GO
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
  [[ -f $gomod ]] || die "could not download k8s.io/kubernetes@$K8S_VERSION (is the Go module proxy reachable?)"
  mods=$(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/.*#\1#p' "$gomod" | sort -u)
  [[ -n $mods ]] || die "no staging replaces found in $gomod"
  { echo; echo "replace ("; for m in $mods; do echo "	$m => $m $STAGING"; done; echo ")"; } >>go.mod
  log "$(wc -w <<<"$mods") staging replaces -> $STAGING; go mod tidy"
  nice go mod tidy >&2
  log "go build kube-apiserver (cold: minutes)"
  ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1"
  ld+=" -X k8s.io/component-base/version.gitMinor=$MINOR -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  nice go build -tags tools -ldflags "$ld" -o "$OUT/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver
  mv "$OUT/kube-apiserver.tmp" "$OUT/kube-apiserver"
  log "kube-apiserver built ($(du -m "$OUT/kube-apiserver" | cut -f1) MiB)"
fi

if [[ ! -x $OUT/etcd ]]; then
  log "etcd $ETCD_VERSION: generating the build module in $SRC/etcd"
  cd "$SRC/etcd"
  cat >go.mod <<MOD
module gpuops.local/etcdbuild

go 1.24

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
MOD
  cat >tools.go <<'GO'
//go:build tools

// Package tools pins the etcd server as a dependency of this build-only module.
package tools

import _ "go.etcd.io/etcd/server/v3"
GO
  nice go mod tidy >&2
  nice go build -tags tools -ldflags "-s -w" -o "$OUT/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$OUT/etcd.tmp" "$OUT/etcd"
  log "etcd built ($(du -m "$OUT/etcd" | cut -f1) MiB)"
fi
log "binaries in $OUT"
echo "$OUT"
