"""NVIDIA's own device plugin (nvidia-device-plugin v0.17.4, hack/build-nvidia-device-plugin.sh) on
hack/fakenvml's libnvidia-ml.so.1 and a fake kubelet: it must advertise what the agent's inventory says NVIDIA
would (whole GPUs by UUID as ``nvidia.com/gpu``, MIG devices by MIG UUID as ``nvidia.com/mig-<profile>``, the
mixed strategy), and mark a GPU unhealthy on a critical XID written to the fake's XID file but not on an
application XID, as the agent classifies them.

The plugin's socket directory and the MIG capability minors it reads (/proc/driver/nvidia-caps/mig-minors) are
fixed paths: it runs in a private mount namespace (``unshare --mount``, root) with temporary directories bound
over them.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusched.agent import labels
from gpusched.agent.fake import FakeBackend
from gpusched.agent.fakenvml import flat_config
from gpusched.agent.inventory import is_critical_xid
from gpusched.agent.nvml import NvmlBackend
from gpusched.agent.pods import MemoryPods
from gpusched.agent.run import Agent, AgentConfig
from gpusched.agent.testing import FakeKubelet, Watcher
from test_gfd_fake_nvml import nvidia_parts

DOC: dict[str, Any] = {
    "hostname": "node-d",
    "gpus": [
        {"model": "NVIDIA A100-SXM4-80GB", "count": 2},
        {
            "model": "NVIDIA A100-SXM4-80GB",
            "migMode": True,
            "mig": [
                {"profile": "3g.40gb", "start": 4},
                {"profile": "1g.10gb", "start": 0},
                {"profile": "1g.10gb", "start": 1},
            ],
        },
    ],
}


def _mig_minors(path: Path, gpus: int) -> None:
    """The driver's /proc/driver/nvidia-caps/mig-minors: a device minor per GI and CI access capability."""
    lines, minor = ["config 1", "monitor 2"], 3
    for g in range(gpus):
        for gi in range(15):
            lines.append(f"gpu{g}/gi{gi}/access {minor}")
            minor += 1
            for ci in range(8):
                lines.append(f"gpu{g}/gi{gi}/ci{ci}/access {minor}")
                minor += 1
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def plugin() -> Iterator[dict[str, Any]]:
    bins, lib = nvidia_parts()
    binary = bins / "nvidia-device-plugin"
    tmp = Path(tempfile.mkdtemp(prefix="ndp", dir="/tmp"))  # unix socket paths must stay short
    sockets, proc = tmp / "s", tmp / "proc"
    sockets.mkdir()
    spec = tmp / "gpus.yaml"
    xids = tmp / "xids"
    xids.write_text("")
    spec.write_text(yaml.safe_dump({**DOC, "xidFile": str(xids)}))
    fake = FakeBackend.from_file(spec)
    (tmp / "gpus.flat").write_text(flat_config(fake))
    _mig_minors(proc / "nvidia-caps" / "mig-minors", len(fake.inventory().devices))
    kubelet = FakeKubelet(sockets).start()
    cmd = (
        "mkdir -p /var/lib/kubelet/device-plugins && "
        f"mount --bind {sockets} /var/lib/kubelet/device-plugins && mount --bind {proc} /proc/driver && "
        f"exec {binary} --mig-strategy mixed --device-discovery-strategy nvml"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "LD_LIBRARY_PATH": str(lib),
        "GPUSCHED_FAKE_NVML_CONFIG": str(tmp / "gpus.flat"),
    }
    log = (tmp / "plugin.log").open("w")
    p = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", cmd], env=env, stdout=log, stderr=log
    )
    try:
        yield {
            "kubelet": kubelet,
            "inventory": fake.inventory(),
            "xids": xids,
            "log": tmp / "plugin.log",
            "flat": tmp / "gpus.flat",
            "lib": lib,
            "tmp": tmp,
        }
    finally:
        p.terminate()
        p.wait(10)
        log.close()
        kubelet.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def test_nvidias_plugin_advertises_the_fake_gpus_and_marks_critical_xids(plugin: dict[str, Any]) -> None:
    kubelet: FakeKubelet = plugin["kubelet"]
    inv = plugin["inventory"]
    want = {"nvidia.com/gpu": sorted(d.uuid for d in inv.devices if not d.mig_enabled)}
    want.update({r: sorted(u) for r, u in labels.mig_resources(inv).items()})
    regs = kubelet.wait_registrations(len(want), 30)
    assert sorted(r.resource_name for r in regs) == sorted(want), plugin["log"].read_text()[-3000:]
    watchers = {r.resource_name: Watcher(kubelet, r.endpoint) for r in regs}
    try:
        for res, ids in want.items():
            n = len(ids)
            got = watchers[res].wait_for(lambda lst, n=n: len(lst) == n)
            assert sorted(got) == ids and set(got.values()) == {"Healthy"}, res
        gpu0 = inv.devices[0].uuid
        with plugin["xids"].open("a") as f:
            f.write("0 79\n1 13\n")  # a critical XID on GPU 0, an application one on GPU 1
        assert is_critical_xid(79) and not is_critical_xid(13)
        got = watchers["nvidia.com/gpu"].wait_for(lambda lst: lst.get(gpu0) == "Unhealthy")
        assert got == {gpu0: "Unhealthy", inv.devices[1].uuid: "Healthy"}
        for res in want.keys() - {"nvidia.com/gpu"}:
            assert set(watchers[res].lists[-1].values()) == {"Healthy"}, res
    finally:
        for w in watchers.values():
            w.close()


