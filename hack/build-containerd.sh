#!/usr/bin/env bash
# Fetches a containerd with CDI support in its CRI plugin (containerd >= 1.7, `enable_cdi`) for the real-kubelet
# tests of gpusched's DRA driver (tests/kubelet/test_dra_node.py): bookworm's containerd is 1.6.20, which has no
# CDI in CRI, so the kubelet's CDI device IDs would never reach the container.
#
# The binaries come from Debian trixie's containerd package (pinned below; it needs libc6 >= 2.34, bookworm has
# 2.36, and runc, which bookworm's package provides). apt fetches the .deb with a private source list and
# private package lists under the cache (the machine's apt sources and installed containerd are not touched),
# and `dpkg-deb -x` unpacks it into a cache outside the repository keyed by the version:
#   ${GPUSCHED_CACHE:-$HOME/.cache/gpusched}/containerd/<version>/usr/bin/{containerd,containerd-shim-runc-v2,ctr}
# testenv (gpusched.testenv.node) uses it when $GPUSCHED_CONTAINERD_BIN names that bin directory.
#
# Idempotent (nothing is fetched when the binaries are there). The last line on stdout is always the bin
# directory; everything else goes to stderr. Exit codes: 0 ok, 2 a tool is missing, other: the fetch failed.
set -euo pipefail

CONTAINERD_VERSION="1.7.24~ds1-6+deb13u1"
SUITE="trixie"
CACHE="${GPUSCHED_CACHE:-$HOME/.cache/gpusched}/containerd"
OUT="${CACHE}/${CONTAINERD_VERSION}"

log() { echo "build-containerd: $*" >&2; }

if [[ -x "${OUT}/usr/bin/containerd" && -x "${OUT}/usr/bin/containerd-shim-runc-v2" ]]; then
  log "already there: ${OUT}/usr/bin"
  echo "${OUT}/usr/bin"
  exit 0
fi
for tool in apt-get dpkg-deb; do
  command -v "${tool}" >/dev/null || { log "ERROR: no ${tool} (a Debian machine is needed)"; exit 2; }
done
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
[[ -f "${KEYRING}" ]] || { log "ERROR: ${KEYRING} is missing (apt-get install -y debian-archive-keyring)"; exit 2; }

apt_dir="${CACHE}/apt"
mkdir -p "${apt_dir}/lists/partial" "${apt_dir}/archives/partial"
echo "deb [signed-by=${KEYRING}] http://deb.debian.org/debian ${SUITE} main" > "${apt_dir}/sources.list"
APT_OPTS=(
  -o "Dir::Etc::SourceList=${apt_dir}/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
  -o "Dir::State::Lists=${apt_dir}/lists" -o "Dir::Cache=${apt_dir}" -o "Dir::Cache::archives=${apt_dir}/archives"
  -o "APT::Sandbox::User=root" -o "Debug::NoLocking=1"
)
log "fetching containerd ${CONTAINERD_VERSION} from Debian ${SUITE}"
apt-get "${APT_OPTS[@]}" -qq update >&2
tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT
(cd "${tmp}" && apt-get "${APT_OPTS[@]}" -qq download "containerd=${CONTAINERD_VERSION}" >&2)
deb="$(ls "${tmp}"/containerd_*.deb)"
mkdir -p "${tmp}/root"
dpkg-deb -x "${deb}" "${tmp}/root"
"${tmp}/root/usr/bin/containerd" --version >&2
rm -rf "${OUT}"
mkdir -p "${OUT}"
mv "${tmp}/root/usr" "${OUT}/usr"
rm -rf "${apt_dir}"  # the package lists (~15 MB) are not needed again
log "done: ${OUT}/usr/bin"
echo "${OUT}/usr/bin"
