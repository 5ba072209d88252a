"""The schedulers of ``bench k8s --compare``, each started as its own process, as users start them.

- ``kube_scheduler``: the kube-scheduler binary of the control plane with a
  KubeSchedulerConfiguration of one profile (``schedulerName``), at the shipped client limits
  (``qps=None``: QPS 50, burst 100) or with ``clientConnection.qps/burst`` lifted, optionally
  calling the gpusched extender (``deploy/extender/scheduler-config.yaml``'s extender stanza);
- ``gpusched_scheduler``: ``python -m gpusched.cli scheduler``;
- ``gpusched_extender``: ``python -m gpusched.cli extender``.

None elects a leader: on a saturated machine a Lease renewal that times out makes kube-scheduler
exit (and gpusched stop deciding) in the middle of a run. Every one logs to a file in ``log_dir`` and is
stopped with SIGTERM (SIGKILL after a grace period) when its ``with`` block ends. The Python
processes inherit this process's environment (``PYTHONPATH`` included), so they run the same
gpusched as the benchmark.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from gpusched.core.errors import GpuschedError
from gpusched.testenv import ControlPlane, free_port, wait_until
from gpusched.testenv.controlplane import stop_process

EXTENDER_CONFIG = Path(__file__).resolve().parents[3] / "deploy" / "extender" / "scheduler-config.yaml"
LIFTED_QPS = 5000
"""kube-scheduler's ``clientConnection.qps`` and ``burst`` when its client limit is lifted."""


class SchedulerProcessError(GpuschedError):
    """A scheduler of the comparison exited or never became ready."""


class SchedulerProcess:
    """A started scheduler process: ``alive()`` raises with its log tail once it has exited."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log: Path) -> None:
        self.name, self.popen, self.log = name, popen, log
        self.metrics_url: str | None = None
        """Its Prometheus endpoint, where the benchmark reads what it served (the extender's)."""

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def alive(self) -> bool:
        code = self.popen.poll()
        if code is not None:
            raise SchedulerProcessError(f"{self.name} exited with {code}; log tail:\n{self.log_tail()}")
        return True

    def stop(self) -> None:
        stop_process(self.popen, signal.SIGTERM, 15.0)


def _popen(cmd: list[str], log: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        out.write(f"$ {' '.join(cmd)}\n".encode())
        out.flush()
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
        )


@contextlib.contextmanager
def _spawned(
    name: str,
    cmd: list[str],
    log_dir: Path,
    profile_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[SchedulerProcess]:
    """``cmd`` as a process logging to ``log_dir``; with ``profile_dir``, py-spy samples it
    (collapsed stacks, ``<profile_dir>/<name>.txt``) until the block ends."""
    log_dir.mkdir(parents=True, exist_ok=True)
    proc = SchedulerProcess(name, _popen(cmd, log_dir / f"{name}.log", env), log_dir / f"{name}.log")
    spy = None
    if profile_dir is not None:
        if shutil.which("py-spy") is None:
            proc.stop()
            raise SchedulerProcessError("profiling needs py-spy (pip install -e '.[dev]')")
        profile_dir.mkdir(parents=True, exist_ok=True)
        spy_cmd = ["py-spy", "record", "--format", "raw", "--rate", "100", "--nonblocking", "--gil",
                   "--pid", str(proc.popen.pid), "--output", str(profile_dir / f"{name}.txt")]  # fmt: skip
        spy = _popen(spy_cmd, log_dir / f"{name}-py-spy.log")
    try:
        yield proc
    finally:
        if spy is not None:
            stop_process(spy, signal.SIGINT, 30.0)  # py-spy writes its profile on SIGINT
        proc.stop()


def _extender_stanza(url: str) -> dict[str, Any]:
    if not EXTENDER_CONFIG.is_file():
        raise SchedulerProcessError(
            f"the extender's KubeSchedulerConfiguration is not at {EXTENDER_CONFIG}: run from the repository"
        )
    config = yaml.safe_load(EXTENDER_CONFIG.read_text())
    ext = dict(config["extenders"][0])
    ext["urlPrefix"] = url
    return ext


def kube_scheduler_config(
    kubeconfig: Path,
    scheduler_name: str,
    *,
    qps: int | None,
    extender_url: str | None = None,
) -> dict[str, Any]:
    """A KubeSchedulerConfiguration: one profile ``scheduler_name``, no leader election, the
    client limit lifted to ``qps`` (None: the defaults),
    and the gpusched extender at ``extender_url`` (None: none)."""
    client: dict[str, Any] = {"kubeconfig": str(kubeconfig)}
    if qps is not None:
        client.update(qps=qps, burst=qps)
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": client,
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": scheduler_name}],
    }
    if extender_url is not None:
        config["extenders"] = [_extender_stanza(extender_url)]
    return config


@contextlib.contextmanager
def kube_scheduler(
    cp: ControlPlane, name: str, config: Mapping[str, Any], log_dir: Path, feature_gates: str = ""
) -> Iterator[SchedulerProcess]:
    """The control plane's kube-scheduler binary with ``config`` (and ``--feature-gates``, when
    given), until the block ends."""
    path = log_dir / f"{name}-config.json"
    log_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2))
    kubeconfig = str(cp.kubeconfig_path)
    cmd = [
        str(cp.bin_dir / "kube-scheduler"),
        f"--config={path}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={free_port()}",
        f"--cert-dir={log_dir / (name + '-certs')}",
        "--v=1",
        *([f"--feature-gates={feature_gates}"] if feature_gates else []),
    ]
    with _spawned(name, cmd, log_dir) as proc:
        yield proc