def test_the_agent_on_real_nvml_and_nvidias_plugin_see_the_same_devices_and_health(
    plugin: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Side by side on one fake node (each with its own kubelet: both serve ``nvidia.com/gpu``), the agent
    through nvidia-ml-py and NVIDIA's plugin through go-nvml list the same device IDs per resource, and after
    the same XIDs the same health."""
    ctypes.CDLL(str(plugin["lib"] / "libnvidia-ml.so.1"), mode=ctypes.RTLD_GLOBAL)
    monkeypatch.setenv("GPUSCHED_FAKE_NVML_CONFIG", str(plugin["flat"]))
    backend = NvmlBackend("node-d")
    ours_dir = plugin["tmp"] / "a"
    kubelet_a = FakeKubelet(ours_dir).start()
    pods = MemoryPods()
    agent = Agent(AgentConfig(node="node-d", plugin_dir=ours_dir, slots=2), backend, pods, pods)
    agent.plugin.start(watch_interval_s=0.05)
    theirs_k: FakeKubelet = plugin["kubelet"]
    inv = plugin["inventory"]
    resources = ["nvidia.com/gpu", *labels.mig_resources(inv)]
    watchers: list[Watcher] = []
    try:
        ours = {r.resource_name: r.endpoint for r in kubelet_a.wait_registrations(len(resources) + 1)}
        theirs = {r.resource_name: r.endpoint for r in theirs_k.wait_registrations(len(resources), 30)}
        assert set(theirs) == set(resources) and set(resources) <= set(ours)
        pairs = {}
        for res in resources:
            a, b = Watcher(kubelet_a, ours[res]), Watcher(theirs_k, theirs[res])
            watchers += [a, b]
            pairs[res] = (a, b)
            n = len(b.wait_for(lambda lst: bool(lst)))
            assert a.wait_for(lambda lst, n=n: len(lst) == n) == b.lists[-1], res
        with plugin["xids"].open("a") as f:
            f.write("0 79\n1 13\n")
        agent.handle_xids(backend.poll_xids(2.0))
        gpu0 = inv.devices[0].uuid
        a, b = pairs["nvidia.com/gpu"]
        assert b.wait_for(lambda lst: lst.get(gpu0) == "Unhealthy") == a.wait_for(
            lambda lst: lst.get(gpu0) == "Unhealthy"
        )
        assert a.lists[-1][gpu0] == "Unhealthy" and list(a.lists[-1].values()).count("Unhealthy") == 1
    finally:
        for w in watchers:
            w.close()
        agent.plugin.stop()
        backend.close()
        kubelet_a.stop()
