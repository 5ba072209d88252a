#!/usr/bin/env bash
# Extracts the CustomResourceDefinitions of the gang APIs that gpusched's standalone scheduler reads, from their
# official Go modules (through the Go module proxy), into a cache outside the repository keyed by the versions:
#   ${GPUSCHED_CACHE:-$HOME/.cache/gpusched}/gang-crds/sp-<ver>_volcano-<ver>_cg-<ver>/
#     scheduling.x-k8s.io_podgroups.yaml    (sigs.k8s.io/scheduler-plugins, config/crd/bases: the coscheduling PodGroup)
#     scheduling.volcano.sh_podgroups.yaml  (generated from volcano.sh/apis by controller-gen, as Volcano's Makefile
#                                            does: the volcano.sh/volcano module, which holds that YAML, is not
#                                            served by the module proxy)
# Kubernetes' own scheduling.k8s.io/v1beta1 PodGroup and Workload are built into kube-apiserver (feature gate
# GenericWorkload; the test control plane turns it on).
#
# Idempotent: if both files are there, nothing is fetched (and Go is not needed).
# The last line on stdout is always the directory; everything else goes to stderr.
# Exit codes: 0 ok, 2 Go is missing, other non-zero: the extraction failed.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SCHEDULER_PLUGINS_VERSION="v0.32.7"
VOLCANO_APIS_VERSION="$(awk '($1 == "require" && $2 == "volcano.sh/apis") { print $3; exit }' "${HACK_DIR}/gangcrds/go.mod")"
CONTROLLER_TOOLS_VERSION="$(awk '($1 == "sigs.k8s.io/controller-tools") { print $2; exit }' "${HACK_DIR}/gangcrds/go.mod")"
FILES=(scheduling.x-k8s.io_podgroups.yaml scheduling.volcano.sh_podgroups.yaml)

log() { echo "build-gang-crds: $*" >&2; }

if [[ -z "${VOLCANO_APIS_VERSION}" || -z "${CONTROLLER_TOOLS_VERSION}" ]]; then
  log "cannot read the versions of volcano.sh/apis and controller-tools from hack/gangcrds/go.mod"
  exit 1
fi
KEY="sp-${SCHEDULER_PLUGINS_VERSION}_volcano-${VOLCANO_APIS_VERSION}_cg-${CONTROLLER_TOOLS_VERSION}"
CACHE_ROOT="${GPUSCHED_CACHE:-${HOME}/.cache/gpusched}/gang-crds"
OUT_DIR="${CACHE_ROOT}/${KEY}"

built() {
  local f
  for f in "${FILES[@]}"; do
    [[ -s "${OUT_DIR}/${f}" ]] || return 1
  done
}

if built; then
  log "already extracted: ${OUT_DIR}"
  echo "${OUT_DIR}"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  log "ERROR: Go is not installed (no 'go' on PATH); it is needed once to fetch the gang CRDs" \
    "(scheduler-plugins ${SCHEDULER_PLUGINS_VERSION}, volcano.sh/apis ${VOLCANO_APIS_VERSION})."
  exit 2
fi

mkdir -p "${CACHE_ROOT}"
exec 9>"${CACHE_ROOT}/.${KEY}.lock"
flock 9
if built; then
  log "extracted by a concurrent run: ${OUT_DIR}"
  echo "${OUT_DIR}"
  exit 0
fi

export GOFLAGS=-mod=mod
STAGE="$(mktemp -d "${CACHE_ROOT}/.${KEY}.XXXXXX")"
chmod 755 "${STAGE}"
trap 'rm -rf "${STAGE}"' EXIT
start=${SECONDS}

log "scheduler-plugins PodGroup CRD (sigs.k8s.io/scheduler-plugins ${SCHEDULER_PLUGINS_VERSION})"
sp_dir="$(cd "${STAGE}" && go mod download -json "sigs.k8s.io/scheduler-plugins@${SCHEDULER_PLUGINS_VERSION}" |
  python3 -c 'import json, sys; d = json.load(sys.stdin); print(d.get("Dir", "")); sys.exit("Error" in d)')"
cp "${sp_dir}/config/crd/bases/scheduling.x-k8s.io_podgroups.yaml" "${STAGE}/"

log "Volcano PodGroup CRD (controller-gen ${CONTROLLER_TOOLS_VERSION} on volcano.sh/apis ${VOLCANO_APIS_VERSION}; a few minutes)"
mkdir -p "${STAGE}/volcano"
(cd "${HACK_DIR}/gangcrds" && nice -n 19 go tool controller-gen crd:crdVersions=v1,generateEmbeddedObjectMeta=true \
  paths=volcano.sh/apis/pkg/apis/scheduling/v1beta1 "output:crd:dir=${STAGE}/volcano") >&2
cp "${STAGE}/volcano/scheduling.volcano.sh_podgroups.yaml" "${STAGE}/"
rm -rf "${STAGE}/volcano"

mkdir -p "${OUT_DIR}"
for f in "${FILES[@]}"; do
  mv -f "${STAGE}/${f}" "${OUT_DIR}/${f}"
done
log "done in $((SECONDS - start))s: ${OUT_DIR}"
echo "${OUT_DIR}"
