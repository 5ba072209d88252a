"""Kueue's controller manager beside the test control plane ("behind Kueue": tests/e2e/test_kueue_e2e.py).

``hack/build-kueue.sh`` builds ``sigs.k8s.io/kueue/cmd/kueue`` from its Go module and copies the module's
published CRDs (``config/components/crd/bases``) into a cache keyed by version; ``$GPUSCHED_KUEUE`` (set by
``.ci/run``) names that directory and skips the script. ``install_kueue_crds`` applies the CRDs;
``KueueManager`` runs the controller manager as a local process:

* its webhook server is not registered with the apiserver (the apiserver cannot reach an in-cluster
  Service here), so Jobs must be created with ``spec.suspend: true`` — what Kueue's defaulting webhook
  would have set; the webhook server still listens, on loopback, with a certificate from the control
  plane's CA (Kueue's internal cert management is off: it would wait for webhook configurations);
* only the ``batch/job`` integration, leader election off, the on-demand visibility API server off,
  health and metrics on free loopback ports.

Kueue reads its metrics certificate from the fixed path ``/etc/kueue/metrics/certs`` (where its Deployment
mounts a Secret) whenever internal cert management is off; ``KueueManager`` writes a self-signed one there if
none is present, and refuses clearly when that path is not writable.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

from gpusched.testenv.binaries import BinariesUnavailableError, ControlPlaneError, run_build_script
from gpusched.testenv.controlplane import ControlPlane, free_port, stop_process
from gpusched.testenv.pki import issue_certificate

ENV_KUEUE = "GPUSCHED_KUEUE"
#: Where Kueue (with internal cert management off) reads the certificate of its metrics server.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
KUEUE_NAMESPACE = "kueue-system"
_SCRIPT = Path("hack") / "build-kueue.sh"
_CRD_GLOB = "kueue.x-k8s.io_*.yaml"


class KueueError(ControlPlaneError):
    """Kueue's controller manager could not be started or did not become healthy."""


@dataclass(frozen=True)
class KueueBuild:
    """A built Kueue: its controller manager and its published CRDs."""

    binary: Path
    crds: tuple[Path, ...]


def _check(directory: Path, origin: str) -> KueueBuild:
    binary = directory / "bin" / "kueue"
    crds = tuple(sorted((directory / "crds").glob(_CRD_GLOB)))
    if not os.access(binary, os.X_OK) or not any(p.name == "kueue.x-k8s.io_workloads.yaml" for p in crds):
        raise BinariesUnavailableError(f"{origin}: {directory} lacks bin/kueue or crds/{_CRD_GLOB}")
    return KueueBuild(binary, crds)


def find_kueue(timeout: float = 3600.0) -> KueueBuild:
    """Kueue's build directory (``$GPUSCHED_KUEUE``, else ``hack/build-kueue.sh``, cached by version)."""
    env_dir = os.environ.get(ENV_KUEUE)
    if env_dir:
        return _check(Path(env_dir).expanduser().resolve(), f"${ENV_KUEUE}")
    script = next((p / _SCRIPT for p in Path(__file__).resolve().parents if (p / _SCRIPT).is_file()), None)
    if script is None:
        raise BinariesUnavailableError(f"no {_SCRIPT} in a parent of this checkout: set ${ENV_KUEUE}")
    return _check(run_build_script(script, timeout, tail_lines=15), str(script))


def install_kueue_crds(cp: ControlPlane, build: KueueBuild) -> None:
    """Apply Kueue's CRDs (server-side, idempotent) and wait until the API server serves them."""
    args: list[str] = []
    for crd in build.crds:
        args += ["-f", str(crd)]
    cp.kubectl("apply", "--server-side", "--force-conflicts", *args)
    names = [f"crd/{p.name.removesuffix('.yaml').split('_', 1)[1]}.kueue.x-k8s.io" for p in build.crds]
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)


