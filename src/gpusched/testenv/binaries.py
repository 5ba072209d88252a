"""Control-plane binaries: from ``$GPUSCHED_CONTROLPLANE_BIN``, the cache, or the build script."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpusched.core.errors import GpuschedError

#: Environment variable naming a directory that holds all of ``BINARIES`` (skips the build script).
ENV_BIN_DIR = "GPUSCHED_CONTROLPLANE_BIN"
#: Keep the temporary directory (logs, certificates, kubeconfigs) after ``stop()`` when set to 1.
ENV_KEEP_WORKDIR = "GPUSCHED_CONTROLPLANE_KEEP"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl", "kwok")
#: Where the build script puts kwok's Stage objects, relative to the bin directory.
KWOK_STAGES_RELPATH = Path("..") / "share" / "kwok-stages.yaml"
_BUILD_SCRIPT = Path("hack") / "build-control-plane.sh"
_GO_MISSING_EXIT_CODE = 2



class ControlPlaneError(GpuschedError, RuntimeError):
    """The control plane could not be built, started or used."""


class BinariesUnavailableError(ControlPlaneError):
    """The control-plane binaries are not there and could not be built."""

    def __init__(self, message: str, *, go_missing: bool = False) -> None:
        super().__init__(message)
        self.go_missing = go_missing


# --------------------------------------------------------------------------------------------- binaries


def find_build_script(start: Path | None = None) -> Path | None:
    """``hack/build-control-plane.sh`` of the source checkout this module lives in, if any."""
    here = (start or Path(__file__)).resolve()
    for parent in here.parents:
        candidate = parent / _BUILD_SCRIPT
        if candidate.is_file():
            return candidate
    return None


def _check_bin_dir(bin_dir: Path, origin: str) -> Path:
    missing = [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]
    if missing:
        raise BinariesUnavailableError(f"{origin}: {bin_dir} lacks the executable(s) {', '.join(missing)}")
    return bin_dir


def find_binaries(*, build: bool = True, timeout: float = 3600.0) -> Path:
    """The directory holding every control-plane binary.

    ``$GPUSCHED_CONTROLPLANE_BIN`` wins; otherwise ``hack/build-control-plane.sh`` is run (a no-op when its
    cache is already populated; the first build takes many minutes). Raises ``BinariesUnavailableError`` (with
    ``go_missing`` set when the reason is that Go is not installed).
    """
    env_dir = os.environ.get(ENV_BIN_DIR)
    if env_dir:
        return _check_bin_dir(Path(env_dir).expanduser().resolve(), f"${ENV_BIN_DIR}")
    script = find_build_script()
    if script is None:
        raise BinariesUnavailableError(
            f"no {_BUILD_SCRIPT} above {Path(__file__).resolve().parent} (not a source checkout?): "
            f"set ${ENV_BIN_DIR} to a directory holding {', '.join(BINARIES)}"
        )
    if not build:
        raise BinariesUnavailableError(f"${ENV_BIN_DIR} is not set and building was not allowed")
    return _check_bin_dir(run_build_script(script, timeout), str(script))


def run_build_script(script: Path, timeout: float, *, tail_lines: int = 25) -> Path:
    """Runs a ``hack/build-*.sh`` script (a no-op when its cache is populated) and returns the directory
    it prints last. Raises ``BinariesUnavailableError`` naming the script: it timed out, failed (the tail
    of its stderr; ``go_missing`` when Go is not installed) or printed nothing."""
    try:
        proc = subprocess.run(
            ["bash", str(script)], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise BinariesUnavailableError(f"{script} did not finish within {timeout:.0f}s") from exc
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-tail_lines:])
        raise BinariesUnavailableError(
            f"{script} failed (exit {proc.returncode}):\n{tail}",
            go_missing=proc.returncode == _GO_MISSING_EXIT_CODE,
        )
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise BinariesUnavailableError(f"{script} printed no directory")
    return Path(lines[-1])


