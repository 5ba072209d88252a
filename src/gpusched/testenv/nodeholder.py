"""The process that holds ``gpusched up``'s real node: ``python -m gpusched.testenv.nodeholder``.

A ``RealNode`` (containerd, runc, CNI, the kubelet, gpusched's agent on fake GPUs; ``node.py``) changes the
host and undoes it in-process, in ``RealNode.stop()``. ``gpusched up`` must return while the node runs, so it
spawns this small process, records it in the state, and ``gpusched down`` sends it SIGTERM: it then stops the
node (its pods, the agent, the kubelet, containerd, the network, cgroups and sysctls) and exits. Everything it
has to say goes to a JSON marker file: ``{"status": "ready", "node": ..., "pids": {...}, "logs": {...}}`` once
the Node is Ready with its GPUs in its capacity, ``{"status": "failed", "error": ...}`` if it could not start.

The parent side is here too: ``real_node_plan`` (can a real node run here, and with which images),
``spawn_holder`` and ``wait_ready``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from gpusched.testenv.binaries import ENV_BIN_DIR
from gpusched.testenv.controlplane import ControlPlane
from gpusched.testenv.node import (
    BRIDGE,
    ENV_NODE_IMAGES,
    LOCK_FILE,
    NodeError,
    NodePartsMissingError,
    RealNode,
    find_node_images,
    missing_parts,
)
from gpusched.testenv.pki import _pki_paths

__all__ = [
    "HOLDER",
    "LOCAL_BUSYBOX",
    "HolderFailedError",
    "RealNodePlan",
    "another_real_node_runs",
    "real_node_plan",
    "spawn_holder",
    "teardown_problem",
    "wait_ready",
]

HOLDER = "real-node"
"""The holder's name in ``gpusched up``'s state (``down`` stops it first, and waits for its teardown)."""
LOCAL_BUSYBOX = "gpusched.local/busybox:latest"
"""What deploy/examples/local/ names: the node's busybox image is tagged so (pods use ``imagePullPolicy:
Never``; there is no registry)."""
MARKER = "real-node.json"
LOCK_WAIT_S = 600.0
"""How long the holder waits for another real node on this machine (one per machine) to go."""


class HolderFailedError(NodeError):
    """The real node's holder exited, failed or did not report ready in time."""


# ------------------------------------------------------------------------------------ the parent's side


@dataclass(frozen=True)
class RealNodePlan:
    """Whether a real node can run here: ``missing`` (each with how to get it) is empty, ``images`` is the
    directory of the local images, ``images_from`` says where they came from, ``lock_held`` says another real
    node runs on this machine now."""

    missing: list[str]
    images: Path | None
    images_from: str
    lock_held: bool

    @property
    def possible(self) -> bool:
        return not self.missing and self.images is not None


def another_real_node_runs() -> bool:
    """Whether another real node (the kubelet tests, another ``gpusched up``) holds ``LOCK_FILE`` now."""
    try:
        with LOCK_FILE.open("ab") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
    except OSError:
        return False  # no /run/lock (or not root): missing_parts says what matters
    return False


def real_node_plan(bin_dir: Path) -> RealNodePlan:
    """Checks the parts a real node needs (root, containerd, runc, CNI, the kubelet, cgroups), then the local
    images: ``$GPUSCHED_NODE_IMAGES``, else ``hack/build-node-images.sh`` (built once, then cached)."""
    missing = missing_parts(bin_dir)
    if missing:
        return RealNodePlan(missing, None, "", False)
    from_env = os.environ.get(ENV_NODE_IMAGES)
    source = f"${ENV_NODE_IMAGES}" if from_env else "hack/build-node-images.sh (built once, then cached)"
    try:
        images: Path | None = find_node_images(build=True, timeout=600.0)
    except NodePartsMissingError as exc:
        return RealNodePlan([f"no node images: {'; '.join(exc.missing)}"], None, source, False)
    if another_real_node_runs():
        return RealNodePlan([], images, source, True)  # its bridge is up: `real` waits for it to go
    if Path("/sys/class/net", BRIDGE).exists():
        return RealNodePlan([f"the bridge {BRIDGE} exists (left by a real node that did not stop cleanly: "
                             f"ip link del {BRIDGE})"], images, source, False)  # fmt: skip
    return RealNodePlan([], images, source, False)


def spawn_holder(
    *,
    workdir: Path,
    server: str,
    bin_dir: Path,
    images: Path,
    name: str,
    gpu_model: str,
    gpus: int,
    log: Path,
) -> int:
    """Start the holder in its own session (``down`` signals its process group: only itself, as the node's
    daemons lead sessions of their own); its output goes to ``log``. Returns its pid."""
    cmd = [
        sys.executable, "-m", "gpusched.testenv.nodeholder", "--workdir", str(workdir), "--server", server,
        "--bin-dir", str(bin_dir), "--images", str(images), "--name", name, "--gpu-model", gpu_model,
        "--gpus", str(gpus),
    ]  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return proc.pid


