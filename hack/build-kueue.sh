#!/usr/bin/env bash
# Builds Kueue's controller manager (sigs.k8s.io/kueue/cmd/kueue, from the official Go module through the Go module
# proxy) and copies Kueue's published CustomResourceDefinitions (the module's config/components/crd/bases) beside it,
# for the "behind Kueue" e2e (tests/e2e/test_kueue_e2e.py):
#   ${GPUSCHED_CACHE:-$HOME/.cache/gpusched}/kueue/kueue-<ver>/bin/kueue
#   ${GPUSCHED_CACHE:-$HOME/.cache/gpusched}/kueue/kueue-<ver>/crds/kueue.x-k8s.io_*.yaml
# The version is the one hack/kueue/go.mod requires (to bump: change it there, `go mod tidy`). v0.17.0 is built
# with k8s.io/api v0.35 and talks to the test control plane's kube-apiserver v1.37 (batch/v1 Jobs, its own CRDs).
# Idempotent: once built nothing is done (and Go is not needed). Concurrent runs are serialised with flock.
# The last line on stdout is always the kueue-<ver> directory; everything else goes to stderr.
# Exit codes: 0 ok, 2 Go is missing, other non-zero: the build failed.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODULE=sigs.k8s.io/kueue

log() { echo "build-kueue: $*" >&2; }

VERSION="$(awk -v m="${MODULE}" '($1 == "require" && $2 == m) { print $3; exit } ($1 == m) { print $2; exit }' \
  "${HACK_DIR}/kueue/go.mod")"
if [[ -z "${VERSION}" ]]; then
  log "cannot find the version of ${MODULE} in hack/kueue/go.mod"
  exit 1
fi

CACHE_ROOT="${GPUSCHED_CACHE:-${HOME}/.cache/gpusched}/kueue"
KEY="kueue-${VERSION}"
OUT_DIR="${CACHE_ROOT}/${KEY}"

built() { [[ -x "${OUT_DIR}/bin/kueue" && -s "${OUT_DIR}/crds/kueue.x-k8s.io_workloads.yaml" ]]; }

if built; then
  log "already built: ${OUT_DIR}"
  echo "${OUT_DIR}"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  log "ERROR: Go is not installed (no 'go' on PATH); it is needed once to build Kueue ${VERSION}"
  exit 2
fi

mkdir -p "${CACHE_ROOT}"
exec 9>"${CACHE_ROOT}/.${KEY}.lock"
flock 9
if built; then
  log "built by a concurrent run: ${OUT_DIR}"
  echo "${OUT_DIR}"
  exit 0
fi

export GOFLAGS=-mod=mod
STAGE="$(mktemp -d "${CACHE_ROOT}/.${KEY}.XXXXXX")"
chmod 755 "${STAGE}"
trap 'rm -rf "${STAGE}"' EXIT
start=${SECONDS}

log "Kueue's CRDs (${MODULE} ${VERSION}, config/components/crd/bases)"
# `go list -m` names the module's folder only once it is in the module cache: download it first
# (a fresh machine, or a cleaned cache, has nothing there yet)
(cd "${HACK_DIR}/kueue" && go mod download "${MODULE}") >&2
src_dir="$(cd "${HACK_DIR}/kueue" && go list -m -f '{{.Dir}}' "${MODULE}")"
if [[ -z "${src_dir}" || ! -d "${src_dir}/config/components/crd/bases" ]]; then
  log "cannot find ${MODULE} ${VERSION}'s CRDs in the module cache (go list -m gave '${src_dir}')"
  exit 1
fi
mkdir -p "${STAGE}/crds"
cp "${src_dir}"/config/components/crd/bases/kueue.x-k8s.io_*.yaml "${STAGE}/crds/"
chmod 644 "${STAGE}"/crds/*.yaml

log "Kueue's controller manager (${MODULE}/cmd/kueue ${VERSION}; several CPU-minutes)"
LDFLAGS="-s -w -X ${MODULE}/pkg/version.GitVersion=${VERSION}"
(cd "${HACK_DIR}/kueue" && CGO_ENABLED=0 nice -n 19 \
  go build -trimpath -ldflags="${LDFLAGS}" -o "${STAGE}/bin/kueue" "${MODULE}/cmd/kueue") >&2
rm -rf "${OUT_DIR:?}"
mv "${STAGE}" "${OUT_DIR}"
trap - EXIT
log "done in $((SECONDS - start))s"
echo "${OUT_DIR}"
