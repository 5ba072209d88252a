"""``gpusched defrag plan``: the dry run on the standalone scheduler's books (``gpusched.defrag``)."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import builders
from builders import RS, node
from gpusched.cli.commands import app
from gpusched.core.cluster import ClusterState
from gpusched.core.defrag import DisruptionBudget, Method
from gpusched.core.selectors import LabelSelector
from gpusched.defrag.dryrun import dry_run
from gpusched.defrag.errors import UnknownTarget
from gpusched.doctor import Books, snapshot_of_state
from gpusched.doctor.snapshot import Snapshot, write_snapshot
from gpusched.k8s.convert import ANN_DEFRAG

# running pods that a ReplicaSet recreates: defragmentation may move them
share = partial(builders.share, controller=RS)
whole = partial(builders.whole, controller=RS)


def fragmented() -> ClusterState:
    """Two 2-GPU nodes, one share on each: a 2-GPU pod fits nowhere, one move makes room."""
    st = ClusterState([node("n1", 2), node("n2", 2)])
    st.assume(share("a", 400, labels={"app": "a"}), 0, [0])
    st.assume(share("b", 400, labels={"app": "b"}), 1, [1])
    return st


def books_of(st: ClusterState, pending: list[Any], opted_out: tuple[str, ...] = ()) -> Books:
    snap = snapshot_of_state(st, pending)
    for p in snap.pods:
        if p["metadata"]["name"] in opted_out:
            p["metadata"]["annotations"][ANN_DEFRAG] = "false"
    return Books.of(snap)


def budget(app_label: str, allowed: int) -> DisruptionBudget:
    return DisruptionBudget(f"pdb-{app_label}", "default", LabelSelector((("app", app_label),)), allowed)


def test_one_move_makes_room_and_the_report_says_what_it_buys() -> None:
    r = dry_run(books_of(fragmented(), [whole("p", 2)]))
    (pf,) = r.plans
    assert pf.pods == ("default/p",) and pf.plan.feasible and pf.plan.move_count == 1
    assert pf.plan.method in (Method.GREEDY, Method.MILP) and pf.plan.optimal
    (pl,) = pf.plan.placements
    moved = pf.plan.moves[0]
    assert pl.node == moved.from_node and moved.to_node != moved.from_node
    d = r.to_dict()
    assert d["gain"]["pods_landing"] == 1 and d["gain"]["gpus_landing"] == 2.0 and d["moves"] == 1


def test_a_budget_at_its_limit_keeps_its_pod_and_the_plan_moves_the_other() -> None:
    free = dry_run(books_of(fragmented(), [whole("p", 2)]))
    first = free.plans[0].plan.moves[0].pod
    other = "default/b" if first == "default/a" else "default/a"
    held = first.split("/")[1]
    budgets = [budget(held, 0), budget(other.split("/")[1], 1)]
    r = dry_run(books_of(fragmented(), [whole("p", 2)]), budgets)
    (pf,) = r.plans
    assert [m.pod for m in pf.plan.moves] == [other]
    uses = {b.key: b for b in r.budgets}
    assert uses[f"default/pdb-{held}"].holds == 1 and uses[f"default/pdb-{held}"].used == 0
    assert uses[f"default/pdb-{other.split('/')[1]}"].used == 1


def test_both_pods_held_by_budgets_or_opted_out_means_no_plan() -> None:
    r = dry_run(books_of(fragmented(), [whole("p", 2)], opted_out=("a",)), [budget("b", 0)])
    (pf,) = r.plans
    assert not pf.plan.feasible and pf.plan.moves == () and r.moves == 0
    assert r.to_dict()["gain"]["pods_landing"] == 0


def test_plans_of_one_run_share_the_room_and_move_no_pod_twice() -> None:
    st = ClusterState([node("n1", 2), node("n2", 2), node("n3", 2)])
    st.assume(share("a", 400), 0, [0])
    st.assume(share("b", 400), 1, [1])
    st.assume(share("c", 400), 2, [0])
    r = dry_run(books_of(st, [whole("p", 2), whole("q", 2)]))
    moved = [m.pod for pf in r.plans for m in pf.plan.moves]
    assert len(moved) == len(set(moved))
    landed = [pl.node for pf in r.plans if pf.plan.feasible for pl in pf.plan.placements]
    assert len(landed) == len(set(landed))  # two 2-GPU pods never on one 2-GPU node


def test_the_pdb_budgets_of_one_run_are_spent_across_its_plans() -> None:
    st = ClusterState([node("n1", 2), node("n2", 2), node("n3", 2), node("n4", 2)])
    for i, n in enumerate(range(4)):
        st.assume(share(f"s{i}", 300, labels={"app": "s"}), n, [0])
    r = dry_run(books_of(st, [whole("p", 2), whole("q", 2)]), [budget("s", 1)])
    assert r.moves == 1  # the budget allows one move in all: the second pod gets no plan
    assert sum(1 for pf in r.plans if pf.plan.move_count) == 1


def test_unknown_and_bound_pods_are_named() -> None:
    b = books_of(fragmented(), [whole("p", 2)])
    with pytest.raises(UnknownTarget, match="default/nope: no such pod"):
        dry_run(b, pod="nope")
    with pytest.raises(UnknownTarget, match="default/a is not pending: it is bound to node n1"):
        dry_run(b, pod="default/a")


def test_consolidation_reports_the_fragmentation_it_removes() -> None:
    r = dry_run(books_of(fragmented(), [whole("p", 2)]), consolidate_moves=2)
    (pf,) = r.plans
    assert pf.pods == () and 1 <= pf.plan.move_count <= 2
    assert r.frag_after_milli < r.frag_before_milli


# ----------------------------------------------------------------------------- command line
def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    res = CliRunner().invoke(app, list(args), env=env)
    return res.exit_code, res.stdout, res.stderr


def snapshot_file(tmp_path: Path) -> Path:
    snap: Snapshot = snapshot_of_state(fragmented(), [whole("p", 2)])
    return write_snapshot(tmp_path / "s.json", snap)


def test_cli_prints_the_moves_and_json(tmp_path: Path) -> None:
    f = snapshot_file(tmp_path)
    code, out, _ = run("defrag", "plan", "--snapshot", str(f))
    assert code == 0 and "default/p: 1 move(s)" in out and "lands on n" in out
    code, out, _ = run("defrag", "plan", "--snapshot", str(f), "--json")
    data = json.loads(out)
    assert code == 0 and data["moves"] == 1 and data["plans"][0]["for"] == ["default/p"]


def test_cli_bad_input_exits_2_with_one_clear_line(tmp_path: Path) -> None:
    f = snapshot_file(tmp_path)
    code, _, err = run("defrag", "plan", "nope", "--snapshot", str(f))
    assert code == 2 and "error: pod default/nope: no such pod" in err
    code, _, err = run("defrag", "plan", "--kubeconfig", str(tmp_path / "missing"))
    assert code == 2 and "cannot load kubeconfig" in err and "Traceback" not in err