def _python(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpusched.cli", *args]


@contextlib.contextmanager
def gpusched_scheduler(
    cp: ControlPlane,
    name: str,
    scheduler_name: str,
    log_dir: Path,
    profile_dir: Path | None = None,
    source: Path | None = None,
) -> Iterator[SchedulerProcess]:
    """``gpusched scheduler`` for pods of ``scheduler_name``, without leader election;
    from the ``source`` folder (``PYTHONPATH``) when given, else this process's gpusched."""
    cmd = _python(
        "scheduler", "--kubeconfig", str(cp.kubeconfig_path), "--scheduler-name", scheduler_name,
        "--port", str(free_port()), "--no-leader-elect", "--log-level", "WARNING",
    )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(source)} if source is not None else None
    with _spawned(name, cmd, log_dir, profile_dir, env) as proc:
        yield proc


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False


@contextlib.contextmanager
def gpusched_extender(
    cp: ControlPlane,
    name: str,
    log_dir: Path,
    profile_dir: Path | None = None,
    timeout_s: float = 120.0,
    pick: bool = True,
    event_loop: str = "uvloop",
    source: Path | None = None,
) -> Iterator[tuple[SchedulerProcess, str]]:
    """``gpusched extender`` on a loopback port; yields it and its URL once it answers ``/readyz``.
    ``pick``: its ``/filter`` picks the node (the default), else ``--no-pick-in-filter``;
    ``event_loop``: its ``--event-loop``; ``source``: as for ``gpusched_scheduler``."""
    port = free_port()
    cmd = _python(
        "extender", "--kubeconfig", str(cp.kubeconfig_path), "--host", "127.0.0.1", "--port", str(port),
        "--policy", "default", "--log-level", "warning",
        "--pick-in-filter" if pick else "--no-pick-in-filter", "--event-loop", event_loop,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(source)} if source is not None else None
    with _spawned(name, cmd, log_dir, profile_dir, env) as proc:
        proc.metrics_url = f"{url}/metrics"
        wait_until(lambda: proc.alive() and _ready(f"{url}/readyz"), timeout=timeout_s,
                   what=f"{name} to be ready", control_plane=cp)  # fmt: skip
        yield proc, url


EXTENDER_REQUESTS = "gpusched_extender_request_duration_seconds"


def request_counts(exposition: str) -> dict[str, int]:
    """Requests an extender served, by verb (``filter``, ``bind``, ...), from its ``/metrics``
    text (the count of its request-duration histogram). kube-scheduler sends one ``/filter``
    per scheduling attempt and one ``/bind`` per binding: more than one of each per pod means
    that pods were retried."""
    from prometheus_client.parser import text_string_to_metric_families

    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(exposition):
        if family.name == EXTENDER_REQUESTS:
            for sample in family.samples:
                if sample.name == f"{EXTENDER_REQUESTS}_count":
                    counts[sample.labels["verb"]] = int(sample.value)
    return counts


def served_requests(metrics_url: str) -> dict[str, int] | None:
    """``request_counts`` of the process serving ``metrics_url``; None if it does not answer."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=10) as r:
            return request_counts(r.read().decode())
    except (OSError, urllib.error.URLError, ValueError):
        return None
