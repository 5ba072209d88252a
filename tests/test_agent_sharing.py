"""What enforces shares on the GPU (``gpusched agent run --sharing``): MPS control daemons per GPU (against
tests/fakes/nvidia-cuda-mps-control, a stand-in that records its commands and keeps a daemon process),
HAMi-core's library, ``none``; and the container toolkit's visibility setting."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpusched.agent.allocation import ANN_ALLOCATED, RES_SHARE, Assignment
from gpusched.agent.mps import HEALTH_QUERY, MpsDaemons, MpsError
from gpusched.agent.sharing import (
    ANN_ISOLATION,
    MPS_PIPE_IN_CONTAINER,
    Sharing,
    SharingCollector,
    ToolkitVisibility,
    isolation_annotation,
    live_shares,
    read_toolkit_visibility,
)
from gpusched.core.errors import InvalidInput
from test_agent_deviceplugin import allocate, allocate_error, env, pod, share_containers  # noqa: F401

STANDIN = Path(__file__).resolve().parent / "fakes" / "nvidia-cuda-mps-control"
G0, G1 = "GPU-7e57a100-0000-4000-8000-000000000000", "GPU-7e57a100-0000-4000-8000-000000000001"
NODE = "gpu-node-1"


def commands(root: Path, gpu: str = "*") -> list[str]:
    """The calls the stand-in recorded (for ``gpu``, or all), as '<GPU> <command>', less health queries."""
    out = []
    for log in sorted(root.glob(f"{gpu}/log/commands.log")):
        out += [c for c in log.read_text().splitlines() if not c.endswith(" " + HEALTH_QUERY)]
    return out


def daemon_pid(d: MpsDaemons, uuid: str) -> int | None:
    p = d.pipe_dir(uuid) / "nvidia-cuda-mps-control.pid"
    return int(p.read_text()) if p.exists() else None


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"  # a zombie counts as gone


def alive(pid: int | None) -> bool:
    return pid is not None and _running(pid)


def gone(pid: int | None) -> bool:
    """The process ended (within a few seconds: a signal is delivered asynchronously)."""
    deadline = time.monotonic() + 5
    while pid is not None and _running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def mps_root(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "mps"
    yield root
    for pidfile in root.glob("*/pipe/nvidia-cuda-mps-control.pid"):  # daemons a failing test left
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def daemons(root: Path, **kw: Any) -> MpsDaemons:
    return MpsDaemons(root, str(STANDIN), isolate_shm=False, **kw)


# ------------------------------------------------------------------------------------------- lifecycle


def test_the_daemon_starts_with_the_gpus_first_share_and_stops_with_its_last(mps_root: Path) -> None:
    d = daemons(mps_root, grace_s=0)
    assert d.acquire(G0, ("uid-a", "main"), now=0) is True
    assert d.acquire(G0, ("uid-b", "main"), now=0) is False  # the second share uses the same daemon
    pid = daemon_pid(d, G0)
    assert alive(pid) and d.answers(G0)
    assert commands(mps_root).count(f"{G0} -d") == 1
    assert d.reconcile({G0: {("uid-b", "main")}}, now=10) == []  # one share left: it stays
    assert alive(pid)
    assert d.reconcile({}, now=20) == [G0]
    assert gone(pid) and not d.answers(G0)
    assert f"{G0} quit" in commands(mps_root)
    assert d.shares == {} and (d.starts, d.stops) == (1, 1)


def test_each_shared_gpu_has_its_own_daemon_pipe_and_log_directories(mps_root: Path) -> None:
    d = daemons(mps_root, grace_s=0)
    d.acquire(G0, ("uid-a", "main"), now=0)
    d.acquire(G1, ("uid-b", "main"), now=0)
    p0, p1 = daemon_pid(d, G0), daemon_pid(d, G1)
    assert p0 != p1 and alive(p0) and alive(p1)
    assert d.pipe_dir(G0) == mps_root / G0 / "pipe" and d.log_dir(G1) == mps_root / G1 / "log"
    # each daemon was started for its GPU only (CUDA_VISIBLE_DEVICES), with its own directories
    assert commands(mps_root, G0) == [f"{G0} -d"]
    assert commands(mps_root, G1) == [f"{G1} -d"]
    d.reconcile({G1: {("uid-b", "main")}}, now=5)
    assert gone(p0) and alive(p1)
    d.reconcile({}, now=6)


def test_a_restarted_agent_keeps_the_daemons_of_running_shares(mps_root: Path) -> None:
    first = daemons(mps_root, grace_s=0)
    first.acquire(G0, ("uid-a", "main"), now=0)
    first.acquire(G1, ("uid-b", "main"), now=0)
    p0, p1 = daemon_pid(first, G0), daemon_pid(first, G1)
    # the agent restarts: a new instance, same root; uid-b's pod was deleted meanwhile
    second = daemons(mps_root, grace_s=0)
    assert second.adopt({G0, G1}) == [G0, G1]
    assert second.reconcile({G0: {("uid-a", "main")}}, now=1) == [G1]
    assert alive(p0) and daemon_pid(second, G0) == p0  # kept, not started again
    assert gone(p1)
    assert commands(mps_root).count(f"{G0} -d") == 1
    # a share allocated after the restart joins the adopted daemon
    assert second.acquire(G0, ("uid-c", "main"), now=2) is False
    second.reconcile({}, now=3)
    assert gone(p0)


def test_a_share_allocated_just_now_keeps_its_daemon_before_the_pods_show_it(mps_root: Path) -> None:
    d = daemons(mps_root, grace_s=60)
    d.acquire(G0, ("uid-a", "main"), now=100)
    assert d.reconcile({}, now=130) == []  # its gpusched.io/allocated may not be written yet
    assert d.reconcile({}, now=161) == [G0]


def test_running_shares_without_a_daemon_get_one_again(mps_root: Path) -> None:
    d = daemons(mps_root, grace_s=0)
    d.reconcile({G0: {("uid-a", "main")}}, now=0)
    assert d.answers(G0) and d.shares == {G0: {("uid-a", "main")}}
    d.reconcile({}, now=1)


def test_a_daemon_that_cannot_start_fails_naming_the_gpu(mps_root: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken-mps-control"
    broken.write_text("#!/bin/sh\necho 'cannot open device' >&2\nexit 3\n")
    broken.chmod(0o755)
    d = MpsDaemons(mps_root, str(broken), isolate_shm=False)
    with pytest.raises(MpsError, match=f"GPU {G0}: starting the MPS control daemon .* exited 3: cannot open"):
        d.acquire(G0, ("uid-a", "main"))
    assert d.shares == {}
    with pytest.raises(MpsError, match="not a GPU UUID"):
        d.pipe_dir("../etc")


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace needs root")
def test_the_daemon_gets_its_gpus_shm_directory_as_dev_shm(mps_root: Path) -> None:
    d = MpsDaemons(mps_root, str(STANDIN), isolate_shm=True, grace_s=0)
    d.acquire(G0, ("uid-a", "main"), now=0)
    try:
        # the stand-in touched /dev/shm/gpusched-fake-mps-<GPU>: it landed in the GPU's shm directory
        assert (d.shm_dir(G0) / f"gpusched-fake-mps-{G0}").exists()
        assert not Path(f"/dev/shm/gpusched-fake-mps-{G0}").exists()
    finally:
        d.reconcile({}, now=1)


def test_mpsexec_without_a_directory_says_so() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpusched.agent.mpsexec", "/nonexistent/shm", "true"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 2 and "/nonexistent/shm is not a directory" in out.stderr


# ------------------------------------------------------------------------------------------- live shares


def test_live_shares_are_the_allocated_share_containers_of_unfinished_pods_on_the_node() -> None:
    def p(uid: str, phase: str, allocated: dict[str, Any], node: str = NODE) -> dict[str, Any]:
        meta = {"uid": uid, "annotations": {ANN_ALLOCATED: json.dumps(allocated)}}
        return {"metadata": meta, "spec": {"nodeName": node}, "status": {"phase": phase}}

    pods = [
        p("a", "Running", {"main": {RES_SHARE: [G0]}, "side": {RES_SHARE: [G0]}}),
        p("b", "Pending", {"main": {RES_SHARE: [G1]}}),
        p("c", "Succeeded", {"main": {RES_SHARE: [G0]}}),
        p("d", "Running", {"main": {RES_SHARE: [G1]}}, node="other"),
        p("e", "Running", {"main": {"nvidia.com/gpu": [G1]}}),
    ]
    assert live_shares(pods, NODE) == {G0: {("a", "main"), ("a", "side")}, G1: {("b", "main")}}


# ------------------------------------------------------------------------------------------- Allocate


def mps_agent(env: dict[str, Any], root: Path) -> MpsDaemons:  # noqa: F811
    d = daemons(root, grace_s=0)
    env["agent"].plugin.allocator.sharing = Sharing("mps", d)
    return d


def test_mps_allocate_mounts_the_gpus_pipe_and_sets_its_limits(env: dict[str, Any], mps_root: Path) -> None:  # noqa: F811
    d = mps_agent(env, mps_root)
    env["pods"].pods += [pod("s", gpus=[1], milli=300, memory=8192, containers=share_containers(300, 8192))]
    r = allocate(env["stub"](RES_SHARE), "GPU-0000::3")
    assert dict(r.envs) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-2222",
        "GPUSCHED_GPU_UUIDS": "GPU-2222",
        "GPUSCHED_GPU_MILLI": "300",
        "GPUSCHED_GPU_MEMORY_MIB": "8192",
        "CUDA_MPS_PIPE_DIRECTORY": MPS_PIPE_IN_CONTAINER,
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "GPU-2222=8192M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
    }
    assert [(m.container_path, m.host_path, m.read_only) for m in r.mounts] == [
        (MPS_PIPE_IN_CONTAINER, str(mps_root / "GPU-2222" / "pipe"), False)
    ]
    assert d.answers("GPU-2222") and d.shares == {"GPU-2222": {("uid-s", "main")}}
    d.reconcile({}, now=1e12)


def test_mps_allocate_fails_when_the_daemon_cannot_start(env: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    env["agent"].plugin.allocator.sharing = Sharing("mps", MpsDaemons(tmp_path, "/nonexistent/mps-control"))
    env["pods"].pods += [pod("s", gpus=[1], milli=300, containers=share_containers(300, None))]
    msg = allocate_error(env["stub"](RES_SHARE), "GPU-0000::3")
    assert "pod team/s container main: GPU GPU-2222: starting the MPS control daemon" in msg


def test_hami_core_allocate_preloads_the_library_with_its_limits(env: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    lib = tmp_path / "libvgpu.so"
    lib.write_bytes(b"\x7fELF")
    env["agent"].plugin.allocator.sharing = Sharing("hami-core", hami_lib=lib)
    env["pods"].pods += [pod("s", gpus=[0], milli=250, memory=4096, containers=share_containers(250, 4096))]
    r = allocate(env["stub"](RES_SHARE), "GPU-0000::0")
    assert dict(r.envs) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-0000",
        "GPUSCHED_GPU_UUIDS": "GPU-0000",
        "GPUSCHED_GPU_MILLI": "250",
        "GPUSCHED_GPU_MEMORY_MIB": "4096",
        "LD_PRELOAD": str(lib),
        "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
        "CUDA_DEVICE_SM_LIMIT": "25",
    }
    assert [(m.container_path, m.host_path, m.read_only) for m in r.mounts] == [(str(lib), str(lib), True)]


def test_modes_are_checked_at_start(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="--sharing 'hami': must be one of mps, hami-core, none"):
        Sharing("hami")
    with pytest.raises(InvalidInput, match=f"HAMi-core's library {tmp_path}/libvgpu.so is not on this node"):
        Sharing("hami-core", hami_lib=tmp_path / "libvgpu.so").check()


def test_none_mode_warns_that_shares_are_not_enforced(caplog: pytest.LogCaptureFixture) -> None:
    Sharing("none").check()
    assert "GPU shares are scheduled but not enforced" in caplog.text
    a = Assignment(NODE, (0,), 300, 0)
    assert Sharing("none").container(G0, a, ("u", "c")).mounts == ()


# ------------------------------------------------------------------------------------------- visibility


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        ("", True),  # the key absent: the toolkit's default
        ("accept-nvidia-visible-devices-envvar-when-unprivileged = true\n", True),
        ("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n[nvidia-container-cli]\n", False),
        ('disable-require = false\n[nvidia-container-runtime]\nmode = "auto"\n', True),
    ],
)
def test_the_toolkit_setting_is_read(tmp_path: Path, text: str, accepted: bool) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(text)
    assert read_toolkit_visibility(cfg) == ToolkitVisibility(cfg, accepted)


def test_a_missing_or_bad_toolkit_config_is_unknown_and_says_why(tmp_path: Path) -> None:
    v = read_toolkit_visibility(tmp_path / "none.toml")
    assert v.accepted is None and "not found" in v.problem
    bad = tmp_path / "bad.toml"
    bad.write_text("accept-nvidia-visible-devices-envvar-when-unprivileged = \n")
    assert "not valid TOML" in read_toolkit_visibility(bad).problem
    bad.write_text('accept-nvidia-visible-devices-envvar-when-unprivileged = "yes"\n')
    assert "is not a boolean" in read_toolkit_visibility(bad).problem


def test_metrics_and_node_annotation_name_the_mode_and_the_visibility(mps_root: Path) -> None:
    s = Sharing("mps", daemons(mps_root))
    v = ToolkitVisibility(Path("/etc/nvidia-container-runtime/config.toml"), True)
    reg = CollectorRegistry()
    reg.register(SharingCollector(s, v))
    text = generate_latest(reg).decode()
    assert 'gpusched_agent_sharing_mode{mode="mps"} 1.0' in text
    assert 'gpusched_agent_sharing_mode{mode="none"} 0.0' in text
    assert "gpusched_agent_mps_daemons 0.0" in text
    assert f'gpusched_agent_visible_devices_envvar_accepted{{config="{v.path}"}} 1.0' in text
    assert json.loads(isolation_annotation(s, v)) == {
        "sharing": "mps",
        "visibleDevicesEnvvar": True,
        "toolkitConfig": "/etc/nvidia-container-runtime/config.toml",
    }
    unknown = ToolkitVisibility(Path("/x"), None, "absent")
    reg2 = CollectorRegistry()
    reg2.register(SharingCollector(Sharing("none"), unknown))
    assert "visible_devices_envvar_accepted" not in generate_latest(reg2).decode()
    assert ANN_ISOLATION == "gpusched.io/gpu-isolation"


# ------------------------------------------------------------------------------------------- doctor


def test_doctor_names_unenforced_shares_and_the_toolkits_envvar_setting() -> None:
    from builders import k8s_node
    from gpusched.doctor.checks import ANN_ISOLATION as DOCTOR_ANN
    from gpusched.doctor.checks import node_findings

    assert DOCTOR_ANN == ANN_ISOLATION  # one name on both sides (doctor may not import the agent)
    cfg = Path("/etc/nvidia-container-runtime/config.toml")

    def findings(sharing: Sharing, v: ToolkitVisibility) -> dict[str, str]:
        n = k8s_node("g", 8)
        n["metadata"].setdefault("annotations", {})[ANN_ISOLATION] = isolation_annotation(sharing, v)
        return {f.code: f.message for f in node_findings(n)}

    risky = findings(Sharing("none"), ToolkitVisibility(cfg, True))
    assert "GPU shares are scheduled but not enforced (agent --sharing none)" in risky["shares-not-enforced"]
    assert "accept-nvidia-visible-devices-envvar-when-unprivileged = true" in risky["visible-devices-envvar"]
    assert str(cfg) in risky["visible-devices-envvar"]
    safe = findings(Sharing("mps", MpsDaemons(Path("/nonexistent"))), ToolkitVisibility(cfg, False))
    assert safe["shares-enforced"] == "GPU shares enforced by mps"
    assert "shares-not-enforced" not in safe and "visible-devices-envvar" not in safe
    assert "visible-devices-envvar" not in findings(Sharing("none"), ToolkitVisibility(cfg, None, "absent"))


# ------------------------------------------------------------------------------------------- the agent


def test_the_agent_lists_pods_for_mps_only_while_a_daemon_runs(mps_root: Path) -> None:
    """An idle node costs the API nothing: the pods are listed at start (running shares may have lost their
    daemon) and then only while a daemon runs; the daemon of a share whose pod is gone is stopped."""
    from gpusched.agent.fake import FakeBackend
    from gpusched.agent.pods import MemoryPods
    from gpusched.agent.run import Agent, AgentConfig

    class CountingPods(MemoryPods):
        lists = 0

        def pods_on_node(self, node: str) -> list[dict[str, Any]]:
            self.lists += 1
            return super().pods_on_node(node)

    pods = CountingPods()
    doc = {"hostname": NODE, "gpus": [{"model": "NVIDIA A100-SXM4-80GB", "uuid": G0}]}
    cfg = AgentConfig(node=NODE, sharing="mps", mps_root=mps_root, mps_control=str(STANDIN))
    agent = Agent(cfg, FakeBackend.from_dict(doc, "test"), pods, pods)
    d = agent.sharing.mps
    assert d is not None
    d.isolate_shm, d.grace_s = False, 0
    agent.reconcile_sharing(at_start=True)
    assert pods.lists == 1
    agent.reconcile_sharing()
    assert pods.lists == 1  # no daemon: nothing to look for
    d.acquire(G0, ("uid-gone", "main"))
    agent.reconcile_sharing()
    assert pods.lists == 2 and d.shares == {} and not d.answers(G0)
