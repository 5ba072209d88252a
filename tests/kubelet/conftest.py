"""Fixtures for the real-kubelet tests: one control plane (kube-scheduler with the gpusched extender profile,
the controller manager, no kwok), both gpusched front ends as processes (``gpusched scheduler`` and
``gpusched extender``), and one real node (``gpusched.testenv.RealNode``: containerd, runc, CNI, the
kubelet, gpusched's agent on fake GPUs), shared by the whole session. gpusched's mutating webhook
(``webhook``, registered as deploy/manifests/webhook/ registers it) joins the session at the first test that
asks for it. Each test gets its own namespace, and its pods are deleted (and gone from the node) before the
next test starts.

Without root, containerd, runc, the CNI plugins, the kubelet or the node images the tests are skipped, unless
``$CI`` is set: then they fail, so that CI can never pass by skipping them.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubeletlib import EXTENDER, EXTENDER_CONFIG, GPU_MODEL, GPU_UUIDS, SLOTS, STANDALONE, KubeletEnv, Ns

from gpusched.testenv import free_port, wait_until
from gpusched.testenv.node import NodeError, NodePartsMissingError, RealNode, find_node_images, missing_parts
from realparts import started, unavailable
from webhookfixture import Webhook


def _spawn(name: str, cmd: list[str], log: Path, procs: dict[str, subprocess.Popen[bytes]]) -> None:
    with log.open("ab") as out:
        procs[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.HTTPError):
        return False


@pytest.fixture(scope="session")
def kubelet_env(control_plane_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeletEnv]:
    try:
        from kubernetes import client
    except ImportError:
        unavailable("the 'kubernetes' Python client is not installed (pip install kubernetes==37.0.2)")
    missing = missing_parts(control_plane_bin)
    if missing:
        unavailable("the real node cannot run here: " + "; ".join(missing))
    try:
        images = find_node_images()
    except NodePartsMissingError as exc:
        unavailable(str(exc))

    ext_port, sched_port = free_port(), free_port()
    config = yaml.safe_load(EXTENDER_CONFIG.read_text())
    config["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{ext_port}"
    tmp = tmp_path_factory.mktemp("kubelet")
    # no kwok: it would take the real Node over
    with started(control_plane_bin, scheduler_config=config, controller_manager=True, kwok=False) as cp:
        gpus = [{"model": GPU_MODEL, "uuid": u, "numaNode": 0} for u in GPU_UUIDS]
        node = RealNode(cp, gpus, images_dir=images, slots=SLOTS)
        env = KubeletEnv(cp, node, client.CoreV1Api(cp.api_client()))
        env.logs = {"extender": tmp / "extender.log", "scheduler": tmp / "scheduler.log"}
        kubeconfig = str(cp.kubeconfig_path)
        # the `gpusched` command (its console-script entry point), run by this interpreter
        main = "import sys; from gpusched.cli import main; sys.argv[0] = 'gpusched'; main()"
        gpusched = [sys.executable, "-c", main]
        extender = ["extender", "--kubeconfig", kubeconfig, "--host", "127.0.0.1", "--port", str(ext_port),
                    "--policy", "default"]  # fmt: skip
        scheduler = ["scheduler", "--kubeconfig", kubeconfig, "--scheduler-name", STANDALONE,
                     "--namespace", "default", "--lease-name", "gpusched-kubelet-e2e",
                     "--port", str(sched_port), "--flush-s", "2"]  # fmt: skip
        try:
            _spawn("extender", [*gpusched, *extender], env.logs["extender"], env.procs)
            _spawn("scheduler", [*gpusched, *scheduler], env.logs["scheduler"], env.procs)
            try:
                node.start()
            except NodeError as exc:
                pytest.fail(f"the real node did not start: {exc}", pytrace=False)
            for name, port in (("extender", ext_port), ("scheduler", sched_port)):
                url = f"http://127.0.0.1:{port}/readyz"
                ready = lambda url=url: env.check_alive() or _http_ok(url)  # noqa: E731
                wait_until(ready, timeout=60, what=f"the {name} ready")
            yield env
        finally:
            try:
                node.stop()
            finally:
                for p in env.procs.values():
                    p.terminate()
                for p in env.procs.values():
                    try:
                        p.wait(10)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()


@pytest.fixture(scope="session")
def webhook(kubelet_env: KubeletEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    """``python -m gpusched.cli webhook``, registered with the session's apiserver: from the first test that
    asks for it on, every share pod is sent to it (pods that carry their slot already pass unchanged)."""
    # the front ends and the agent run as the control plane's admin: it writes the assignments here
    admin = ("--assignment-writer", "gpusched-admin", "--allocated-writer", "gpusched-admin")
    routing = ("--scheduler-name", STANDALONE, "--scheduler-name", EXTENDER)  # GPU pods to the standalone one
    hook = Webhook(tmp_path_factory.mktemp("webhook"), [*routing, *admin])
    try:
        hook.start()
        assert hook.proc is not None
        kubelet_env.procs["webhook"], kubelet_env.logs["webhook"] = hook.proc, hook.log  # check_alive
        hook.register(kubelet_env.cp)
        yield hook
    finally:
        kubelet_env.procs.pop("webhook", None)
        hook.stop()


@pytest.fixture
def ns(kubelet_env: KubeletEnv) -> Iterator[Ns]:
    n = Ns(kubelet_env)
    try:
        yield n
    finally:
        n.cleanup()
