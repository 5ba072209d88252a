#!/usr/bin/env bash
# Builds gpusched's container image without any container registry, as an OCI archive:
#   base layer  Debian ${SUITE}'s python3 (and its libraries), unpacked by mmdebstrap --variant=extract from Debian's
#               package mirror: no shell, no apt, no docs
#   app layer   gpusched's wheel (built from this tree) and its pinned dependencies, wheels from PyPI, installed
#               into /usr/local by pip run with the image's own python3 (in a chroot); /etc/passwd with user 10001
# The image has the root Dockerfile's entry point, user, working directory, environment and ports.
#
# Output, in a cache outside the repository keyed by the content that goes in (this script, pyproject.toml, src/,
# the Debian suite and packages, the image name):
#   ${GPUSCHED_CACHE:-$HOME/.cache/gpusched}/image/<key>/
#     gpusched-image.tar   an OCI image layout (index.json, blobs/): `ctr -n k8s.io images import FILE`,
#                          `kind load image-archive FILE`, `skopeo copy oci-archive:FILE docker://REGISTRY/...`
#                          read it; docker's manifest.json is beside it for `docker load` (not tried here)
#     image.env            IMAGE=<name:tag>, DIGEST=<manifest digest>, SIZE_BYTES=<archive size>
# The last line on stdout is always the archive's path; everything else goes to stderr.
# Idempotent (a no-op once built), serialised with flock. The dependency wheels are kept under image/wheels/.
#
#   GPUSCHED_IMAGE          the image name (default ghcr.io/gpusched/gpusched:<version in pyproject.toml>)
#   GPUSCHED_DEBIAN_MIRROR  the Debian mirror (default http://deb.debian.org/debian)
#
# Needs root (mmdebstrap's root mode and chroot), mmdebstrap (apt-get install -y mmdebstrap), python3 with pip and
# setuptools on the host, and PyPI. Exit codes: 0 ok, 2 a tool is missing, other non-zero: the build failed.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "${HACK_DIR}/.." && pwd)"
SUITE="bookworm"
# python3 pulls libc6, libssl3, libffi, zlib, libexpat, ...; libstdc++6 and libgcc-s1 for grpcio's and numpy's wheels;
# python-is-python3 for the manifests' `python -m gpusched...`.
PACKAGES="python3,python-is-python3,libstdc++6,libgcc-s1"
PIP_VERSION="24.3.1"  # runs inside the chroot from its wheel; not left in the image
MIRROR="${GPUSCHED_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

log() { echo "build-image: $*" >&2; }

VERSION="$(awk -F'"' '/^version = / { print $2; exit }' "${REPO}/pyproject.toml")"
IMAGE="${GPUSCHED_IMAGE:-ghcr.io/gpusched/gpusched:${VERSION}}"

if [[ "$(id -u)" != 0 ]]; then
  log "ERROR: needs root (mmdebstrap's root mode and chroot)"
  exit 2
fi
if ! command -v mmdebstrap >/dev/null 2>&1; then
  log "ERROR: mmdebstrap is missing: apt-get install -y mmdebstrap"
  exit 2
fi
if ! python3 -m pip --version >/dev/null 2>&1 || ! python3 -c 'import setuptools' >/dev/null 2>&1; then
  log "ERROR: python3 with pip and setuptools is needed on the host"
  exit 2
fi

CACHE_ROOT="${GPUSCHED_CACHE:-${HOME}/.cache/gpusched}/image"
KEY="$(
  cd "${REPO}"
  {
    printf '%s\n' "${SUITE}" "${PACKAGES}" "${PIP_VERSION}" "${IMAGE}"
    sha256sum hack/build-image.sh pyproject.toml
    find src -type f ! -name '*.pyc' ! -path '*/__pycache__/*' ! -path '*.egg-info/*' -print0 | LC_ALL=C sort -z \
      | xargs -0 sha256sum
  } | sha256sum | cut -c1-16
)"
OUT_DIR="${CACHE_ROOT}/${KEY}"
ARCHIVE="${OUT_DIR}/gpusched-image.tar"

built() { [[ -s "${ARCHIVE}" && -s "${OUT_DIR}/image.env" ]]; }
if built; then
  log "already built: ${IMAGE} (${OUT_DIR})"
  echo "${ARCHIVE}"
  exit 0
fi

mkdir -p "${CACHE_ROOT}/wheels"
exec 9>"${CACHE_ROOT}/.${KEY}.lock"
flock 9
if built; then
  echo "${ARCHIVE}"
  exit 0
