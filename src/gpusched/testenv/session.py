"""``gpusched testenv up|down``: a throw-away local Kubernetes cluster with fake GPU nodes.

``up`` starts the e2e control plane (etcd, kube-apiserver, kube-controller-manager, optionally
kube-scheduler, and kwok playing the kubelets; see ``gpusched.testenv.controlplane``) in the background,
so that it outlives the command, registers ``nodes`` kwok nodes with ``gpus_per_node`` NVIDIA
A100-SXM4-80GB GPUs each (labelled as gpusched's agent and NVIDIA's gpu-feature-discovery label such a
node: ``nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB``, or the labels given; allocatable
``nvidia.com/gpu``, ``gpusched.io/gpu-milli``, ``gpusched.io/gpu-memory`` and the share slots), waits
until they are Ready and prints the admin kubeconfig. ``down`` stops it all, and the processes that
``gpusched up`` (``gpusched.testenv.local``) added to the state: its real node's holder first
(``STOPPED_FIRST``: it needs the apiserver for its teardown), then the others.

Everything lives in ``state_dir``: ``state.json`` (pids, kubeconfig path, ...) and ``controlplane/``
(etcd data, certificates, kubeconfigs, ``logs/``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from gpusched.core.errors import GpuschedError
from gpusched.core.names import LABEL_TESTENV as LABEL_TESTENV
from gpusched.k8s.convert import LABEL_MEMORY, LABEL_PRODUCT
from gpusched.testenv import ControlPlane, ControlPlaneError, wait_until
from gpusched.testenv.kwoknodes import kwok_gpu_node
from gpusched.testenv.nodeholder import HOLDER, teardown_problem

__all__ = [
    "DEFAULT_STATE_DIR",
    "GPU_MEMORY_MIB",
    "GPU_PRODUCT",
    "ControlPlaneError",
    "TestEnvError",
    "TestEnvState",
    "gpu_node_manifest",
    "read_state",
    "testenv_down",
    "testenv_up",
]

#: Where ``gpusched testenv`` keeps its state unless told otherwise.
DEFAULT_STATE_DIR = Path.home() / ".cache" / "gpusched" / "testenv"
GPU_PRODUCT = "NVIDIA-A100-SXM4-80GB"  # the agent's and GFD's nvidia.com/gpu.product
GPU_MEMORY_MIB = 81920
STATE_FILE = "state.json"
ENV_FILE = "env.sh"
"""Written by ``gpusched up``: ``KUBECONFIG`` and the control plane's ``kubectl`` on ``PATH``."""
WORKDIR = "controlplane"
_NODE_READY_TIMEOUT = 120.0
_STOP_TIMEOUT = 10.0
#: Processes stopped (and waited for) before the others, with their own timeouts: ``gpusched up``'s real-node
#: holder (``gpusched.testenv.nodeholder``) deletes the node's pods through the apiserver and undoes its host
#: changes when told to stop, so the control plane must still be up then, and it needs more than 10 s.
STOPPED_FIRST = {HOLDER: 180.0}


class TestEnvError(GpuschedError, RuntimeError):
    """The test environment could not be brought up or down."""

    __test__ = False  # not a pytest test class


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    #: Start time of the process in clock ticks since boot (``/proc/<pid>/stat``), to tell it from a later
    #: process that got the same pid; None where /proc is not available.
    start_ticks: int | None


@dataclass(frozen=True)
class TestEnvState:
    """What ``state.json`` holds."""

    __test__ = False

    kubeconfig: str
    server: str
    workdir: str
    nodes: list[str]
    processes: list[ProcessRecord]
    started_at: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> TestEnvState:
        raw: dict[str, Any] = json.loads(text)
        raw["processes"] = [ProcessRecord(**p) for p in raw["processes"]]
        return cls(**raw)


# ------------------------------------------------------------------------------------------------- nodes


