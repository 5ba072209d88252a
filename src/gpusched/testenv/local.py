"""``gpusched up`` / ``gpusched down``: a local cluster with gpusched in one command.

``up`` starts ``gpusched testenv up``'s control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler for pods that do not ask for gpusched, kwok) with kwok GPU nodes labelled as the agent labels
a node of those GPUs, then gpusched's standalone scheduler (``spec.schedulerName: gpusched``) and its
admission webhook (the MutatingWebhookConfiguration of ``deploy/manifests/webhook/``, its clientConfig
pointed at the webhook process on loopback, with a certificate of a CA made here). It writes ``env.sh``
(``KUBECONFIG`` and the control plane's ``kubectl`` on ``PATH``) and prints the next three commands.
Every process is recorded in the state, so ``down`` (``testenv_down``) stops them all and removes the state.

Logs: ``<state_dir>/controlplane/logs/`` (``gpusched-scheduler.log``, ``gpusched-webhook.log`` beside the
control plane's).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gpusched.k8s.convert import LABEL_PRODUCT, RES_MEMORY, RES_SHARE
from gpusched.testenv.binaries import find_binaries
from gpusched.testenv.controlplane import free_port, wait_until
from gpusched.testenv.pki import generate_pki
from gpusched.testenv.session import (
    ENV_FILE,
    TestEnvError,
    TestEnvState,
    add_processes,
    testenv_down,
    testenv_up,
)

__all__ = ["EXAMPLES", "SCHEDULER_NAME", "cluster_down", "cluster_up"]

SCHEDULER_NAME = "gpusched"
REPO = Path(__file__).resolve().parents[3]
WEBHOOK_CONFIG = REPO / "deploy" / "manifests" / "webhook" / "02-mutatingwebhookconfiguration.yaml"
EXAMPLES = "deploy/examples/local/"
_READY_TIMEOUT = 60.0


class _Kubectl:
    def __init__(self, bin_dir: Path, kubeconfig: str) -> None:
        self.cmd = [str(bin_dir / "kubectl"), "--kubeconfig", kubeconfig]

    def __call__(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([*self.cmd, *args], input=input, capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise TestEnvError(
                f"kubectl {' '.join(args)} failed (exit {proc.returncode}): {proc.stderr.strip()}"
            )
        return proc


def _spawn(name: str, args: list[str], logs: Path) -> int:
    """``python -m ...`` in its own session (``down`` stops its process group), its output in ``logs``."""
    with (logs / f"{name}.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, *args], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return proc.pid


def _alive_or_fail(pid: int, name: str, logs: Path) -> None:
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        done, status = pid, 0
    if done:
        tail = (logs / f"{name}.log").read_text(errors="replace")[-2000:]
        raise TestEnvError(f"{name} exited ({status}); log tail:\n{tail}")


def _webhook_configuration(port: int, ca_cert: Path) -> dict[str, Any]:
    """deploy/manifests/webhook/'s MutatingWebhookConfiguration, pointed at the webhook on loopback."""
    if not WEBHOOK_CONFIG.is_file():
        raise TestEnvError(f"{WEBHOOK_CONFIG} not found: `gpusched up` runs from a clone of the repository")
    (doc,) = [d for d in yaml.safe_load_all(WEBHOOK_CONFIG.read_text()) if d]
    ca = base64.b64encode(ca_cert.read_bytes()).decode()
    for hook in doc["webhooks"]:
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/mutate", "caBundle": ca}
    return dict(doc)


def _webhook_answers(kubectl: _Kubectl) -> bool:
    """A server-side dry run of a memory-only share pod comes back with its slot."""
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "webhook-probe", "namespace": "default"},
        "spec": {
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": {RES_MEMORY: "1"}}}]
        },
    }
    out = kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(probe), check=False)
    if out.returncode != 0:
        return False
    return bool(json.loads(out.stdout)["spec"]["containers"][0]["resources"]["limits"].get(RES_SHARE) == "1")


def cluster_up(
    state_dir: Path,
    nodes: int,
    gpus_per_node: int,
    node_labels: Mapping[str, str],
    *,
    bin_dir: Path | None = None,
) -> TestEnvState:
    """The control plane with kwok GPU nodes labelled ``node_labels``, gpusched's scheduler and webhook;
    prints the kubeconfig and the next three commands. ``TestEnvError`` when one is already up or a
    part does not start (everything started is stopped again)."""
    bin_dir = bin_dir or find_binaries()
    state = testenv_up(
        state_dir, nodes, gpus_per_node, True, bin_dir=bin_dir, quiet=True, node_labels=node_labels
    )
    state_dir = Path(state_dir).expanduser().resolve()
    try:
        logs = Path(state.workdir) / "logs"
        kubectl = _Kubectl(bin_dir, state.kubeconfig)
        pki = generate_pki(Path(state.workdir) / "webhook-pki")
        port = free_port()
        pids: dict[str, int] = {}
        pids["gpusched-scheduler"] = _spawn("gpusched-scheduler", [
            "-m", "gpusched.k8s.cli_scheduler", "--kubeconfig", state.kubeconfig, "--scheduler-name",
            SCHEDULER_NAME, "--namespace", "kube-system", "--port", str(free_port()), "--flush-s", "5",
        ], logs)  # fmt: skip
        pids["gpusched-webhook"] = _spawn("gpusched-webhook", [
            "-m", "gpusched.webhook", "--host", "127.0.0.1", "--port", str(port),
            "--tls-cert-file", str(pki.serving_cert), "--tls-key-file", str(pki.serving_key),
        ], logs)  # fmt: skip
        state = add_processes(state_dir, state, pids)
        kubectl("apply", "-f", "-", input=json.dumps(_webhook_configuration(port, pki.ca_cert)))

        def webhook_ready() -> bool:
            for name, pid in pids.items():
                _alive_or_fail(pid, name, logs)
            return _webhook_answers(kubectl)

        wait_until(
            webhook_ready,
            timeout=_READY_TIMEOUT,
            what="the apiserver calling gpusched's webhook",
            interval=0.5,
        )
    except BaseException:
        testenv_down(state_dir, quiet=True)
        raise
    env = state_dir / ENV_FILE
    env.write_text(f'export KUBECONFIG="{state.kubeconfig}"\nexport PATH="{bin_dir}:$PATH"\n')
    product = node_labels.get(LABEL_PRODUCT, "")
    print(f"gpusched up: {nodes} kwok node(s) x {gpus_per_node} {product} GPU(s), gpusched's scheduler "
          f"(schedulerName: {SCHEDULER_NAME}) and webhook, at {state.server}")  # fmt: skip
    print(f"kubeconfig: {state.kubeconfig}")
    print(f"logs: {Path(state.workdir) / 'logs'}")
    print("next:")
    print(f"  source {env}        # KUBECONFIG and kubectl")
    print(f"  kubectl apply -f {EXAMPLES}")
    print("  gpusched doctor pod gpu-demo/too-big")
    print("then: gpusched down")
    return state


def cluster_down(state_dir: Path) -> bool:
    """Stop everything ``cluster_up`` (or ``testenv up``) started and remove its state; False if none."""
    return testenv_down(state_dir, who="gpusched down")