def _exited(pid: int) -> int | None:
    """The exit status of our child ``pid`` if it has ended (reaped here), else None."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return 0 if not Path(f"/proc/{pid}").exists() else None
    return os.waitstatus_to_exitcode(status) if done else None


def wait_ready(workdir: Path, pid: int, log: Path, timeout: float) -> dict[str, Any]:
    """The holder's ready marker (node name, daemon pids, logs). ``HolderFailedError`` with its error, or
    the tail of its log, if it fails, exits or is not ready within ``timeout`` seconds."""
    marker = workdir / MARKER
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(FileNotFoundError, ValueError):
            doc: dict[str, Any] = json.loads(marker.read_text())
            if doc.get("status") == "ready":
                return doc
            if doc.get("status") == "failed":
                raise HolderFailedError(f"the real node did not start: {doc.get('error')} (log: {log})")
        code = _exited(pid)
        if code is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise HolderFailedError(f"the real node's holder exited ({code}); {log}:\n{tail}")
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise HolderFailedError(f"the real node was not ready after {timeout:.0f} s; {log}:\n{tail}")
        time.sleep(0.5)


# ------------------------------------------------------------------------------------ the holder itself


class _AttachedControlPlane(ControlPlane):
    """A ``ControlPlane`` that another process started (``gpusched up``'s): its workdir, PKI, admin
    kubeconfig and apiserver URL, for ``RealNode``. It starts and stops nothing."""

    def __init__(self, workdir: Path, server: str, bin_dir: Path) -> None:
        super().__init__(bin_dir=bin_dir, kwok=False, workdir=workdir, keep_workdir=True)
        self._workdir = workdir
        self._server = server
        self._kubeconfig = workdir / "admin.kubeconfig"
        self._pki = _pki_paths(workdir / "pki")

    @property
    def running(self) -> bool:
        return True  # `down` stops the holder before the control plane


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """SIGTERM, SIGINT or SIGHUP: stop the node and exit (as Ctrl-C does, by ``KeyboardInterrupt``, which
    ``RealNode.start`` also answers by stopping what it started)."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)  # the teardown must not be cut short by a second signal
    _log(f"{signal.Signals(signum).name}: stopping the node")
    raise KeyboardInterrupt


def _write_marker(workdir: Path, doc: dict[str, Any]) -> None:
    tmp = workdir / f"{MARKER}.tmp"
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(workdir / MARKER)


def _log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} real-node: {msg}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpusched.testenv.nodeholder", description=__doc__)
    p.add_argument("--workdir", type=Path, required=True, help="the control plane's workdir")
    p.add_argument("--server", required=True, help="the apiserver URL")
    p.add_argument("--bin-dir", type=Path, default=os.environ.get(ENV_BIN_DIR), required=False)
    p.add_argument("--images", type=Path, required=True, help="pause.tar, busybox.tar, images.env")
    p.add_argument("--name", required=True, help="the Node's name")
    p.add_argument("--gpu-model", required=True, help="the fake GPUs' NVML name")
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--slots", type=int, default=16, help="gpusched.io/gpu-share slots per GPU")
    args = p.parse_args(argv)
    if args.bin_dir is None:
        p.error(f"--bin-dir or ${ENV_BIN_DIR} is required")
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, _on_signal)
    cp = _AttachedControlPlane(args.workdir, args.server, args.bin_dir)
    gpus = [{"model": args.gpu_model, "count": args.gpus, "numaNode": 0}]
    node = RealNode(cp, gpus, name=args.name, images_dir=args.images, slots=args.slots,
                    lock_timeout=LOCK_WAIT_S)  # fmt: skip
    try:
        _log(f"starting Node {args.name}: containerd, the kubelet, the agent on {args.gpus} fake GPU(s)")
        node.start()
        tagged = node.ctr("images", "tag", "--force", node.busybox_image, LOCAL_BUSYBOX)
        if tagged.returncode != 0:
            raise NodeError(f"ctr images tag {LOCAL_BUSYBOX} failed: {tagged.stderr.strip()}")
        logs = {name: str(path) for name, path in node.log_paths.items()}
        _write_marker(args.workdir, {"status": "ready", "node": node.name, "pids": node.pids, "logs": logs,
                                     "busybox": node.busybox_image, "ip": node.ip})  # fmt: skip
        _log(f"Node {node.name} Ready; daemons {node.pids}; logs {logs}")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return _stop(node, args.workdir)
    except Exception as exc:
        _write_marker(args.workdir, {"status": "failed", "error": str(exc)})
        _log(f"failed: {exc}")
        _stop(node, None)
        return 1


def _stop(node: RealNode, workdir: Path | None) -> int:
    """Stop the node; with ``workdir``, the marker then says ``stopped`` or ``unclean`` (read by ``down``)."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    try:
        node.stop()
    except NodeError as exc:
        _log(f"not cleanly stopped: {exc}")
        if workdir is not None:
            _write_marker(workdir, {"status": "unclean", "error": str(exc)})
        return 1
    if workdir is not None:
        _write_marker(workdir, {"status": "stopped"})
    _log("stopped; the host is as it was")
    return 0


def teardown_problem(workdir: Path) -> str | None:
    """After ``down`` stopped the holder: what went wrong in its teardown (None: nothing, or no real node)."""
    try:
        doc = json.loads((workdir / MARKER).read_text())
    except (FileNotFoundError, ValueError):
        return None
    if doc.get("status") == "unclean":
        return f"the real node was not cleanly removed: {doc.get('error')}"
    if doc.get("status") == "ready":
        return "the real node's holder did not finish its teardown (killed): check the host (ip link, mounts)"
    return None


if __name__ == "__main__":
    sys.exit(main())