def gpu_node_manifest(name: str, gpus: int, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A kwok Node with ``gpus`` GPUs: NVIDIA A100-SXM4-80GB (product and memory labels) unless ``labels``
    (e.g. the agent's labels of a fake GPU, ``gpusched.agent.fake.fake_node_labels``) say otherwise."""
    labels = dict(labels or {})
    model = labels.get(LABEL_PRODUCT, GPU_PRODUCT)
    memory = int(labels.get(LABEL_MEMORY, GPU_MEMORY_MIB))
    return kwok_gpu_node(
        name, gpus, model=model, gpu_memory_mib=memory, labels={**labels, LABEL_TESTENV: "true"}
    )


def _ready_nodes(cp: ControlPlane, names: Iterable[str]) -> bool:
    out = cp.kubectl("get", "nodes", "-l", f"{LABEL_TESTENV}=true", "-o", "json").stdout
    ready = {
        item["metadata"]["name"]
        for item in json.loads(out).get("items", [])
        if any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (item.get("status") or {}).get("conditions") or []
        )
    }
    return set(names) <= ready


# --------------------------------------------------------------------------------------------- processes


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name, or None if there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def _start_ticks(pid: int) -> int | None:
    fields = proc_stat(pid)
    return int(fields[19]) if fields is not None else None  # field 22 of stat: starttime


def _alive(rec: ProcessRecord) -> bool:
    """Whether the process recorded is still running (a zombie or a new process under the same pid is not)."""
    if Path("/proc/self/stat").exists():
        fields = proc_stat(rec.pid)
        if fields is None or fields[0] in ("Z", "X"):
            return False
        return rec.start_ticks is None or int(fields[19]) == rec.start_ticks
    try:
        os.kill(rec.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal(rec: ProcessRecord, sig: signal.Signals) -> None:
    if not _alive(rec):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(rec.pid, sig)  # each component leads its own process group (testenv starts a new session)


def _terminate(records: list[ProcessRecord], timeout: float) -> None:
    for rec in records:
        _signal(rec, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(_alive(r) for r in records) and time.monotonic() < deadline:
        time.sleep(0.1)
    for rec in records:
        _signal(rec, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while any(_alive(r) for r in records) and time.monotonic() < deadline:
        time.sleep(0.1)


def _stop_processes(records: list[ProcessRecord], timeout: float = _STOP_TIMEOUT) -> None:
    """``STOPPED_FIRST`` first, then everything but etcd (kwok, schedulers, the apiserver), then etcd, which
    they all depend on."""
    for name, first_timeout in STOPPED_FIRST.items():
        _terminate([r for r in records if r.name == name], first_timeout)
    _terminate([r for r in reversed(records) if r.name != "etcd"], timeout)
    _terminate([r for r in records if r.name == "etcd"], timeout)


# ------------------------------------------------------------------------------------------------ state


def read_state(state_dir: Path) -> TestEnvState | None:
    path = Path(state_dir) / STATE_FILE
    try:
        return TestEnvState.from_json(path.read_text())
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise TestEnvError(f"{path} is not a gpusched testenv state file: {exc}") from exc


def write_state(state_dir: Path, state: TestEnvState) -> None:
    tmp = state_dir / f"{STATE_FILE}.tmp"
    tmp.write_text(state.to_json())
    tmp.replace(state_dir / STATE_FILE)


def add_processes(
    state_dir: Path, state: TestEnvState, pids: Mapping[str, int], nodes: Iterable[str] = ()
) -> TestEnvState:
    """The state with these processes (each the leader of its own process group) and ``nodes`` added, written
    to ``state.json``: ``down`` stops them first (the processes are stopped in reverse order)."""
    records = [ProcessRecord(name, pid, _start_ticks(pid)) for name, pid in pids.items()]
    new = replace(state, processes=[*state.processes, *records], nodes=[*state.nodes, *nodes])
    write_state(Path(state_dir).expanduser().resolve(), new)
    return new


def _remove_state(state_dir: Path) -> None:
    shutil.rmtree(state_dir / WORKDIR, ignore_errors=True)
    for name in (STATE_FILE, ENV_FILE):
        with contextlib.suppress(FileNotFoundError):
            (state_dir / name).unlink()
    with contextlib.suppress(OSError):
        state_dir.rmdir()  # only if nothing else is in it


# ----------------------------------------------------------------------------------------------- up/down


def testenv_up(
    state_dir: Path,
    nodes: int,
    gpus_per_node: int,
    with_scheduler: bool,
    *,
    bin_dir: Path | None = None,
    quiet: bool = False,
    node_labels: Mapping[str, str] | None = None,
    kwok: bool = True,
) -> TestEnvState:
    """Start a background control plane with ``nodes`` kwok GPU nodes; print the kubeconfig; return the state.

    ``with_scheduler`` also starts kube-scheduler (the default profile, for pods not asking for gpusched).
    ``kwok=False`` starts neither kwok (which would take any Node over, a real kubelet's too) nor nodes
    (``nodes`` must be 0): ``gpusched up`` adds a real node then.
    Raises ``TestEnvError`` if one is already up in ``state_dir``, ``ControlPlaneError`` if it cannot start
    (the binaries come from ``hack/build-control-plane.sh`` or ``$GPUSCHED_CONTROLPLANE_BIN``).
    """
    if not kwok and nodes != 0:
        raise TestEnvError(f"kwok nodes need kwok: asked for {nodes} node(s) without it")
    if (kwok and nodes < 1) or gpus_per_node < 1:
        raise TestEnvError(f"need at least one node and one GPU per node, got {nodes} x {gpus_per_node}")
    state_dir = Path(state_dir).expanduser().resolve()
    previous = read_state(state_dir)
    if previous is not None:
        if any(_alive(p) for p in previous.processes):
            raise TestEnvError(
                f"a test environment is already up in {state_dir} (KUBECONFIG={previous.kubeconfig}); "
                "run `gpusched testenv down` first"
            )
        _remove_state(state_dir)  # a stale one (processes gone, e.g. after a reboot)
    elif (state_dir / WORKDIR).exists():
        shutil.rmtree(state_dir / WORKDIR)  # the remains of an `up` that did not finish
    state_dir.mkdir(parents=True, exist_ok=True)

    cp = ControlPlane(
        bin_dir=bin_dir,
        scheduler=with_scheduler,
        controller_manager=True,
        kwok=kwok,
        workdir=state_dir / WORKDIR,
        keep_workdir=True,
    )
    cp.start()
    try:
        names = [f"gpu-node-{i}" for i in range(nodes)]
        items = [gpu_node_manifest(n, gpus_per_node, node_labels) for n in names]
        if items:
            manifest = {"apiVersion": "v1", "kind": "List", "items": items}
            cp.kubectl("apply", "-f", "-", input=json.dumps(manifest))
            wait_until(
                lambda: _ready_nodes(cp, names),
                timeout=_NODE_READY_TIMEOUT,
                what=f"kwok to mark {nodes} node(s) Ready",
                control_plane=cp,
                interval=0.5,
            )
        kubeconfig, server = cp.kubeconfig_path, cp.server
    except BaseException:
        cp.stop()
        _remove_state(state_dir)
        raise
    pids = cp.detach()
    state = TestEnvState(
        kubeconfig=str(kubeconfig),
        server=server,
        workdir=str(state_dir / WORKDIR),
        nodes=names,
        processes=[ProcessRecord(name, pid, _start_ticks(pid)) for name, pid in pids.items()],
        started_at=time.time(),
    )
    write_state(state_dir, state)
    if not quiet and items:
        product = items[0]["metadata"]["labels"][LABEL_PRODUCT]
        print(f"gpusched testenv: {nodes} node(s) x {gpus_per_node} {product} GPU(s) Ready at {server}")
        print(f"logs: {state_dir / WORKDIR / 'logs'}")
        print(f"kubeconfig: {kubeconfig}")
        print(f"export KUBECONFIG={kubeconfig}")
    return state


def testenv_down(state_dir: Path, *, quiet: bool = False, who: str = "gpusched testenv") -> bool:
    """Stop the test environment of ``state_dir`` and remove its state; False if there was none."""
    state_dir = Path(state_dir).expanduser().resolve()
    state = read_state(state_dir)
    if state is None:
        if (state_dir / WORKDIR).exists():
            _remove_state(state_dir)
        if not quiet:
            print(f"{who}: nothing is up in {state_dir}")
        return False
    _stop_processes(state.processes)
    left = [f"{p.name} ({p.pid})" for p in state.processes if _alive(p)]
    if left:
        raise TestEnvError(f"could not stop {', '.join(left)}; state kept in {state_dir}")
    problem = teardown_problem(Path(state.workdir))
    _remove_state(state_dir)
    if problem is not None:
        raise TestEnvError(problem)
    if not quiet:
        print(f"{who}: stopped; removed {state_dir / WORKDIR}")
    return True


# Names that start with "test": keep pytest from collecting them where a test module imports them.
testenv_up.__test__ = False  # type: ignore[attr-defined]
testenv_down.__test__ = False  # type: ignore[attr-defined]
