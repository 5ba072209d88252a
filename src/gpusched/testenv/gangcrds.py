"""The gang CRDs (coscheduling's and Volcano's PodGroup) for the control plane of tests and benchmarks.

``hack/build-gang-crds.sh`` extracts them from their Go modules into a cache keyed by version;
``$GPUSCHED_GANG_CRDS`` (set by ``.ci/run``) names that directory and skips the script.
``install_gang_crds`` applies them with the control plane's kubectl and waits until they are served.
Kubernetes' own ``scheduling.k8s.io/v1beta1`` PodGroup is built in (the control plane turns on its
feature gate).
"""

from __future__ import annotations

import os
from pathlib import Path

from gpusched.testenv.binaries import BinariesUnavailableError, run_build_script
from gpusched.testenv.controlplane import ControlPlane

ENV_GANG_CRDS = "GPUSCHED_GANG_CRDS"
GANG_CRD_FILES = ("scheduling.x-k8s.io_podgroups.yaml", "scheduling.volcano.sh_podgroups.yaml")
GANG_CRD_NAMES = ("podgroups.scheduling.x-k8s.io", "podgroups.scheduling.volcano.sh")
_SCRIPT = Path("hack") / "build-gang-crds.sh"


def _check(directory: Path, origin: str) -> Path:
    missing = [f for f in GANG_CRD_FILES if not (directory / f).is_file()]
    if missing:
        raise BinariesUnavailableError(f"{origin}: {directory} lacks {', '.join(missing)}")
    return directory


def find_gang_crds(timeout: float = 1800.0) -> Path:
    """The directory holding the gang CRDs (``$GPUSCHED_GANG_CRDS``, else the hack script, cached)."""
    env_dir = os.environ.get(ENV_GANG_CRDS)
    if env_dir:
        return _check(Path(env_dir).expanduser().resolve(), f"${ENV_GANG_CRDS}")
    script = next((p / _SCRIPT for p in Path(__file__).resolve().parents if (p / _SCRIPT).is_file()), None)
    if script is None:
        raise BinariesUnavailableError(f"no {_SCRIPT} in a parent of this checkout: set ${ENV_GANG_CRDS}")
    return _check(run_build_script(script, timeout, tail_lines=15), str(script))


def install_gang_crds(cp: ControlPlane, directory: Path) -> None:
    """Apply the gang CRDs (server-side, idempotent) and wait until the API server serves them."""
    for f in GANG_CRD_FILES:
        cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(directory / f))
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{n}" for n in GANG_CRD_NAMES))