def _ensure_metrics_cert(cp: ControlPlane) -> None:
    """A certificate and key at ``METRICS_CERT_DIR`` (kept if there; written under a lock, since parallel
    test workers each start a Kueue and a half-written pair would stop theirs)."""
    crt, key = METRICS_CERT_DIR / "tls.crt", METRICS_CERT_DIR / "tls.key"
    try:
        METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
        with (METRICS_CERT_DIR.parent / ".gpusched.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if crt.is_file() and key.is_file():
                return
            ident = issue_certificate(
                cp.pki, "kueue-metrics", cn="kueue-metrics", server=True, ips=("127.0.0.1",)
            )
            key.write_bytes(ident.key.read_bytes())
            key.chmod(0o600)
            crt.write_bytes(ident.cert.read_bytes())
    except OSError as exc:
        raise KueueError(
            f"Kueue reads its metrics certificate from {METRICS_CERT_DIR} (fixed in its code when internal "
            f"cert management is off) and that path cannot be written: {exc}"
        ) from exc


def kueue_configuration(
    health_port: int, metrics_port: int, webhook_port: int, cert_dir: Path
) -> dict[str, object]:
    """The Configuration (config.kueue.x-k8s.io/v1beta2) this test environment runs Kueue with."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["batch/job"]},
        "featureGates": {"VisibilityOnDemand": False},
    }


class KueueManager:
    """Kueue's controller manager as a local process against ``cp`` (admin credentials), in its workdir.

    A context manager: ``__enter__`` starts it and waits for ``/readyz``; ``__exit__`` stops it."""

    def __init__(self, cp: ControlPlane, build: KueueBuild, *, startup_timeout: float = 120.0) -> None:
        self.cp = cp
        self.build = build
        self.startup_timeout = startup_timeout
        self.dir = cp.workdir / "kueue"
        self.log_path = self.dir / "kueue.log"
        self.health_port = 0
        self._popen: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def __enter__(self) -> KueueManager:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def start(self) -> None:
        if self._popen is not None:
            raise KueueError("Kueue is already started")
        _ensure_metrics_cert(self.cp)
        self.dir.mkdir(parents=True, exist_ok=True)
        certs = self.dir / "webhook-certs"
        certs.mkdir(exist_ok=True)
        ident = issue_certificate(self.cp.pki, "kueue-webhook", cn="kueue-webhook", server=True,
                                  ips=("127.0.0.1",))  # fmt: skip
        (certs / "tls.crt").write_bytes(ident.cert.read_bytes())
        (certs / "tls.key").write_bytes(ident.key.read_bytes())
        self.cp.kubectl("create", "namespace", KUEUE_NAMESPACE, check=False)
        self.health_port = free_port()
        config = kueue_configuration(self.health_port, free_port(), free_port(), certs)
        config_path = self.dir / "config.json"
        config_path.write_text(json.dumps(config, indent=2))
        self._log = self.log_path.open("ab")
        self._popen = subprocess.Popen(
            [str(self.build.binary), f"--config={config_path}", "--zap-log-level=2"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.dir,
            env={**os.environ, "KUBECONFIG": str(self.cp.kubeconfig_path)}, start_new_session=True,
        )  # fmt: skip
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        while True:
            self.check_alive()
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
            if time.monotonic() > deadline:
                raise KueueError(
                    f"Kueue not ready after {self.startup_timeout:.0f}s; log tail:\n{self.log_tail()}"
                )
            time.sleep(0.3)

    def check_alive(self) -> None:
        """Raise ``KueueError`` (with its log's tail) if the process has exited."""
        if self._popen is not None and self._popen.poll() is not None:
            raise KueueError(f"Kueue exited with code {self._popen.returncode}; log tail:\n{self.log_tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        if self._popen is not None:
            stop_process(self._popen, signal.SIGTERM, timeout, group=True)
            self._popen = None
        if self._log is not None:
            self._log.close()
            self._log = None
