#!/usr/bin/env bash
# Builds the two container images the real-kubelet tests (tests/kubelet) need, without any registry:
#   registry.k8s.io/pause:<PAUSE_VERSION>   the pod sandbox, from the upstream source build/pause/linux/pause.c of
#                                           the pinned k8s.io/kubernetes module (hack/controlplane), gcc -static
#   gpusched.test/busybox:<busybox version> test containers: Debian's busybox-static (/bin/busybox) and its
#                                           applet links (sh, env, sleep, ...)
# as docker-archive tarballs (what `docker save` writes; `ctr -n k8s.io images import FILE` reads them), into a
# cache outside the repository keyed by the versions:
#   ${GPUSCHED_CACHE:-$HOME/.cache/gpusched}/node-images/pause-<v>_k8s-<v>_busybox-<debian version>/
#     pause.tar busybox.tar images.env (PAUSE_IMAGE=..., BUSYBOX_IMAGE=...)
#
# Idempotent (nothing is rebuilt when the tarballs are there). Needs gcc, busybox-static, python3 and the
# k8s.io/kubernetes module source (in the Go module cache once hack/build-control-plane.sh built the kubelet;
# `go mod download` fetches it otherwise).
# The last line on stdout is always the output directory; everything else goes to stderr.
# Exit codes: 0 ok, 2 a tool is missing, other non-zero: the build failed.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# The pause image tag kubelet 1.37 pins (cmd/kubeadm/app/constants, the kubelet's --pod-infra-container-image default).
PAUSE_VERSION="3.10"

log() { echo "build-node-images: $*" >&2; }

K8S_VERSION="$(awk '($1 == "k8s.io/kubernetes") { print $2; exit }' "${HACK_DIR}/controlplane/go.mod")"
if [[ -z "${K8S_VERSION}" ]]; then
  log "cannot find the version of k8s.io/kubernetes in hack/controlplane/go.mod"
  exit 1
fi
BUSYBOX="$(command -v busybox || true)"
if [[ ! -x /bin/busybox ]] || ! /bin/busybox --list-full >/dev/null 2>&1; then
  log "ERROR: /bin/busybox (Debian package busybox-static) is missing: apt-get install -y busybox-static"
  exit 2
fi
if ! file_out="$(LC_ALL=C ldd /bin/busybox 2>&1)"; [[ "${file_out}" != *"not a dynamic executable"* ]]; then
  log "ERROR: /bin/busybox is not static (${BUSYBOX}): install Debian's busybox-static, not busybox"
  exit 2
fi
BUSYBOX_VERSION="$(dpkg-query -W -f '${Version}' busybox-static 2>/dev/null || /bin/busybox 2>&1 | head -1 | awk '{print $2}')"
BUSYBOX_VERSION="${BUSYBOX_VERSION#*:}"  # no epoch
BUSYBOX_VERSION="${BUSYBOX_VERSION//[+~]/_}"
for tool in gcc python3; do
  if ! command -v "${tool}" >/dev/null 2>&1; then
    log "ERROR: ${tool} is missing (apt-get install -y ${tool})"
    exit 2
  fi
done

CACHE_ROOT="${GPUSCHED_CACHE:-${HOME}/.cache/gpusched}/node-images"
KEY="pause-${PAUSE_VERSION}_k8s-${K8S_VERSION}_busybox-${BUSYBOX_VERSION}"
OUT_DIR="${CACHE_ROOT}/${KEY}"

built() { [[ -s "${OUT_DIR}/pause.tar" && -s "${OUT_DIR}/busybox.tar" && -s "${OUT_DIR}/images.env" ]]; }
if built; then
  log "already built: ${OUT_DIR}"
  echo "${OUT_DIR}"
  exit 0
fi

# pause.c from the module source (the Go module cache holds it once anything in hack/controlplane was built).
PAUSE_C=""
if command -v go >/dev/null 2>&1; then
  modcache="$(go env GOMODCACHE)"
  PAUSE_C="${modcache}/k8s.io/kubernetes@${K8S_VERSION}/build/pause/linux/pause.c"
  if [[ ! -s "${PAUSE_C}" ]]; then
    (cd "${HACK_DIR}/controlplane" && GOFLAGS=-mod=mod go mod download k8s.io/kubernetes) >&2
  fi
