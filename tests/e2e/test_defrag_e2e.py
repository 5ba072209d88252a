"""The defragmentation controller (``gpusched defrag run``) on the real control plane.

Two kwok nodes of 8 GPUs, fragmented by share pods of Deployments (600 milli each, so no two
share a GPU): fillers pinned to each node first leave two GPUs free per node, the shares land
two per node, the fillers go. Then an 8-GPU pod waits: no node has 8 free GPUs, 12 are free in
all. The standalone scheduler (which keeps the nominated room) and the controller run
in-process; kube-controller-manager recreates every evicted share (its Deployment) and keeps
the PodDisruptionBudgets' status.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_standalone import Env, _http
from typer.testing import CliRunner

from gpusched.cli.commands import app
from gpusched.defrag.controller import ControllerConfig, DefragController
from gpusched.defrag.ledger import LeaseLedger
from gpusched.doctor.books import Books
from gpusched.doctor.source import from_api
from gpusched.k8s.convert import ANN_ASSIGNMENT, RES_GPU, RES_MILLI
from gpusched.k8s.reservation import ANN_ROOM, PlanRecord, room_annotation
from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler
from gpusched.testenv import ControlPlane, free_port, wait_until

pytestmark = pytest.mark.e2e

PIN = "gpusched.io/e2e-node"
LEASE = "gpusched-defrag"
HOLD = "gpusched.io/e2e-hold"


class DefragEnv(Env):
    def __init__(self, cp: ControlPlane) -> None:
        from kubernetes import client

        super().__init__(cp)
        self.apps = client.AppsV1Api(self.api)
        self.policy = client.PolicyV1Api(self.api)
        self.coord = client.CoordinationV1Api(self.api)
        self.nodes(
            [(f"{self.tag}-n{i}", 64_000, 262_144, 8, "A100") for i in (1, 2)],
            labels={f"{self.tag}-n{i}": {PIN: f"{self.tag}-n{i}"} for i in (1, 2)},
        )
        self.n1, self.n2 = f"{self.tag}-n1", f"{self.tag}-n2"
        # unschedulable pods retried every 5 s: a lapsed room frees its node within seconds
        cfg = SchedulerConfig(scheduler_name=self.scheduler, defrag_lease=f"{self.ns}/{LEASE}", flush_s=5.0)
        self.sched = StandaloneScheduler(self.api, cfg).start()

    def filler(self, name: str, node: str, gpus: int) -> None:
        body = self.pod(name, {RES_GPU: str(gpus)})
        body["spec"]["nodeSelector"][PIN] = node
        self.create_pods([body])

    def bare(self, names: list[str], on: str) -> None:
        """Bare 1-GPU pods (no ownerReferences, not pinned: the planner may send them anywhere),
        placed on ``on`` by filling the other node's free GPUs for the time they bind."""
        other = self.n2 if on == self.n1 else self.n1
        used = sum(1 for n in self.running().values() if n == other)
        before = len(self.running())
        self.filler(f"fill-{names[0]}", other, 8 - used)
        wait_until(lambda: len(self.running()) == before + 1, timeout=60, what="the filler bound")
        self.create_pods([self.pod(n, {RES_GPU: "1"}) for n in names])
        wait_until(
            lambda: all(self.running().get(n) == on for n in names), timeout=60, what="bare pods bound"
        )
        self.v1.delete_namespaced_pod(
            f"fill-{names[0]}", self.ns, grace_period_seconds=0, _preload_content=False
        )
        wait_until(lambda: f"fill-{names[0]}" not in self.running(), timeout=60, what="the filler gone")

    def bare_share(self, name: str, node: str, milli: int) -> None:
        body = self.pod(name, {RES_MILLI: str(milli)})
        body["spec"]["nodeSelector"][PIN] = node
        self.create_pods([body])

    def deployment(
        self, app: str, replicas: int, finalizer: bool = False, milli: int = 600, node: str = "",
        res: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        """``res``: what each pod asks for (a share of ``milli`` when not given)."""
        template = self.pod("x", res or {RES_MILLI: str(milli)}, labels={"app": app})
        if node:
            template["spec"]["nodeSelector"][PIN] = node
        meta = {"labels": {"app": app}}
        if finalizer:
            meta["finalizers"] = [HOLD]  # type: ignore[assignment]
        body = {
            "metadata": {"name": app, "namespace": self.ns},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": app}},
                "template": {"metadata": meta, "spec": template["spec"]},
            },
        }
        self.apps.create_namespaced_deployment(self.ns, body, _preload_content=False)

    def running(self, app: str | None = None) -> dict[str, str]:
        """Bound, not terminating pods (of ``app``) → node."""
        return {
            p["metadata"]["name"]: p["spec"]["nodeName"]
            for p in self.list_pods()
            if p["spec"].get("nodeName")
            and not p["metadata"].get("deletionTimestamp")
            and (app is None or p["metadata"].get("labels", {}).get("app") == app)
        }

    def place(self, app: str, replicas: int, on: str, finalizer: bool = False) -> None:
        """``replicas`` shares of Deployment ``app`` onto node ``on``: the other node is filled."""
        other = self.n2 if on == self.n1 else self.n1
        free_on = self.running()
        used = {n: 0 for n in (self.n1, self.n2)}
        for n in free_on.values():
            used[n] += 1
        self.filler(f"fill-{app}-other", other, 8 - used[other])
        self.filler(f"fill-{app}-on", on, 8 - used[on] - replicas)
        wait_until(lambda: len(self.running()) == len(free_on) + 2, timeout=60, what="fillers bound")
        self.deployment(app, replicas, finalizer)
        wait_until(lambda: len(self.running(app)) == replicas, timeout=60, what=f"{app} bound")
        for f in (f"fill-{app}-other", f"fill-{app}-on"):
            self.v1.delete_namespaced_pod(f, self.ns, grace_period_seconds=0, _preload_content=False)
        wait_until(lambda: len(self.running()) == len(free_on) + replicas, timeout=60, what="fillers gone")

    def big(self) -> None:
        self.create_pods([self.pod("big", {RES_GPU: "8"})])

    def pdb(self, app: str, min_available: int) -> None:
        body = {
            "metadata": {"name": f"pdb-{app}", "namespace": self.ns},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}},
        }
        self.policy.create_namespaced_pod_disruption_budget(self.ns, body, _preload_content=False)

        def settled() -> bool:
            resp = self.policy.read_namespaced_pod_disruption_budget(
                f"pdb-{app}", self.ns, _preload_content=False
            )
            st = json.loads(resp.data).get("status") or {}
            return st.get("currentHealthy") == min_available and "disruptionsAllowed" in st

        wait_until(settled, timeout=60, what=f"PDB of {app} computed")

    def controller(self, **kw: Any) -> DefragController:
        kw.setdefault("lease_namespace", self.ns)  # its record: the Lease the scheduler reads
        cfg = ControllerConfig(
            scheduler_name=self.scheduler, wait_s=2.0, interval_s=0.5, poll_s=0.2, bind_timeout_s=60, **kw
        )
        kubeconfig = str(self.cp.kubeconfig_path)
        return DefragController(self.api, lambda: Books.of(from_api(kubeconfig, queues=False)), cfg)

    def moved_events(self) -> list[dict[str, Any]]:
        return self.events("Defragmented")

    def unhold(self) -> None:
        for p in self.list_pods():
            if p["metadata"].get("finalizers"):
                patch = {"metadata": {"finalizers": None}}
                self.v1.patch_namespaced_pod(p["metadata"]["name"], self.ns, patch, _preload_content=False)

    def cleanup(self) -> None:
        self.sched.stop()
        self.unhold()
        super().cleanup()


