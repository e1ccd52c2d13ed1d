#!/usr/bin/env bash
# Build the helm CLI from the Go module proxy into a cache outside the repository, once per
# version (shared/infra/README.md: no release download site here).
#
# Usage: deploy/testservices/helm_build.sh     (run-tests.sh calls it when the binary is missing)
# Prints the binary path as its last stdout line.
#
# Environment (all optional):
#   GPUOPS_CACHE   cache root, outside the repository   (default $HOME/.cache/gpuops)
#   HELM_MODULE    helm.sh/helm/v4 or helm.sh/helm/v3   (default helm.sh/helm/v4)
#   HELM_VERSION   module version                       (default v4.3.2)
#
# The binary lands in $GPUOPS_CACHE/helm/$HELM_VERSION/helm; it is only moved there once the
# build succeeded, so a half build is never used. `go install module@version` builds it
# outside any module (helm's go.mod has no replace directives that would forbid that); the
# -X flag stamps the version `helm version` prints. Runs under `nice`: the machine is shared.
set -euo pipefail
T0=$(date +%s)
GPUOPS_CACHE=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
HELM_MODULE=${HELM_MODULE:-helm.sh/helm/v4}
HELM_VERSION=${HELM_VERSION:-v4.3.2}
OUT=$GPUOPS_CACHE/helm/$HELM_VERSION
log() { printf '[helm_build +%4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
if [[ -x $OUT/helm ]]; then echo "$OUT/helm"; exit 0; fi
command -v go >/dev/null || die "go not found: install Go >= 1.24 (the official tarball in /usr/local/go)"
mkdir -p "$OUT/bin.tmp"
log "go install $HELM_MODULE/cmd/helm@$HELM_VERSION (cold: minutes)"
GOBIN=$OUT/bin.tmp nice go install -ldflags "-s -w -X $HELM_MODULE/internal/version.version=$HELM_VERSION" \
  "$HELM_MODULE/cmd/helm@$HELM_VERSION" >&2 \
  || die "could not build $HELM_MODULE@$HELM_VERSION (is the Go module proxy reachable? try HELM_MODULE=helm.sh/helm/v3 HELM_VERSION=v3.21.4)"
mv "$OUT/bin.tmp/helm" "$OUT/helm"
rmdir "$OUT/bin.tmp" 2>/dev/null || true
log "helm built: $("$OUT/helm" version --short 2>/dev/null || echo '?')"
echo "$OUT/helm"
