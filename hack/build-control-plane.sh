#!/usr/bin/env bash
# Builds the real Kubernetes control plane that gpusched's e2e tests and benchmarks run against:
#   kube-apiserver, kube-scheduler, kube-controller-manager, kubectl  (hack/controlplane, k8s.io/kubernetes)
#   etcd                                                              (hack/etcd, go.etcd.io/etcd/server/v3)
#   kwok                                                              (hack/kwok, sigs.k8s.io/kwok)
#   helm                                                              (hack/helm, helm.sh/helm/v3)
#   kubelet                                                           (hack/controlplane, k8s.io/kubernetes)
# plus kwok's default Stage objects (node-initialize, node heartbeat with lease, pod ready/complete/delete,
# copied from the pinned kwok module) as share/kwok-stages.yaml next to bin/,
# from the official Go modules (through the Go module proxy), into a cache outside the repository keyed by
# the pinned versions:
#   ${GPUSCHED_CACHE:-$HOME/.cache/gpusched}/controlplane/k8s-<ver>_etcd-<ver>_kwok-<ver>/bin/
#
# helm (for the deploy tests: `helm lint`, `helm template`) is an add-on that does not enter the cache key: it is
# built into the same bin/ and stamped with its version (share/helm.version). A cache made before helm was added,
# or with another helm version, gets just helm (re)built; without Go such a cache is still used, without helm.
#
# kubelet (for the real-node tests, tests/kubelet) is an add-on too, built from the same module and version as
# kube-apiserver (so it needs no key of its own): a cache made before it was added gets just the kubelet built into
# it; without Go such a cache is still used, without the kubelet.
#
# Idempotent: if every binary is already there, nothing is built (and Go is not needed).
# The last line on stdout is always the bin directory; everything else goes to stderr.
# Exit codes: 0 ok, 2 Go is missing, other non-zero: the build failed.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BINARIES=(kube-apiserver kube-scheduler kube-controller-manager kubectl etcd kwok)

log() { echo "build-control-plane: $*" >&2; }

# The version of `module` required by the go.mod in directory `dir` (read without Go, for the cache key).
required_version() {
  local dir="$1" module="$2" version
  version="$(awk -v m="${module}" '($1 == "require" && $2 == m) { print $3; exit } ($1 == m) { print $2; exit }' \
    "${HACK_DIR}/${dir}/go.mod")"
  if [[ -z "${version}" ]]; then
    log "cannot find the version of ${module} in hack/${dir}/go.mod"
    exit 1
  fi
  echo "${version}"
}

K8S_VERSION="$(required_version controlplane k8s.io/kubernetes)"
ETCD_VERSION="$(required_version etcd go.etcd.io/etcd/server/v3)"
KWOK_VERSION="$(required_version kwok sigs.k8s.io/kwok)"
HELM_VERSION="$(required_version helm helm.sh/helm/v3)"
# The Kubernetes minor helm reports as .Capabilities.KubeVersion (and lints deprecations against): that of the
# client-go it is built with, as helm's own Makefile sets it.
HELM_K8S_MINOR="$(required_version helm k8s.io/client-go)"
HELM_K8S_MINOR="${HELM_K8S_MINOR#v0.}"
HELM_K8S_MINOR="${HELM_K8S_MINOR%%.*}"

CACHE_ROOT="${GPUSCHED_CACHE:-${HOME}/.cache/gpusched}/controlplane"
KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}"
OUT_DIR="${CACHE_ROOT}/${KEY}"
BIN_DIR="${OUT_DIR}/bin"
STAGES_FILE="share/kwok-stages.yaml"
HELM_STAMP="share/helm.version"
# kwok ships no built-in stages: `kwok` needs them through --config. These are the ones kwokctl uses by default.
KWOK_STAGES=(
  kustomize/stage/node/fast/node-initialize.yaml
  kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
  kustomize/stage/pod/fast/pod-ready.yaml
  kustomize/stage/pod/fast/pod-complete.yaml
  kustomize/stage/pod/fast/pod-delete.yaml
)

core_built() {
  local b
  for b in "${BINARIES[@]}"; do
    [[ -x "${BIN_DIR}/${b}" ]] || return 1
  done
  [[ -s "${OUT_DIR}/${STAGES_FILE}" ]]
}

helm_built() {
  [[ -x "${BIN_DIR}/helm" && "$(cat "${OUT_DIR}/${HELM_STAMP}" 2>/dev/null)" == "${HELM_VERSION}" ]]
}

kubelet_built() {
  [[ -x "${BIN_DIR}/kubelet" ]]
}

all_built() {
  core_built && helm_built && kubelet_built
}

if all_built; then
  log "already built: ${BIN_DIR}"
  echo "${BIN_DIR}"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  if core_built; then
    helm_built || log "WARNING: Go is not installed: helm ${HELM_VERSION} cannot be built; tests that need helm cannot run"
    kubelet_built || log "WARNING: Go is not installed: the kubelet cannot be built; tests that need it cannot run"
    echo "${BIN_DIR}"
    exit 0
  fi
  log "ERROR: Go is not installed (no 'go' on PATH); it is needed once to build the test control plane" \
    "(k8s ${K8S_VERSION}, etcd ${ETCD_VERSION}, kwok ${KWOK_VERSION}). Install Go >= 1.26, or point" \
    "GPUSCHED_CONTROLPLANE_BIN at a directory holding: ${BINARIES[*]}."
  exit 2
