"""gpusched beside NVIDIA's GPU Operator on the real kubelet: the supported ways to run with NVIDIA's device
plugin (v0.17.4, hack/build-nvidia-device-plugin.sh, on hack/fakenvml's libnvidia-ml.so.1 reading the same
fake GPUs as the session's agent), and the unsupported one that doctor names. docs/gpu-operator.md describes
the modes; each test below is one of them.

These tests change the session's node (the agent's flags, a second device plugin): each puts it back (the
agent serving every resource again, registered last) before the next test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubeletlib import GPU_UUIDS, SLOTS, STANDALONE, KubeletEnv, Ns
from test_real_node import assignment, checkpoint_gpus, gpu_pod, share_pod, visible, wait_scheduling_failed

from gpusched.agent.allocation import ANN_ALLOCATED, RES_SHARE
from gpusched.agent.coexist import ANN_CONFLICT
from gpusched.agent.fake import FakeBackend
from gpusched.agent.fakenvml import flat_config
from gpusched.k8s.convert import RES_GPU
from gpusched.testenv import wait_until
from gpusched.testenv.node import DEVICE_PLUGIN_DIR
from realparts import unavailable

pytestmark = pytest.mark.kubelet

NVIDIA_SOCKET = "nvidia-gpu.sock"  # NVIDIA's plugin's socket for nvidia.com/gpu
REGISTERED = "Registered device plugin for 'nvidia.com/gpu' with Kubelet"


def _built(env: str, script: str) -> Path:
    """$env, else the cached build's directory (the script's last line); skipped (failed under CI) without."""
    if os.environ.get(env):
        return Path(os.environ[env])
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([str(root / "hack" / script)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        unavailable(f"hack/{script} failed (set ${env}): {out.stderr[-500:]}")
    return Path(out.stdout.strip().splitlines()[-1])


class NvidiaPlugin:
    """NVIDIA's device plugin on this node's fake GPUs, in the kubelet's real device-plugin directory."""

    def __init__(self, env: KubeletEnv, tmp: Path) -> None:
        self.bin = _built("GPUSCHED_NVIDIA_DEVICE_PLUGIN_BIN", "build-nvidia-device-plugin.sh")
        self.lib = _built("GPUSCHED_FAKE_NVML_LIB", "build-fake-nvml.sh")
        self.env, self.tmp = env, tmp
        self.flat = tmp / "gpus.flat"
        self.flat.write_text(flat_config(FakeBackend.from_file(env.node.fake_gpus_path)))
        self.log = tmp / "nvidia-device-plugin.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = [str(self.bin / "nvidia-device-plugin"), "--mig-strategy", "none",
               "--device-discovery-strategy", "nvml", "--fail-on-init-error"]  # fmt: skip
        env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(self.lib),
               "GPUSCHED_FAKE_NVML_CONFIG": str(self.flat)}  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.env.procs["nvidia-device-plugin"], self.env.logs["nvidia-device-plugin"] = self.proc, self.log

    def registrations(self) -> int:
        return self.log.read_text(errors="replace").count(REGISTERED) if self.log.exists() else 0

    def wait_registered(self, ns: Ns, count: int = 1) -> None:
        ns.wait("NVIDIA's device plugin registered nvidia.com/gpu", lambda: self.registrations() >= count, 60)

    def stop(self) -> None:
        self.env.procs.pop("nvidia-device-plugin", None)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def _agent_registered(env: KubeletEnv, since: float, resources: tuple[str, ...]) -> bool:
    socks = {RES_GPU: "gpusched-gpu.sock", RES_SHARE: "gpusched-gpu-share.sock"}
    paths = [DEVICE_PLUGIN_DIR / socks[r] for r in resources]
    if not all(p.exists() and p.stat().st_mtime >= since for p in paths):
        return False
    alloc = env.node.node().get("status", {}).get("allocatable", {})
    return bool(alloc.get(RES_GPU) == "4" and alloc.get(RES_SHARE) == str(4 * SLOTS))


@pytest.fixture
def nvidia(kubelet_env: KubeletEnv, tmp_path: Path) -> Iterator[NvidiaPlugin]:
    """NVIDIA's plugin (not started); afterwards it is stopped and the agent restarted with its session flags,
    so that it serves (and registered last) every resource again."""
    plugin = NvidiaPlugin(kubelet_env, tmp_path)
    try:
        yield plugin
    finally:
        plugin.stop()
        since = time.time()
        kubelet_env.node.restart_agent(agent_args=[])
        wait_until(
            lambda: _agent_registered(kubelet_env, since, (RES_GPU, RES_SHARE)),
            timeout=60,
            what="the agent serving nvidia.com/gpu again",
        )