@pytest.fixture
def denv(control_plane: ControlPlane) -> Iterator[DefragEnv]:
    e = DefragEnv(control_plane)
    try:
        yield e
    finally:
        e.cleanup()


def counter(ctl: DefragController, name: str, **labels: str) -> float:
    v = ctl.metrics.registry.get_sample_value(name, labels or None)
    return float(v or 0.0)


def test_the_controller_moves_only_the_planned_pods_and_the_8_gpu_pod_lands(denv: DefragEnv) -> None:
    denv.place("a", 2, denv.n1)
    denv.place("b", 2, denv.n2)
    before = denv.running()
    denv.big()
    ctl = denv.controller().start()
    try:
        wait_until(lambda: bool(ctl.attempts), timeout=120, what="a plan carried out")
    finally:
        ctl.stop()
    (attempt,) = ctl.attempts
    assert attempt.result == "completed", attempt
    assert len(attempt.moves) == 2  # the fewest: one node's two shares
    big = next(p for p in denv.list_pods() if p["metadata"]["name"] == "big")
    target = big["spec"]["nodeName"]
    assert target in (denv.n1, denv.n2)
    # only the planned pods moved: the others run where they ran
    evicted = {k.split("/")[1] for k in attempt.moves}
    assert evicted == {p for p, n in before.items() if n == target}
    after = denv.running()
    assert all(after.get(p) == n for p, n in before.items() if p not in evicted)
    # their replacements run on the other node, none on the 8-GPU pod's
    assert sum(1 for p, n in after.items() if n == target) == 1  # big alone
    events = denv.moved_events()
    assert {e["involvedObject"]["name"] for e in events} == evicted
    assert all(f"{denv.ns}/big" in e["message"] for e in events)
    assert counter(ctl, "gpusched_defrag_moves_total") == 2
    assert counter(ctl, "gpusched_defrag_plans_total", result="completed") == 1
    assert counter(ctl, "gpusched_defrag_gain_gpus_total") == 8


