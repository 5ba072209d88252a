"""``gpusched up``'s choice between a real node and kwok nodes, and the life of the process that holds the
real node (``gpusched.testenv.nodeholder``) as ``up`` and ``down`` see it: ``down`` stops the holder first
and waits for its teardown while the control plane still runs, reports an unclean teardown, and ``up`` reports
a holder that failed or died. No real node starts here (tests/e2e/test_quickstart.py runs one)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpusched.testenv import local, nodeholder, session
from gpusched.testenv.nodeholder import HolderFailedError, RealNodePlan

IMAGES = Path("/cache/node-images")


def _plan(missing: list[str] | None = None, lock_held: bool = False) -> RealNodePlan:
    return RealNodePlan(missing or [], None if missing else IMAGES, "$GPUSCHED_NODE_IMAGES", lock_held)


@pytest.fixture
def plan(monkeypatch: pytest.MonkeyPatch) -> list[RealNodePlan]:
    """What ``real_node_plan`` returns (the first item); raises if ``up`` asks when it should not."""
    box: list[RealNodePlan] = []

    def fake(bin_dir: Path) -> RealNodePlan:
        assert box, "real_node_plan was called"
        return box[0]

    monkeypatch.setattr(local, "real_node_plan", fake)
    return box


def test_kwok_never_looks_for_a_real_node(plan: list[RealNodePlan]) -> None:
    assert local._choose_real_node("kwok", None, Path("/bin")) is None


def test_auto_takes_the_real_node_where_it_can_run_and_says_where_the_images_come_from(
    plan: list[RealNodePlan], capsys: pytest.CaptureFixture[str]
) -> None:
    plan.append(_plan())
    assert local._choose_real_node("auto", None, Path("/bin")) == plan[0]
    assert f"node images from $GPUSCHED_NODE_IMAGES: {IMAGES}" in capsys.readouterr().out


def test_auto_falls_back_to_kwok_saying_why_and_real_refuses(
    plan: list[RealNodePlan], capsys: pytest.CaptureFixture[str]
) -> None:
    plan.append(_plan(["not running as root (containerd, the kubelet and CNI need it)"]))
    assert local._choose_real_node("auto", None, Path("/bin")) is None
    out = capsys.readouterr().out
    why = "gpusched up: kwok nodes (no container runs), as a real node cannot run here: not running as root"
    assert why in out, out
    with pytest.raises(session.TestEnvError, match="--node real: the real node cannot run here: not running"):
        local._choose_real_node("real", None, Path("/bin"))


def test_another_real_node_on_the_machine_means_kwok_for_auto_and_a_wait_for_real(
    plan: list[RealNodePlan], capsys: pytest.CaptureFixture[str]
) -> None:
    plan.append(_plan(lock_held=True))
    assert local._choose_real_node("auto", None, Path("/bin")) is None
    assert "kwok nodes, as another real node runs on this machine" in capsys.readouterr().out
    assert local._choose_real_node("real", None, Path("/bin")) == plan[0]
    assert "waiting up to 600 s for it to go" in capsys.readouterr().out


def test_more_than_one_node_means_kwok(plan: list[RealNodePlan], capsys: pytest.CaptureFixture[str]) -> None:
    assert local._choose_real_node("auto", 3, Path("/bin")) is None  # plan never asked
    assert "kwok nodes, as --nodes 3 asks" in capsys.readouterr().out
    with pytest.raises(session.TestEnvError, match="not --nodes 3; use --node kwok"):
        local._choose_real_node("real", 3, Path("/bin"))
    with pytest.raises(session.TestEnvError, match="expected one of auto, real, kwok"):
        local._choose_real_node("both", None, Path("/bin"))


def test_kwok_nodes_need_kwok(tmp_path: Path) -> None:
    with pytest.raises(session.TestEnvError, match="asked for 2 node"):
        session.testenv_up(tmp_path, 2, 4, True, bin_dir=tmp_path, kwok=False)


# ------------------------------------------------------------------------------------ the holder's life

# A stand-in holder: on SIGTERM it takes `delay` seconds (as the real one deletes the node's pods through the
# apiserver), notes whether the apiserver stand-in still runs at the end, and writes its marker.
HOLDER = textwrap.dedent(
    """
    import json, os, signal, sys, time
    workdir, apiserver, delay, status = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    def stop(*_):
        time.sleep(delay)
        try:
            os.kill(apiserver, 0)
            alive = not open(f"/proc/{apiserver}/stat").read().split(") ")[1].startswith("Z")
        except OSError:
            alive = False
        open(os.path.join(workdir, "apiserver-alive-at-teardown"), "w").write(str(alive))
        doc = {"status": status, "error": "cgroups left: /sys/fs/cgroup/memory/kubepods"}
        open(os.path.join(workdir, "real-node.json"), "w").write(json.dumps(doc))
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    open(os.path.join(workdir, "real-node.json"), "w").write(json.dumps({"status": "ready"}))
    while True:
        time.sleep(1)
    """
)


def _up_with_holder(tmp_path: Path, status: str) -> tuple[Path, list[subprocess.Popen[bytes]]]:
    state_dir = tmp_path / "state"
    workdir = state_dir / session.WORKDIR
    workdir.mkdir(parents=True)
    apiserver = subprocess.Popen(["sleep", "300"], start_new_session=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(workdir), str(apiserver.pid), "1.5", status],
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while not (workdir / "real-node.json").exists():  # its SIGTERM handler is in place
        assert time.monotonic() < deadline and holder.poll() is None
        time.sleep(0.05)
    state = session.TestEnvState(
        kubeconfig="k", server="s", workdir=str(workdir), nodes=[], processes=[], started_at=time.time()
    )
    session.write_state(state_dir, state)
    # as cluster_up records them: the control plane first, then the holder and the node's daemons
    state = session.add_processes(state_dir, state, {"kube-apiserver": apiserver.pid})
    session.add_processes(state_dir, state, {nodeholder.HOLDER: holder.pid}, nodes=["gpu-node-0"])
    return workdir, [apiserver, holder]


def _reap(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_down_stops_the_real_node_first_while_the_control_plane_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workdir, procs = _up_with_holder(tmp_path, "stopped")
    seen = tmp_path / "seen"
    original = session._remove_state

    def keep_a_copy(state_dir: Path) -> None:
        seen.write_text((workdir / "apiserver-alive-at-teardown").read_text())
        original(state_dir)

    monkeypatch.setattr(session, "_remove_state", keep_a_copy)
    try:
        assert session.testenv_down(tmp_path / "state", quiet=True) is True
        assert [p.wait(timeout=5) is not None for p in procs] == [True, True]
        assert seen.read_text() == "True"  # the apiserver still ran when the node's teardown ended
        assert not (tmp_path / "state").exists()
    finally:
        _reap(procs)


def test_down_reports_a_real_node_that_was_not_cleanly_removed(tmp_path: Path) -> None:
    _, procs = _up_with_holder(tmp_path, "unclean")
    try:
        with pytest.raises(session.TestEnvError, match="not cleanly removed: cgroups left: /sys/fs/cgroup"):
            session.testenv_down(tmp_path / "state", quiet=True)
        assert not (tmp_path / "state").exists()  # the next `up` is not blocked by it
    finally:
        _reap(procs)


def test_up_reports_a_holder_that_failed_or_died(tmp_path: Path) -> None:
    log = tmp_path / "real-node.log"
    log.write_text("starting\n")
    failed = subprocess.Popen([sys.executable, "-c", (
        "import json, sys, time; open(sys.argv[1] + '/real-node.json', 'w').write("
        "json.dumps({'status': 'failed', 'error': 'no CNI plugin /usr/lib/cni/bridge'})); time.sleep(30)"
    ), str(tmp_path)])  # fmt: skip
    try:
        with pytest.raises(HolderFailedError, match="did not start: no CNI plugin /usr/lib/cni/bridge"):
            nodeholder.wait_ready(tmp_path, failed.pid, log, timeout=30)
    finally:
        _reap([failed])
    (tmp_path / "real-node.json").unlink()
    died = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(HolderFailedError, match=r"holder exited \(3\)(.|\n)*starting"):
        nodeholder.wait_ready(tmp_path, died.pid, log, timeout=30)
    slow = subprocess.Popen(["sleep", "30"])  # no marker: not ready in time; the log tail says where it was
    try:
        with pytest.raises(HolderFailedError, match=r"not ready after 0 s(.|\n)*starting"):
            nodeholder.wait_ready(tmp_path, slow.pid, log, timeout=0.2)
    finally:
        _reap([slow])
    ready = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "real-node.json").write_text(json.dumps({"status": "ready", "node": "gpu-node-0"}))
        assert nodeholder.wait_ready(tmp_path, ready.pid, log, timeout=30)["node"] == "gpu-node-0"
    finally:
        _reap([ready])


def test_the_plan_checks_parts_then_images_then_another_node_then_a_left_bridge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    missing: list[str] = []
    running = [False]
    monkeypatch.setattr(nodeholder, "missing_parts", lambda bin_dir: missing)
    monkeypatch.setattr(nodeholder, "find_node_images", lambda **kw: calls.append("images") or IMAGES)
    monkeypatch.setattr(nodeholder, "another_real_node_runs", lambda: running[0])
    monkeypatch.setattr(nodeholder, "BRIDGE", "lo")  # a link that exists: as if a bridge were left
    monkeypatch.delenv("GPUSCHED_NODE_IMAGES", raising=False)

    plan = nodeholder.real_node_plan(Path("/bin"))
    left = "the bridge lo exists (left by a real node that did not stop cleanly: ip link del lo)"
    assert not plan.possible and plan.missing == [left]
    assert plan.images_from == "hack/build-node-images.sh (built once, then cached)"
    running[0] = True  # the bridge is that node's: wait for it, do not call it left over
    plan = nodeholder.real_node_plan(Path("/bin"))
    assert plan.possible and plan.lock_held and plan.images == IMAGES
    missing.append("no 'containerd' on PATH (apt-get install -y containerd)")
    calls.clear()
    plan = nodeholder.real_node_plan(Path("/bin"))
    assert plan.missing == missing and not calls  # no image build for a machine that cannot run the node