def doctor(env: KubeletEnv, *args: str) -> dict[str, Any]:
    """``gpusched doctor ... --json`` against the session's API."""
    main = "import sys; from gpusched.cli import main; sys.argv[0] = 'gpusched'; main()"
    cmd = [sys.executable, "-c", main, "doctor", *args, "--kubeconfig", str(env.cp.kubeconfig_path), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode in (0, 1), out.stderr
    return dict(json.loads(out.stdout))


def findings(report: dict[str, Any], code: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["code"] == code]


def allocated(ns: Ns, name: str) -> dict[str, Any]:
    """The pod's ``gpusched.io/allocated`` (waited for: the agent writes it after the container starts)."""

    def probe() -> str | None:
        return ns.pod(name)["metadata"].get("annotations", {}).get(ANN_ALLOCATED)

    return dict(json.loads(ns.wait(f"{ns.name}/{name}'s {ANN_ALLOCATED}", probe, 30)))


def agent_scanned(env: KubeletEnv) -> None:
    """Until the agent has searched the device-plugin directory at least once (it does every 10 s, the first
    time 10 s after it started: its process's start time, from /proc)."""
    pid = env.node.pids["agent"]
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    boot = next(
        int(ln.split()[1]) for ln in Path("/proc/stat").read_text().splitlines() if ln.startswith("btime")
    )
    started = boot + ticks / os.sysconf("SC_CLK_TCK")
    time.sleep(max(0.0, started + 12 - time.time()))


def node_annotation(env: KubeletEnv, key: str) -> str | None:
    return (env.node.node().get("metadata", {}).get("annotations") or {}).get(key)


# ------------------------------------------------------------------------------------------------- tests


def test_mode_b_agent_replaces_nvidias_plugin(kubelet_env: KubeletEnv, ns: Ns) -> None:
    """(b) The agent is the node's only GPU device plugin (NVIDIA's plugin not deployed on the pool): it
    serves nvidia.com/gpu and the share slots, and a whole-GPU pod gets exactly the GPUs gpusched assigned,
    recorded by the agent (``gpusched.io/allocated``); doctor finds it agreeing and no second plugin."""
    socks = sorted(p.name for p in DEVICE_PLUGIN_DIR.glob("*.sock"))
    assert socks == ["gpusched-gpu-share.sock", "gpusched-gpu.sock", "kubelet.sock"], socks
    name = ns.create(gpu_pod("whole", kubelet_env.node.busybox_image, 1, scheduler=STANDALONE))
    pod = ns.running(name)
    want = [GPU_UUIDS[i] for i in assignment(pod)["gpus"]]
    env = ns.exec_env(name)
    assert visible(env) == want and env["GPUSCHED_GPU_UUIDS"] == ",".join(want)  # the agent answered
    assert checkpoint_gpus()[pod["metadata"]["uid"]] == want
    assert allocated(ns, name) == {"main": {RES_GPU: want}}
    report = doctor(kubelet_env, "pod", f"{ns.name}/{name}")
    assert findings(report, "allocation-agrees"), report["findings"]
    agent_scanned(kubelet_env)  # the agent looked for another plugin, and found none
    assert node_annotation(kubelet_env, ANN_CONFLICT) is None
    assert not findings(doctor(kubelet_env, "node", kubelet_env.node.name), "device-plugin-conflict")


def test_mode_c_both_plugins_last_registration_wins_and_doctor_names_it(
    kubelet_env: KubeletEnv, ns: Ns, nvidia: NvidiaPlugin
) -> None:
    """(c) Both installed by mistake: the agent serves nvidia.com/gpu and NVIDIA's plugin starts on the same
    node and registers nvidia.com/gpu too. The kubelet keeps the last registration: NVIDIA's plugin answers
    ``Allocate`` (its env, not the agent's; no ``gpusched.io/allocated``) until the agent registers again
    (a restart), then the agent does. The agent finds NVIDIA's socket listing its GPUs' UUIDs and marks the
    Node; doctor names the conflict; with NVIDIA's plugin gone the mark goes."""
    node, image = kubelet_env.node, kubelet_env.node.busybox_image
    nvidia.start()
    nvidia.wait_registered(ns)
    first = ns.create(gpu_pod("after-nvidia", image, 1, scheduler=STANDALONE))
    pod = ns.running(first)
    env = ns.exec_env(first)
    got = visible(env)
    assert len(got) == 1 and "GPUSCHED_GPU_UUIDS" not in env, env  # NVIDIA's Allocate answered
    assert checkpoint_gpus()[pod["metadata"]["uid"]] == got
    assert ANN_ALLOCATED not in ns.pod(first)["metadata"]["annotations"]

    raw = ns.wait(f"the agent's {ANN_CONFLICT}", lambda: node_annotation(kubelet_env, ANN_CONFLICT))
    mark = json.loads(raw)
    assert mark["resources"] == {RES_GPU: [NVIDIA_SOCKET]}, mark
    assert mark["sockets"] == {NVIDIA_SOCKET: sorted(GPU_UUIDS)}, mark
    report = doctor(kubelet_env, "node", node.name)
    (f,) = findings(report, "device-plugin-conflict")
    assert f["severity"] == "error" and f["evidence"]["resources"] == {RES_GPU: [NVIDIA_SOCKET]}
    assert "registered last" in f["message"] and NVIDIA_SOCKET in f["message"], f

    since = time.time()
    node.restart_agent()  # the agent registers again: now it is the last
    ns.wait("the agent registered again", lambda: _agent_registered(kubelet_env, since, (RES_GPU, RES_SHARE)))
    second = ns.create(gpu_pod("after-agent", image, 1, scheduler=STANDALONE))
    pod = ns.running(second)
    want = [GPU_UUIDS[i] for i in assignment(pod)["gpus"]]
    env = ns.exec_env(second)
    assert visible(env) == want and env["GPUSCHED_GPU_UUIDS"] == ",".join(want)  # the agent's Allocate
    assert nvidia.registrations() == 1  # NVIDIA's plugin did not register again: the agent is the last

    nvidia.stop()
    ns.wait(f"{ANN_CONFLICT} removed", lambda: node_annotation(kubelet_env, ANN_CONFLICT) is None, 60)
    assert not findings(doctor(kubelet_env, "node", node.name), "device-plugin-conflict")


def test_mode_a_nvidias_plugin_serves_gpus_and_gpusched_schedules(
    kubelet_env: KubeletEnv, ns: Ns, nvidia: NvidiaPlugin
) -> None:
    """(a) NVIDIA's plugin serves nvidia.com/gpu; the agent (``--no-nvidia-resources``) only the share slots;
    gpusched schedules. Whole-GPU pods run on the GPUs NVIDIA's plugin picks (the kubelet asks it, not
    gpusched), which need not be the assignment's: the kubelet sees four free nvidia.com/gpu devices even
    where a share runs. The agent reads what each container got (the kubelet's PodResources) into
    ``gpusched.io/allocated``, and doctor compares it with the assignment: ``allocation-agrees`` where they
    match, ``drift-gpus`` naming both where not. The node's count stays right: once gpusched has booked every
    GPU, the next whole-GPU pod waits."""
    node, image = kubelet_env.node, kubelet_env.node.busybox_image
    since = time.time()
    node.restart_agent(agent_args=["--no-nvidia-resources"])
    nvidia.start()
    nvidia.wait_registered(ns)
    ns.wait("the agent serving share slots only", lambda: _agent_registered(kubelet_env, since, (RES_SHARE,)))
    socks = sorted(p.name for p in DEVICE_PLUGIN_DIR.glob("*.sock"))
    assert socks == ["gpusched-gpu-share.sock", "kubelet.sock", NVIDIA_SOCKET], socks

    share = ns.create(share_pod("share", image, STANDALONE, milli=500))
    (k,) = assignment(ns.running(share))["gpus"]
    assert visible(ns.exec_env(share)) == [GPU_UUIDS[k]]  # the agent's Allocate: the assignment's GPU
    drift = {}
    for i in range(3):
        name = ns.create(gpu_pod(f"whole-{i}", image, 1, scheduler=STANDALONE))
        pod = ns.running(name)
        (j,) = assignment(pod)["gpus"]
        env = ns.exec_env(name)
        got = visible(env)
        assert j != k and "GPUSCHED_GPU_UUIDS" not in env, env  # NVIDIA's Allocate answered
        assert checkpoint_gpus()[pod["metadata"]["uid"]] == got and len(got) == 1
        assert allocated(ns, name) == {"main": {RES_GPU: got}}  # the agent's record of the kubelet's choice
        report = doctor(kubelet_env, "pod", f"{ns.name}/{name}")
        if got == [GPU_UUIDS[j]]:
            assert findings(report, "allocation-agrees") and not findings(report, "drift-gpus"), report
        else:
            (f,) = findings(report, "drift-gpus")
            assert f["evidence"]["allocated_gpus"] == [GPU_UUIDS.index(got[0])], f
            assert f"booked GPU(s) [{j}]" in f["message"], f
            drift[name] = (j, GPU_UUIDS.index(got[0]))
    print(f"mode (a): share on GPU {k}; whole pods (assigned, got) that differ: {drift}")
    # the books hold the count: every GPU booked (three whole, one shared), so a fourth whole pod waits
    wait = ns.create(gpu_pod("whole-3", image, 1, scheduler=STANDALONE))
    assert "0/1 nodes are available" in wait_scheduling_failed(ns, wait)
    # NVIDIA's plugin serving nvidia.com/gpu is this mode, not a conflict: the agent does not mark the Node
    agent_scanned(kubelet_env)
    assert node_annotation(kubelet_env, ANN_CONFLICT) is None