def test_a_pdb_at_its_limit_keeps_its_pods_and_the_plan_routes_around_it(denv: DefragEnv) -> None:
    denv.place("held", 2, denv.n1)
    denv.place("free", 2, denv.n2)
    denv.pdb("held", 2)  # disruptionsAllowed 0
    held = denv.running("held")
    denv.big()
    # the dry run against the live cluster: the PDB named, its pods kept, the other node emptied
    kubeconfig = str(denv.cp.kubeconfig_path)
    res = CliRunner().invoke(app, ["defrag", "plan", f"{denv.ns}/big", "--kubeconfig", kubeconfig, "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    (dry,) = report["plans"]
    assert dry["feasible"] and [p["node"] for p in dry["placements"]] == [denv.n2]
    assert {m["pod"].split("/")[1] for m in dry["moves"]} == set(denv.running("free"))
    budgets = {b["budget"]: b for b in report["budgets"]}
    assert budgets[f"{denv.ns}/pdb-held"] == {
        "budget": f"{denv.ns}/pdb-held", "allowed": 0, "used": 0, "holds": 2,
    }  # fmt: skip
    ctl = denv.controller().start()
    try:
        wait_until(lambda: bool(ctl.attempts), timeout=120, what="a plan carried out")
    finally:
        ctl.stop()
    (attempt,) = ctl.attempts
    assert attempt.result == "completed", attempt
    assert denv.running("held") == held  # untouched
    big = next(p for p in denv.list_pods() if p["metadata"]["name"] == "big")
    assert big["spec"]["nodeName"] == denv.n2
    moved = {k.split("/")[1] for k in attempt.moves}
    assert moved == {m["pod"].split("/")[1] for m in dry["moves"]}  # as the dry run said
    assert {e["involvedObject"]["name"] for e in denv.moved_events()} == moved
    assert counter(ctl, "gpusched_defrag_evictions_total", outcome="blocked") == 0


def test_a_plan_whose_pending_pod_disappears_midway_is_abandoned(denv: DefragEnv) -> None:
    denv.place("a", 2, denv.n1, finalizer=True)  # an evicted share stays Terminating until released
    denv.place("b", 2, denv.n2, finalizer=True)
    denv.big()
    ctl = denv.controller(leave_timeout_s=120).start()
    try:

        def terminating() -> list[str]:
            return [p["metadata"]["name"] for p in denv.list_pods() if p["metadata"].get("deletionTimestamp")]

        wait_until(lambda: bool(terminating()), timeout=120, what="the first eviction")
        first = terminating()
        denv.v1.delete_namespaced_pod("big", denv.ns, _preload_content=False)
        wait_until(
            lambda: "big" not in {p["metadata"]["name"] for p in denv.list_pods()},
            timeout=30,
            what="big gone",
        )
        denv.unhold()  # the first evicted share may leave now
        wait_until(lambda: bool(ctl.attempts), timeout=60, what="the plan to end")
        time.sleep(2)  # a few more cycles: nothing more happens
    finally:
        ctl.stop()
    (attempt,) = ctl.attempts
    assert (attempt.result, attempt.reason) == ("abandoned", "pending-pod-gone")
    assert len(attempt.moves) == 1 and len(first) == 1
    assert [e["involvedObject"]["name"] for e in denv.moved_events()] == first
    assert counter(ctl, "gpusched_defrag_moves_total") == 1
    assert counter(ctl, "gpusched_defrag_plans_abandoned_total", reason="pending-pod-gone") == 1
    assert not any(ANN_ROOM in (p["metadata"].get("annotations") or {}) for p in denv.list_pods())


def test_defrag_run_takes_its_lease_and_serves_probes_and_metrics(denv: DefragEnv, tmp_path: Path) -> None:
    """``gpusched defrag run`` as the chart runs it: leader-elected on its own Lease."""
    port = free_port()
    cmd = [
        *(
            sys.executable,
            "-m",
            "gpusched.cli",
            "defrag",
            "run",
            "--kubeconfig",
            str(denv.cp.kubeconfig_path),
        ),
        *("--scheduler-name", denv.scheduler, "--namespace", denv.ns, "--lease-name", f"defrag-{denv.tag}"),
        *("--port", str(port), "--wait", "3600"),
    ]
    with (tmp_path / "defrag.log").open("ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _http(port, "/readyz") == 200, timeout=180, what="defrag run ready")

        def leading() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            return f'leader_election_master_status{{name="defrag-{denv.tag}"}} 1.0' in text

        wait_until(leading, timeout=60, what="the Lease taken")
        lease = denv.coord.read_namespaced_lease(f"defrag-{denv.tag}", denv.ns)
        assert lease.spec.holder_identity
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0, (tmp_path / "defrag.log").read_text()[-2000:]
    lease = denv.coord.read_namespaced_lease(f"defrag-{denv.tag}", denv.ns)
    assert not lease.spec.holder_identity  # released on the way out


def cli_json(denv: DefragEnv, *args: str) -> dict[str, Any]:
    res = CliRunner().invoke(app, [*args, "--kubeconfig", str(denv.cp.kubeconfig_path), "--json"])
    assert res.exit_code == 0, res.output
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def assigned(denv: DefragEnv, *apps: str) -> list[list[int]]:
    """The GPUs of the running, not terminating pods of ``apps``, as their assignments say."""
    out = []
    for p in denv.list_pods():
        meta = p["metadata"]
        mine = (meta.get("labels") or {}).get("app") in apps
        if mine and p["spec"].get("nodeName") and not meta.get("deletionTimestamp"):
            out.append(list(json.loads(meta["annotations"][ANN_ASSIGNMENT])["gpus"]))
    return out


def test_bare_pods_are_never_moved_and_the_plan_doctor_and_controller_say_why(denv: DefragEnv) -> None:
    """Issue 28 F2's reproduction: three bare 1-GPU pods (no ownerReferences), two on n1 and one on
    n2, and an 8-GPU pod of the same priority waits. Before: bare-2 was evicted 'to run on n1' and
    was lost. Now nothing moves, and each report names the bare pods."""
    denv.bare(["bare-0", "bare-1"], denv.n1)
    denv.bare(["bare-2"], denv.n2)
    before = denv.running()
    assert before == {"bare-0": denv.n1, "bare-1": denv.n1, "bare-2": denv.n2}
    denv.big()
    ctl = denv.controller().start()
    try:
        wait_until(lambda: bool(ctl.attempts), timeout=60, what="a defragmentation cycle")
        time.sleep(3)  # a few more cycles (wait_s is 2 s): nothing moves in any
    finally:
        ctl.stop()
    assert denv.running() == before  # none evicted, none lost
    assert denv.moved_events() == []
    assert counter(ctl, "gpusched_defrag_moves_total") == 0
    assert all(a.result == "infeasible" and "no controller owns it" in a.reason for a in ctl.attempts)
    big = next(p for p in denv.list_pods() if p["metadata"]["name"] == "big")
    assert not big["spec"].get("nodeName") and ANN_ROOM not in (big["metadata"].get("annotations") or {})
    (dry,) = cli_json(denv, "defrag", "plan", f"{denv.ns}/big")["plans"]
    assert not dry["feasible"] and dry["moves"] == []
    assert {k["pod"]: k["why"] for k in dry["kept"]} == {f"{denv.ns}/{n}": "no-controller" for n in before}
    report = cli_json(denv, "doctor", "pod", f"{denv.ns}/big")
    kinds = {c["kind"]: c for c in report["counterfactuals"]}
    assert "moves" not in kinds and f"{denv.ns}/bare-2 (no controller owns it" in kinds["kept"]["message"]


def test_a_restart_does_not_allow_a_second_move_in_the_window(denv: DefragEnv) -> None:
    """Issue 28 F2b: one move per window. The first controller moves one share so that an 8-GPU pod
    lands; a new controller process (same Lease) then finds a 7-GPU pod that one move would let in,
    and moves nothing: the window's move is read back from the Lease."""
    denv.place("a", 1, denv.n1)
    denv.place("b", 1, denv.n2)
    denv.big()
    first = denv.controller(max_moves_per_window=1).start()
    try:
        wait_until(lambda: bool(first.attempts), timeout=120, what="the first plan carried out")
    finally:
        first.stop()
    (done,) = first.attempts
    assert done.result == "completed" and len(done.moves) == 1
    lease = json.loads(denv.coord.read_namespaced_lease(LEASE, denv.ns, _preload_content=False).data)
    assert done.moves[0] in lease["metadata"]["annotations"]["gpusched.io/defrag-moves"]
    # a new target that one move lets in: big's node held by a bare filler but one GPU, the other
    # node with its two shares on two GPUs; a 7-GPU pod waits
    target = denv.running()["big"]
    denv.v1.delete_namespaced_pod("big", denv.ns, grace_period_seconds=0, _preload_content=False)
    wait_until(lambda: "big" not in denv.running(), timeout=30, what="big gone")
    denv.filler("hold", target, 7)
    wait_until(lambda: "hold" in denv.running(), timeout=60, what="the filler bound")
    denv.create_pods([denv.pod("seven", {RES_GPU: "7"})])
    time.sleep(2.5)  # older than wait_s
    other = denv.controller(max_moves_per_window=1, lease_name="another-lease")  # a fresh record
    restarted = denv.controller(max_moves_per_window=1)  # a new process on the same Lease
    try:
        books = other.read()
        assert other._plan(books, [books.pending[f"{denv.ns}/seven"]]).move_count == 1  # one move would do
        attempt = restarted.run_once()
    finally:
        other.stop()
        restarted.stop()
    assert attempt is not None and attempt.result == "infeasible", attempt
    assert counter(restarted, "gpusched_defrag_moves_total") == 0
    assert len(denv.moved_events()) == 1  # the first move only


def test_a_share_moves_to_another_gpu_of_its_node_and_the_1_gpu_pod_lands(denv: DefragEnv) -> None:
    """Issue 29 item 8: two shares (400 milli, of Deployments) on two GPUs of n1, the rest of n1 and
    all of n2 held by bare pods; a 1-GPU pod waits. Doctor finds the one move within the node; the
    controller makes it (the share's replacement lands on the other share's GPU) and the pod lands
    on the freed GPU."""
    n1 = denv.n1
    denv.filler("rest-n2", denv.n2, 8)
    denv.filler("rest-n1", n1, 6)
    denv.filler("tmp", n1, 1)
    wait_until(lambda: len(denv.running()) == 3, timeout=60, what="fillers bound")
    denv.deployment("s1", 1, milli=400, node=n1)  # on n1's last free GPU
    wait_until(lambda: len(denv.running("s1")) == 1, timeout=60, what="s1 bound")
    denv.v1.delete_namespaced_pod("tmp", denv.ns, grace_period_seconds=0, _preload_content=False)
    denv.bare_share("top-up", n1, 600)  # fills s1's GPU, so s2 takes the GPU tmp held
    wait_until(lambda: "top-up" in denv.running() and "tmp" not in denv.running(), timeout=60, what="top-up")
    denv.deployment("s2", 1, milli=400, node=n1)
    wait_until(lambda: len(denv.running("s2")) == 1, timeout=60, what="s2 bound")
    denv.v1.delete_namespaced_pod("top-up", denv.ns, grace_period_seconds=0, _preload_content=False)
    wait_until(lambda: "top-up" not in denv.running(), timeout=30, what="top-up gone")
    gpus = assigned(denv, "s1", "s2")
    assert len(gpus) == 2 and gpus[0] != gpus[1]  # two shares on two GPUs of one node
    denv.create_pods([denv.pod("one", {RES_GPU: "1"})])
    report = cli_json(denv, "doctor", "pod", f"{denv.ns}/one")
    first = report["counterfactuals"][0]
    assert first["kind"] == "moves" and first["cost"] == 1 and f"to another GPU of {n1}" in first["message"]
    (dry,) = cli_json(denv, "defrag", "plan", f"{denv.ns}/one")["plans"]
    (mv,) = dry["moves"]
    assert mv["from_node"] == mv["to_node"] == n1 and mv["from_gpus"] != mv["to_gpus"]
    ctl = denv.controller().start()
    try:
        wait_until(lambda: bool(ctl.attempts), timeout=120, what="the plan carried out")
    finally:
        ctl.stop()
    (attempt,) = ctl.attempts
    assert attempt.result == "completed" and len(attempt.moves) == 1, attempt
    one = next(p for p in denv.list_pods() if p["metadata"]["name"] == "one")
    assert one["spec"]["nodeName"] == n1
    landed = json.loads(one["metadata"]["annotations"][ANN_ASSIGNMENT])["gpus"]
    assert landed == mv["from_gpus"]
    shares = assigned(denv, "s1", "s2")
    assert len(shares) == 2 and shares[0] == shares[1] == mv["to_gpus"]  # both on one GPU of n1
    assert set(denv.running("s1").values()) | set(denv.running("s2").values()) == {n1}


def test_a_hand_written_room_does_not_keep_a_pod_off_and_a_stale_one_lapses(denv: DefragEnv) -> None:
    """Issue 28 F4: a pending pod that can never fit carries a room for all of n1 and a nomination
    there; a 1-GPU pod of equal priority pinned to n1 lands at once. A room written as the
    controller writes it, backed by its Lease, keeps it off (the message names the room) until it
    lapses."""
    room = room_annotation(denv.n1, tuple(range(8)), plan="forged", expires=time.time() + 600)
    body = denv.pod("squatter", {RES_GPU: "9"}, ann={ANN_ROOM: room})
    denv.create_pods([body])
    patch = {"status": {"nominatedNodeName": denv.n1}}
    denv.v1.patch_namespaced_pod_status("squatter", denv.ns, patch, _preload_content=False)
    pinned = denv.pod("victim", {RES_GPU: "1"})
    pinned["spec"]["nodeSelector"][PIN] = denv.n1
    denv.create_pods([pinned])
    wait_until(lambda: denv.running().get("victim") == denv.n1, timeout=30, what="the 1-GPU pod bound on n1")
    # the controller's record backs a room for 12 s: it holds, and the message names it
    expires = time.time() + 12
    ledger = LeaseLedger(denv.coord, denv.ns, LEASE, window_s=3600)  # as the controller writes it
    ledger.set_plan(PlanRecord("p-e2e", (f"{denv.ns}/squatter",), "", expires))
    room = room_annotation(denv.n1, tuple(range(8)), plan="p-e2e", expires=expires)
    denv.v1.patch_namespaced_pod("squatter", denv.ns, {"metadata": {"annotations": {ANN_ROOM: room}}},
                                 _preload_content=False)  # fmt: skip
    time.sleep(2.5)  # the scheduler's Lease cache
    late = denv.pod("late", {RES_GPU: "1"})
    late["spec"]["nodeSelector"][PIN] = denv.n1
    denv.create_pods([late])
    wait_until(lambda: any(e["involvedObject"]["name"] == "late" for e in denv.events("FailedScheduling")),
               timeout=30, what="late refused")  # fmt: skip
    assert "late" not in denv.running()
    held = f"Defragmentation holds: node {denv.n1} GPUs [0, 1, 2, 3, 4, 5, 6, 7] for {denv.ns}/squatter"
    late_events = [e for e in denv.events("FailedScheduling") if e["involvedObject"]["name"] == "late"]
    assert any(held in e["message"] for e in late_events), late_events
    wait_until(
        lambda: denv.running().get("late") == denv.n1, timeout=60, what="late bound once the room lapsed"
    )
    assert time.time() >= expires - 1