fi
STAGE="$(mktemp -d "${CACHE_ROOT}/.${KEY}.XXXXXX")"
cleanup() {
  # the chroot's /proc, if pip's run left it mounted
  mountpoint -q "${STAGE}/root/proc" 2>/dev/null && umount -l "${STAGE}/root/proc"
  rm -rf "${STAGE}"
}
trap cleanup EXIT
start=${SECONDS}

log "gpusched ${VERSION}: the wheel"
mkdir -p "${STAGE}/src" "${STAGE}/dist"
cp -r "${REPO}/pyproject.toml" "${REPO}/README.md" "${STAGE}/src/"
(cd "${REPO}" && tar -cf - --exclude='__pycache__' --exclude='*.pyc' --exclude='*.egg-info' src) | tar -xf - -C "${STAGE}/src"
python3 -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation -w "${STAGE}/dist" \
  "${STAGE}/src" >&2
WHEEL="$(ls "${STAGE}"/dist/gpusched-*.whl)"

log "dependency wheels from PyPI (CPython 3.11, manylinux x86_64; cached in ${CACHE_ROOT}/wheels)"
# bookworm has glibc 2.36: every manylinux wheel up to 2_36 runs on it
platforms=()
for minor in $(seq 36 -1 5); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
  "${platforms[@]}" --platform manylinux2014_x86_64 --python-version 3.11 --implementation cp --abi cp311 \
  -d "${CACHE_ROOT}/wheels" "${WHEEL}" "pip==${PIP_VERSION}" >&2
rm -f "${CACHE_ROOT}"/wheels/gpusched-*.whl  # pip download copies the requirement itself there too