fi

mkdir -p "${CACHE_ROOT}"
# Serialise concurrent builds (e.g. pytest-xdist workers): the first builds, the others wait and reuse.
exec 9>"${CACHE_ROOT}/.${KEY}.lock"
flock 9
if all_built; then
  log "built by a concurrent run: ${BIN_DIR}"
  echo "${BIN_DIR}"
  exit 0
fi

export GOFLAGS=-mod=mod
export CGO_ENABLED=0
NICE=(nice -n 19)
BUILD_DATE="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
STAGE="$(mktemp -d "${CACHE_ROOT}/.${KEY}.XXXXXX")"
chmod 755 "${STAGE}"
mkdir -p "${STAGE}/bin" "${STAGE}/share"
trap 'rm -rf "${STAGE}"' EXIT

k8s_minor="${K8S_VERSION#v1.}"
k8s_minor="${k8s_minor%%.*}"
K8S_LDFLAGS="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  K8S_LDFLAGS+=" -X ${pkg}.gitVersion=${K8S_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${k8s_minor}"
  K8S_LDFLAGS+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=${BUILD_DATE}"
done
KWOK_LDFLAGS="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION}"
KWOK_LDFLAGS+=" -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${K8S_VERSION}"
HELM_LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
HELM_LDFLAGS+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  HELM_LDFLAGS+=" -X ${pkg}.k8sVersionMajor=1 -X ${pkg}.k8sVersionMinor=${HELM_K8S_MINOR}"
done

# build_helm DIR: builds helm into DIR/bin/helm and writes DIR/share/helm.version.
build_helm() {
  log "helm (helm.sh/helm/v3 ${HELM_VERSION})"
  (cd "${HACK_DIR}/helm" && "${NICE[@]}" go build -trimpath -ldflags="${HELM_LDFLAGS}" -o "$1/bin/helm" \
    helm.sh/helm/v3/cmd/helm) >&2
  echo "${HELM_VERSION}" >"$1/${HELM_STAMP}"
}

# build_kubelet DIR: builds the kubelet (same module, version and ldflags as kube-apiserver) into DIR/bin/kubelet.
build_kubelet() {
  log "kubelet (k8s.io/kubernetes ${K8S_VERSION})"
  (cd "${HACK_DIR}/controlplane" && "${NICE[@]}" go build -trimpath -ldflags="${K8S_LDFLAGS}" -o "$1/bin/kubelet" \
    k8s.io/kubernetes/cmd/kubelet) >&2
}

if core_built; then
  # Only add-ons (helm, kubelet) are missing or stale: build them alone and move them into the complete cache.
  start=${SECONDS}
  if ! helm_built; then
    build_helm "${STAGE}"
    mv -f "${STAGE}/bin/helm" "${BIN_DIR}/helm"
    mv -f "${STAGE}/${HELM_STAMP}" "${OUT_DIR}/${HELM_STAMP}"
  fi
  if ! kubelet_built; then
    build_kubelet "${STAGE}"
    mv -f "${STAGE}/bin/kubelet" "${BIN_DIR}/kubelet"
  fi
  log "add-ons done in $((SECONDS - start))s"
  echo "${BIN_DIR}"
  exit 0
fi

start=${SECONDS}
log "building k8s ${K8S_VERSION} (with the kubelet), etcd ${ETCD_VERSION}, kwok ${KWOK_VERSION}, helm ${HELM_VERSION} into ${BIN_DIR}: the first build takes 12-25 minutes on 4 cores (then cached)"

log "kube-apiserver kube-scheduler kube-controller-manager kubectl (k8s.io/kubernetes ${K8S_VERSION})"
(cd "${HACK_DIR}/controlplane" && "${NICE[@]}" go build -trimpath -ldflags="${K8S_LDFLAGS}" -o "${STAGE}/bin/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kubectl) >&2

log "etcd (go.etcd.io/etcd/server/v3 ${ETCD_VERSION})"
(cd "${HACK_DIR}/etcd" && "${NICE[@]}" go build -trimpath -ldflags="-s -w" -o "${STAGE}/bin/etcd" ./cmd/etcd) >&2

log "kwok (sigs.k8s.io/kwok ${KWOK_VERSION})"
(cd "${HACK_DIR}/kwok" && "${NICE[@]}" go build -trimpath -ldflags="${KWOK_LDFLAGS}" -o "${STAGE}/bin/kwok" \
  sigs.k8s.io/kwok/cmd/kwok) >&2

build_helm "${STAGE}"
build_kubelet "${STAGE}"

kwok_src="$(cd "${HACK_DIR}/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
for f in "${KWOK_STAGES[@]}"; do
  echo "---"
  echo "# from sigs.k8s.io/kwok@${KWOK_VERSION}/${f}"
  cat "${kwok_src}/${f}"
done >"${STAGE}/${STAGES_FILE}"

for b in "${BINARIES[@]}" helm kubelet; do
  if [[ ! -x "${STAGE}/bin/${b}" ]]; then
    log "ERROR: ${b} was not produced"
    exit 1
  fi
done

# Publish atomically: a half-finished build is never mistaken for a complete one.
rm -rf "${OUT_DIR}"
mv "${STAGE}" "${OUT_DIR}"
trap - EXIT
log "done in $((SECONDS - start))s"
echo "${BIN_DIR}"
