"""The running agent: its threads carry an injected XID to the kubelet and the Node; the command starts and
registers with a kubelet."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from gpusched.agent.fake import FakeBackend
from gpusched.agent.health import ANN_UNHEALTHY_GPUS
from gpusched.agent.plugin import wait_until
from gpusched.agent.pods import MemoryPods
from gpusched.agent.run import Agent, AgentConfig
from gpusched.agent.testing import FakeKubelet, Watcher

DOC = {"hostname": "run-node", "gpus": [{"model": "Tesla T4", "count": 2}]}


def test_an_injected_xid_reaches_list_and_watch_and_the_node() -> None:
    d = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    kubelet = FakeKubelet(d).start()
    pods = MemoryPods()
    backend = FakeBackend.from_dict(json.loads(json.dumps(DOC)), "t")
    agent = Agent(AgentConfig(node="run-node", plugin_dir=d), backend, pods, pods)
    try:
        agent.start(serve_metrics=False)
        regs = {r.resource_name: r.endpoint for r in kubelet.wait_registrations(2)}
        w = Watcher(kubelet, regs["nvidia.com/gpu"])
        uuid1 = backend.inventory().devices[1].uuid
        assert w.wait_for(lambda lst: len(lst) == 2)[uuid1] == "Healthy"
        node = pods.get_node("run-node")
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "Tesla-T4"
        backend.inject_xid(1, 79)
        assert w.wait_for(lambda lst: lst.get(uuid1) == "Unhealthy")[uuid1] == "Unhealthy"
        assert wait_until(lambda: node["metadata"].get("annotations", {}).get(ANN_UNHEALTHY_GPUS) == "1", 20)
        w.close()
    finally:
        agent.stop()
        kubelet.stop()
        shutil.rmtree(d, ignore_errors=True)


def test_the_run_command_serves_and_registers() -> None:
    d = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    fake = d / "gpus.json"
    fake.write_text(json.dumps(DOC))
    kubelet = FakeKubelet(d / "dp").start()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpusched.cli", "agent", "run", "--fake", str(fake), "--no-api", "--node",
         "run-node", "--plugin-dir", str(d / "dp"), "--metrics-port", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        regs = kubelet.wait_registrations(2, timeout_s=60)
        assert sorted(r.resource_name for r in regs) == ["gpusched.io/gpu-share", "nvidia.com/gpu"], regs
        assert (d / "dp" / "gpusched-gpu.sock").exists()
        proc.terminate()
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert not (d / "dp" / "gpusched-gpu.sock").exists()  # SIGTERM: stopped and cleaned up
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kubelet.stop()
        shutil.rmtree(d, ignore_errors=True)