log "Debian ${SUITE} base (${PACKAGES}) from ${MIRROR}"
SOURCE_DATE_EPOCH="$(git -C "${REPO}" log -1 --format=%ct 2>/dev/null || echo 0)"
export SOURCE_DATE_EPOCH
mmdebstrap --quiet --variant=extract --include="${PACKAGES}" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/lintian/*' \
  "${SUITE}" "${STAGE}/root" "${MIRROR}" >&2
# what the extract variant leaves that a runtime image has no use for
rm -rf "${STAGE}/root/var/cache/apt" "${STAGE}/root/var/lib/apt/lists" "${STAGE}/root/var/log"/*

log "installing gpusched and its dependencies into /usr/local (pip ${PIP_VERSION} in the image's python3)"
mkdir -p "${STAGE}/root/wheels" "${STAGE}/root/proc"
cp -l "${CACHE_ROOT}"/wheels/*.whl "${STAGE}/root/wheels/"  # the stage is beside the cache: hard links
cp "${WHEEL}" "${STAGE}/root/wheels/"
mount -t proc proc "${STAGE}/root/proc"
# a clean environment (no PIP_* of the host); Debian's python3 installs into /usr/local by default
CHROOT="$(command -v chroot)"
in_root() { env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root "${CHROOT}" "${STAGE}/root" "$@"; }
in_root /usr/bin/python3 "/wheels/pip-${PIP_VERSION}-py3-none-any.whl/pip" install \
  --quiet --no-index --find-links /wheels --no-cache-dir --disable-pip-version-check --break-system-packages \
  --root-user-action=ignore "/wheels/$(basename "${WHEEL}")" >&2
umount "${STAGE}/root/proc"
rm -rf "${STAGE}/root/wheels"
in_root /usr/local/bin/gpusched --help >/dev/null
in_root /usr/bin/python -c 'import gpusched.agent.run, gpusched.webhook, grpc' >&2

log "the OCI archive of ${IMAGE}"
python3 - "${STAGE}" "${IMAGE}" "${SOURCE_DATE_EPOCH}" <<'PY'
"""Two layers (the Debian base; /usr/local and the users), gzip, as an OCI image layout with docker's manifest.json
beside it, in one tar. Every mtime is clamped to SOURCE_DATE_EPOCH and the entries are sorted."""
import datetime as dt, gzip, hashlib, io, json, os, sys, tarfile
from pathlib import Path

stage, image, epoch = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
root = stage / "root"
APP = ("usr/local", "etc/passwd", "etc/group")
SKIP_UNDER = ("dev/", "proc/", "sys/", "run/", "tmp/")

def entries(top):
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        yield rel
        for f in sorted(filenames):
            yield os.path.normpath(os.path.join(rel, f))

def in_app(rel):
    return any(rel == a or rel.startswith(a + "/") for a in APP)

def layer(paths):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in paths:
            if rel == ".":
                continue
            ti = tar.gettarinfo(str(root / rel), arcname=rel)
            ti.mtime = min(int(ti.mtime), epoch)
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = ""
            if ti.isreg():
                with open(root / rel, "rb") as f:
                    tar.addfile(ti, f)
            else:
                tar.addfile(ti)
    data = raw.getvalue()
    diff_id = "sha256:" + hashlib.sha256(data).hexdigest()
    gz = gzip.compress(data, compresslevel=6, mtime=0)
    return diff_id, gz

(root / "etc/passwd").write_text("root:x:0:0:root:/root:/usr/sbin/nologin\n"
                                 "gpusched:x:10001:10001:gpusched:/nonexistent:/usr/sbin/nologin\n"
                                 "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
(root / "etc/group").write_text("root:x:0:\ngpusched:x:10001:\nnogroup:x:65534:\n")
for d in ("tmp", "run", "proc", "sys", "dev"):
    (root / d).mkdir(exist_ok=True)
(root / "tmp").chmod(0o1777)

base, app = [], []
for rel in entries(root):
    if any(rel.startswith(s) for s in SKIP_UNDER):
        continue  # the runtime mounts these; keep the directories only
    (app if in_app(rel) else base).append(rel)
# the parents of the app layer's files exist in the base layer (usr, etc)
layers = [layer(base), layer(app)]

blobs = {}
def blob(data):
    d = hashlib.sha256(data).hexdigest()
    blobs[d] = data
    return "sha256:" + d

config = {
    "architecture": "amd64",
    "os": "linux",
    "created": dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "config": {
        "User": "10001:10001",
        "WorkingDir": "/tmp",
        "Entrypoint": ["gpusched"],
        "Cmd": ["--help"],
        "Env": [
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "PYTHONDONTWRITEBYTECODE=1",
            "PYTHONUNBUFFERED=1",
            "MPLCONFIGDIR=/tmp/matplotlib",
        ],
        "ExposedPorts": {"8080/tcp": {}, "8888/tcp": {}},
        "Labels": {"org.opencontainers.image.title": "gpusched",
                   "org.opencontainers.image.version": image.rsplit(":", 1)[-1],
                   "org.opencontainers.image.base.name": "debian:bookworm (mmdebstrap, python3)"},
    },
    "rootfs": {"type": "layers", "diff_ids": [d for d, _ in layers]},
    "history": [{"created_by": "hack/build-image.sh: Debian base (mmdebstrap)"},
                {"created_by": "hack/build-image.sh: pip install gpusched"}],
}
cfg_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
manifest = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": blob(cfg_bytes),
               "size": len(cfg_bytes)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": blob(gz), "size": len(gz)}
               for _, gz in layers],
}
man_bytes = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
man_digest = blob(man_bytes)
index = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.index.v1+json",
    "manifests": [{"mediaType": manifest["mediaType"], "digest": man_digest, "size": len(man_bytes),
                   "annotations": {"io.containerd.image.name": image,
                                   "org.opencontainers.image.ref.name": image.rsplit(":", 1)[-1]}}],
}
docker = [{"Config": "blobs/sha256/" + manifest["config"]["digest"][7:], "RepoTags": [image],
           "Layers": ["blobs/sha256/" + l["digest"][7:] for l in manifest["layers"]]}]

def add(tar, name, data, mode=0o644):
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.mtime = len(data), mode, epoch
    tar.addfile(ti, io.BytesIO(data))

with tarfile.open(stage / "gpusched-image.tar", "w", format=tarfile.PAX_FORMAT) as tar:
    for d in ("blobs", "blobs/sha256"):
        ti = tarfile.TarInfo(d); ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, epoch
        tar.addfile(ti)
    for d in sorted(blobs):
        add(tar, "blobs/sha256/" + d, blobs[d])
    add(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    add(tar, "index.json", json.dumps(index, sort_keys=True).encode())
    add(tar, "manifest.json", json.dumps(docker).encode())
(stage / "digest").write_text(man_digest)
print(f"layers: base {len(layers[0][1]) / 2**20:.1f} MiB, app {len(layers[1][1]) / 2**20:.1f} MiB (gzip)",
      file=sys.stderr)
PY

size="$(stat -c %s "${STAGE}/gpusched-image.tar")"
printf 'IMAGE=%s\nDIGEST=%s\nSIZE_BYTES=%s\n' "${IMAGE}" "$(cat "${STAGE}/digest")" "${size}" >"${STAGE}/image.env"
mkdir -p "${OUT_DIR}"
mv "${STAGE}/gpusched-image.tar" "${STAGE}/image.env" "${OUT_DIR}/"
log "done in $((SECONDS - start)) s: ${IMAGE}, $((size / 1024 / 1024)) MiB compressed, $(cat "${STAGE}/digest")"
echo "${ARCHIVE}"
