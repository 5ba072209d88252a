#!/usr/bin/env bash
# Builds NVIDIA's gpu-feature-discovery, nvidia-device-plugin and mps-control-daemon from their Go module
# (github.com/NVIDIA/k8s-device-plugin, through the Go module proxy) for tests/test_gfd_fake_nvml.py: GFD run
# against hack/fakenvml's libnvidia-ml.so.1 and its labels compared with the agent's, key by key.
#   ${GPUSCHED_CACHE:-$HOME/.cache/gpusched}/nvidia-device-plugin/k8s-device-plugin-<ver>/bin/{gpu-feature-discovery,...}
# They are cgo programs (go-nvml dlopens libnvidia-ml.so.1 at run time; its headers come with the go-nvml module,
# so no NVIDIA package is needed to build). Idempotent; concurrent runs are serialised with flock.
# The last line on stdout is always the bin directory; everything else goes to stderr.
# Exit codes: 0 ok, 2 Go or gcc is missing, other non-zero: the build failed.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODULE=github.com/NVIDIA/k8s-device-plugin
CMDS=(gpu-feature-discovery nvidia-device-plugin mps-control-daemon)

log() { echo "build-nvidia-device-plugin: $*" >&2; }

# The version is the one hack/nvidia-device-plugin/go.mod requires (to bump: change it there, `go mod tidy`). That
# module replaces sigs.k8s.io/node-feature-discovery (v0.15.7 is not served by the proxy) with a small shim: see
# hack/nvidia-device-plugin/nfd-shim/go.mod. The shim's sources enter the cache key.
VERSION="$(awk -v m="${MODULE}" '($1 == "require" && $2 == m) { print $3; exit } ($1 == m) { print $2; exit }' \
  "${HACK_DIR}/nvidia-device-plugin/go.mod")"
if [[ -z "${VERSION}" ]]; then
  log "cannot find the version of ${MODULE} in hack/nvidia-device-plugin/go.mod"
  exit 1
fi
SHIM_HASH="$(cd "${HACK_DIR}/nvidia-device-plugin" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12)"

CACHE_ROOT="${GPUSCHED_CACHE:-${HOME}/.cache/gpusched}/nvidia-device-plugin"
KEY="k8s-device-plugin-${VERSION}_${SHIM_HASH}"
BIN_DIR="${CACHE_ROOT}/${KEY}/bin"

complete() { for c in "${CMDS[@]}"; do [[ -x "${BIN_DIR}/${c}" ]] || return 1; done; }

if complete; then
  log "already built: ${BIN_DIR}"
  echo "${BIN_DIR}"
  exit 0
fi
for tool in go gcc; do
  if ! command -v "${tool}" >/dev/null 2>&1; then
    log "ERROR: ${tool} is not installed; it is needed once to build ${MODULE} ${VERSION} (cgo)"
    exit 2
  fi
done

mkdir -p "${CACHE_ROOT}"
exec 9>"${CACHE_ROOT}/.${KEY}.lock"
flock 9
if complete; then
  log "built by a concurrent run: ${BIN_DIR}"
  echo "${BIN_DIR}"
  exit 0
fi

STAGE="$(mktemp -d "${CACHE_ROOT}/.${KEY}.XXXXXX")"
chmod 755 "${STAGE}"
trap 'rm -rf "${STAGE}"' EXIT
start=${SECONDS}
mkdir -p "${STAGE}/bin"
for c in "${CMDS[@]}"; do
  log "${MODULE}/cmd/${c} ${VERSION}"
  (cd "${HACK_DIR}/nvidia-device-plugin" && CGO_ENABLED=1 GOFLAGS=-mod=mod nice -n 19 \
    go build -trimpath -ldflags="-s -w -X ${MODULE}/internal/info.version=${VERSION}" \
    -o "${STAGE}/bin/${c}" "${MODULE}/cmd/${c}") >&2
done
rm -rf "${CACHE_ROOT:?}/${KEY}"
mv "${STAGE}" "${CACHE_ROOT}/${KEY}"
trap - EXIT
log "done in $((SECONDS - start))s"
echo "${BIN_DIR}"
