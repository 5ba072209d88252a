"""``gpusched up`` / ``gpusched down``: a local cluster with gpusched in one command.

``up`` starts ``gpusched testenv up``'s control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler for pods that do not ask for gpusched) and its GPU nodes: either one real node (containerd,
runc, CNI, the kubelet and gpusched's agent on fake GPUs, held by ``gpusched.testenv.nodeholder``; its
containers run and see the GPU the agent hands them) when this machine has the parts (root, containerd,
the kubelet, the local images), or kwok GPU nodes labelled as the agent labels a node of those GPUs
(``node``: ``auto``, the default, says which and why; ``real`` insists; ``kwok`` never tries). Then
gpusched's standalone scheduler (``spec.schedulerName: gpusched``) and its
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
from gpusched.testenv.node import LOCK_FILE
from gpusched.testenv.nodeholder import (
    HOLDER,
    LOCK_WAIT_S,
    RealNodePlan,
    real_node_plan,
    spawn_holder,
    wait_ready,
)
from gpusched.testenv.pki import generate_pki
from gpusched.testenv.session import (
    ENV_FILE,
    TestEnvError,
    TestEnvState,
    add_processes,
    testenv_down,
    testenv_up,
)

__all__ = ["EXAMPLES", "NODE_MODES", "SCHEDULER_NAME", "cluster_down", "cluster_up"]

SCHEDULER_NAME = "gpusched"
REPO = Path(__file__).resolve().parents[3]
LOCAL_WRITER = "gpusched-admin"
"""The user the local scheduler and agent write as (the admin kubeconfig's certificate, testenv/pki.py)."""
WEBHOOK_CONFIG = REPO / "deploy" / "manifests" / "webhook" / "02-mutatingwebhookconfiguration.yaml"
EXAMPLES = "deploy/examples/local/"
_READY_TIMEOUT = 60.0
_REAL_NODE_TIMEOUT = 600.0  # 15-25 s on an idle 2-core machine; CI once passed 300 s with the machine busy
NODE_MODES = ("auto", "real", "kwok")
REAL_NODE_NAME = "gpu-node-0"


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
    for hook in doc["webhooks"]:  # each webhook (gpu-share, assignment-guard, gpu-routing) at its own path
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
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


def _choose_real_node(mode: str, nodes: int | None, bin_dir: Path) -> RealNodePlan | None:
    """The real node's plan when ``up`` runs one, None for kwok nodes; prints why when ``auto`` falls back.
    ``TestEnvError`` when ``real`` cannot be had."""
    if mode not in NODE_MODES:
        raise TestEnvError(f"--node {mode!r}: expected one of {', '.join(NODE_MODES)}")
    if mode == "kwok":
        return None
    if nodes not in (None, 1):
        if mode == "real":
            raise TestEnvError(
                f"--node real runs one node (the kubelet's device-plugin directory is fixed: one per "
                f"machine), not --nodes {nodes}; use --node kwok for more"
            )
        print(f"gpusched up: kwok nodes, as --nodes {nodes} asks (a real node is one per machine)")
        return None
    plan = real_node_plan(bin_dir)
    if not plan.possible:
        if mode == "real":
            raise TestEnvError("--node real: the real node cannot run here: " + "; ".join(plan.missing))
        print("gpusched up: kwok nodes (no container runs), as a real node cannot run here: "
              + "; ".join(plan.missing))  # fmt: skip
        return None
    if plan.lock_held:
        if mode == "auto":
            print(f"gpusched up: kwok nodes, as another real node runs on this machine ({LOCK_FILE} is held; "
                  "--node real waits for it)")  # fmt: skip
            return None
        print(f"gpusched up: another real node runs on this machine ({LOCK_FILE}); waiting up to "
              f"{LOCK_WAIT_S:.0f} s for it to go")  # fmt: skip
    print(f"gpusched up: node images from {plan.images_from}: {plan.images}")
    return plan


def cluster_up(
    state_dir: Path,
    nodes: int | None,
    gpus_per_node: int,
    node_labels: Mapping[str, str],
    *,
    node: str = "kwok",
    gpu_model: str = "NVIDIA A100-SXM4-80GB",
    bin_dir: Path | None = None,
) -> TestEnvState:
    """The control plane with one real node of ``gpus_per_node`` fake ``gpu_model`` GPUs (``node`` ``real``,
    or ``auto`` where it can run; the command's default) or ``nodes`` (default 2) kwok GPU nodes labelled
    ``node_labels`` (``kwok``, this function's default), then gpusched's scheduler and webhook; prints the
    kubeconfig and the next commands. ``TestEnvError`` when one is already up or a part does not start
    (everything started is stopped again)."""
    bin_dir = bin_dir or find_binaries()
    plan = _choose_real_node(node, nodes, bin_dir)
    kwok_nodes = 0 if plan is not None else (nodes or 2)
    state = testenv_up(
        state_dir, kwok_nodes, gpus_per_node, True, bin_dir=bin_dir, quiet=True, node_labels=node_labels,
        kwok=plan is None,
    )  # fmt: skip
    state_dir = Path(state_dir).expanduser().resolve()
    workdir = Path(state.workdir)
    logs = workdir / "logs"
    node_logs = ""
    try:
        pids: dict[str, int] = {}
        if plan is not None and plan.images is not None:
            pids[HOLDER] = spawn_holder(
                workdir=workdir, server=state.server, bin_dir=bin_dir, images=plan.images,
                name=REAL_NODE_NAME, gpu_model=gpu_model, gpus=gpus_per_node, log=logs / f"{HOLDER}.log",
            )  # fmt: skip
            state = add_processes(state_dir, state, pids)
        kubectl = _Kubectl(bin_dir, state.kubeconfig)
        pki = generate_pki(workdir / "webhook-pki")
        port = free_port()
        front: dict[str, int] = {}
        front["gpusched-scheduler"] = _spawn("gpusched-scheduler", [
            "-m", "gpusched.cli", "scheduler", "--kubeconfig", state.kubeconfig, "--scheduler-name",
            SCHEDULER_NAME, "--namespace", "kube-system", "--port", str(free_port()), "--flush-s", "5",
        ], logs)  # fmt: skip
        front["gpusched-webhook"] = _spawn("gpusched-webhook", [
            "-m", "gpusched.cli", "webhook", "--host", "127.0.0.1", "--port", str(port),
            "--tls-cert-file", str(pki.serving_cert), "--tls-key-file", str(pki.serving_key),
            # the local scheduler and agent write as the control plane's admin, not as the chart's accounts
            "--assignment-writer", LOCAL_WRITER, "--allocated-writer", LOCAL_WRITER,
        ], logs)  # fmt: skip
        state = add_processes(state_dir, state, front)
        kubectl("apply", "-f", "-", input=json.dumps(_webhook_configuration(port, pki.ca_cert)))

        def webhook_ready() -> bool:
            for name, pid in front.items():
                _alive_or_fail(pid, name, logs)
            return _webhook_answers(kubectl)

        wait_until(
            webhook_ready,
            timeout=_READY_TIMEOUT,
            what="the apiserver calling gpusched's webhook",
            interval=0.5,
        )
        if plan is not None:
            timeout = _REAL_NODE_TIMEOUT + (LOCK_WAIT_S if plan.lock_held else 0.0)
            ready = wait_ready(workdir, pids[HOLDER], logs / f"{HOLDER}.log", timeout)
            daemons = {f"{HOLDER}/{name}": int(pid) for name, pid in ready["pids"].items()}
            state = add_processes(state_dir, state, daemons, nodes=[str(ready["node"])])
            node_logs = str(Path(next(iter(ready["logs"].values()))).parent)
    except BaseException:
        testenv_down(state_dir, quiet=True)
        raise
    env = state_dir / ENV_FILE
    env.write_text(f'export KUBECONFIG="{state.kubeconfig}"\nexport PATH="{bin_dir}:$PATH"\n')
    product = node_labels.get(LABEL_PRODUCT, "")
    if plan is not None:
        what = (f"1 real node {REAL_NODE_NAME} (containerd, kubelet, gpusched's agent) x {gpus_per_node} "
                f"fake {product} GPU(s)")  # fmt: skip
    else:
        what = f"{kwok_nodes} kwok node(s) x {gpus_per_node} {product} GPU(s)"
    print(f"gpusched up: {what}, gpusched's scheduler (schedulerName: {SCHEDULER_NAME}) and webhook, "
          f"at {state.server}")  # fmt: skip
    print(f"kubeconfig: {state.kubeconfig}")
    print(f"logs: {logs}" + (f" and {node_logs} (containerd, kubelet, agent)" if node_logs else ""))
    print("next:")
    print(f"  source {env}        # KUBECONFIG and kubectl")
    print(f"  kubectl apply -f {EXAMPLES}")
    if plan is not None:
        print("  kubectl -n gpu-demo logs share-a        # the GPU its container sees")
    print("  gpusched doctor pod gpu-demo/too-big")
    print("then: gpusched down")
    return state


def cluster_down(state_dir: Path) -> bool:
    """Stop everything ``cluster_up`` (or ``testenv up``) started and remove its state; False if none."""
    return testenv_down(state_dir, who="gpusched down")
