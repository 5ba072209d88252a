#!/usr/bin/env bash
# Builds kube-state-metrics (k8s.io/kube-state-metrics/v2, from the official Go module through the Go module proxy)
# for the Prometheus e2e (tests/e2e/test_prometheus.py): the NotReady-GPU-node and quota-exhausted alerts read its
# kube_node_status_condition, kube_node_labels and kube_resourcequota series.
#   ${GPUSCHED_CACHE:-$HOME/.cache/gpusched}/kube-state-metrics/ksm-<ver>/bin/kube-state-metrics
# The version is the one hack/kube-state-metrics/go.mod requires (to bump: change it there, `go mod tidy`).
# Idempotent: once built nothing is done (and Go is not needed). Concurrent runs are serialised with flock.
# The last line on stdout is always the bin directory; everything else goes to stderr.
# Exit codes: 0 ok, 2 Go is missing, other non-zero: the build failed.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODULE=k8s.io/kube-state-metrics/v2

log() { echo "build-kube-state-metrics: $*" >&2; }

VERSION="$(awk -v m="${MODULE}" '($1 == "require" && $2 == m) { print $3; exit } ($1 == m) { print $2; exit }' \
  "${HACK_DIR}/kube-state-metrics/go.mod")"
if [[ -z "${VERSION}" ]]; then
  log "cannot find the version of ${MODULE} in hack/kube-state-metrics/go.mod"
  exit 1
fi

CACHE_ROOT="${GPUSCHED_CACHE:-${HOME}/.cache/gpusched}/kube-state-metrics"
KEY="ksm-${VERSION}"
BIN_DIR="${CACHE_ROOT}/${KEY}/bin"

if [[ -x "${BIN_DIR}/kube-state-metrics" ]]; then
  log "already built: ${BIN_DIR}"
  echo "${BIN_DIR}"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  log "ERROR: Go is not installed (no 'go' on PATH); it is needed once to build kube-state-metrics ${VERSION}"
  exit 2
fi

mkdir -p "${CACHE_ROOT}"
exec 9>"${CACHE_ROOT}/.${KEY}.lock"
flock 9
if [[ -x "${BIN_DIR}/kube-state-metrics" ]]; then
  log "built by a concurrent run: ${BIN_DIR}"
  echo "${BIN_DIR}"
  exit 0
fi

STAGE="$(mktemp -d "${CACHE_ROOT}/.${KEY}.XXXXXX")"
chmod 755 "${STAGE}"
trap 'rm -rf "${STAGE}"' EXIT
start=${SECONDS}
log "kube-state-metrics (${MODULE} ${VERSION})"
LDFLAGS="-s -w -X github.com/prometheus/common/version.Version=${VERSION#v}"
(cd "${HACK_DIR}/kube-state-metrics" && GOFLAGS=-mod=mod CGO_ENABLED=0 nice -n 19 \
  go build -trimpath -ldflags="${LDFLAGS}" -o "${STAGE}/bin/kube-state-metrics" "${MODULE}") >&2
rm -rf "${CACHE_ROOT:?}/${KEY}"
mv "${STAGE}" "${CACHE_ROOT}/${KEY}"
trap - EXIT
log "done in $((SECONDS - start))s"
echo "${BIN_DIR}"