fi
if [[ -z "${PAUSE_C}" || ! -s "${PAUSE_C}" ]]; then
  log "ERROR: k8s.io/kubernetes@${K8S_VERSION}/build/pause/linux/pause.c not found (needs Go and its module cache)"
  exit 2
fi

mkdir -p "${CACHE_ROOT}"
exec 9>"${CACHE_ROOT}/.${KEY}.lock"
flock 9
if built; then
  echo "${OUT_DIR}"
  exit 0
fi
STAGE="$(mktemp -d "${CACHE_ROOT}/.${KEY}.XXXXXX")"
trap 'rm -rf "${STAGE}"' EXIT

log "pause ${PAUSE_VERSION} from k8s.io/kubernetes@${K8S_VERSION}/build/pause/linux/pause.c"
gcc -Os -Wall -Werror -static -DVERSION="v${PAUSE_VERSION}-gpusched" -o "${STAGE}/pause" "${PAUSE_C}"
strip "${STAGE}/pause" 2>/dev/null || true

PAUSE_IMAGE="registry.k8s.io/pause:${PAUSE_VERSION}"
BUSYBOX_IMAGE="gpusched.test/busybox:${BUSYBOX_VERSION}"

log "images ${PAUSE_IMAGE} and ${BUSYBOX_IMAGE}"
python3 - "${STAGE}" "${PAUSE_IMAGE}" "${BUSYBOX_IMAGE}" <<'PY'
"""Two docker-archive tarballs (manifest.json, config, one layer each), byte-for-byte reproducible."""
import hashlib, io, json, subprocess, sys, tarfile
from pathlib import Path

stage, pause_image, busybox_image = Path(sys.argv[1]), sys.argv[2], sys.argv[3]

def info(name, kind=tarfile.REGTYPE, mode=0o755, size=0, link=""):
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.size, ti.linkname, ti.mtime, ti.uid, ti.gid = kind, mode, size, link, 0, 0, 0
    return ti

def layer(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for ti, data in entries:
            tar.addfile(ti, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()

def archive(path, tag, layer_bytes, config):
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    cfg = {"architecture": "amd64", "os": "linux", "config": config,
           "rootfs": {"type": "layers", "diff_ids": [diff_id]}, "created": "1970-01-01T00:00:00Z"}
    cfg_bytes = json.dumps(cfg, sort_keys=True).encode()
    cfg_name = hashlib.sha256(cfg_bytes).hexdigest() + ".json"
    layer_name = diff_id[len("sha256:"):] + "/layer.tar"
    manifest = json.dumps([{"Config": cfg_name, "RepoTags": [tag], "Layers": [layer_name]}]).encode()
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in ((cfg_name, cfg_bytes), (layer_name, layer_bytes), ("manifest.json", manifest)):
            if "/" in name:
                tar.addfile(info(name.split("/")[0], tarfile.DIRTYPE), None)
            tar.addfile(info(name, mode=0o644, size=len(data)), io.BytesIO(data))

pause = (stage / "pause").read_bytes()
archive(stage / "pause.tar", pause_image, layer([(info("pause", size=len(pause)), pause)]),
        {"Entrypoint": ["/pause"], "User": "65535:65535"})

bb = Path("/bin/busybox").read_bytes()
applets = subprocess.run(["/bin/busybox", "--list-full"], capture_output=True, text=True, check=True).stdout.split()
dirs = sorted({"bin", "sbin", "usr", "usr/bin", "usr/sbin", "tmp", "etc", "proc", "sys", "dev", "root"})
entries = [(info(d, tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755), None) for d in dirs]
entries.append((info("bin/busybox", size=len(bb)), bb))
for a in sorted(set(applets)):
    if a != "bin/busybox":
        entries.append((info(a, tarfile.SYMTYPE, 0o777, link="/bin/busybox"), None))
passwd = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
entries.append((info("etc/passwd", mode=0o644, size=len(passwd)), passwd))
archive(stage / "busybox.tar", busybox_image, layer(entries),
        {"Cmd": ["/bin/sh"], "Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]})
PY

printf 'PAUSE_IMAGE=%s\nBUSYBOX_IMAGE=%s\n' "${PAUSE_IMAGE}" "${BUSYBOX_IMAGE}" >"${STAGE}/images.env"
rm -f "${STAGE}/pause"
chmod 755 "${STAGE}"
rm -rf "${OUT_DIR}"
mv "${STAGE}" "${OUT_DIR}"
trap - EXIT
log "done: ${OUT_DIR}"
echo "${OUT_DIR}"
