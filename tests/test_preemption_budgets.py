"""DefaultPreemption with PodDisruptionBudgets: a choice that breaks no budget wins when one exists
(kube-scheduler's pickOneNodeForPreemption counts PDB violations first); otherwise the fewest
violations; within a node the victims that would break a budget are reprieved first."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from hypothesis import given
from hypothesis import strategies as st

import builders
from gpusched.core.cluster import ClusterState
from gpusched.core.disruption import DisruptionBudget, DisruptionBudgets
from gpusched.core.framework import Profile
from gpusched.core.model import PodSpec
from gpusched.core.policies import make_profile
from gpusched.core.scheduler import fits, schedule_one
from gpusched.core.selectors import LabelSelector
from gpusched.core.statement import Statement
from test_preemption import PROPS

node = partial(builders.node, gpus=2, cpu=64_000, mem=1 << 18, gmem=0)
whole = partial(builders.whole, cpu=1000, memory_mib=1024)
PROTECTED = {"app": "db"}


def protect(allowed: int = 0) -> DisruptionBudgets:
    return DisruptionBudgets((DisruptionBudget("db", "default", LabelSelector((("app", "db"),)), allowed),))


def prof(budgets: DisruptionBudgets) -> Profile:
    return make_profile("bestfit", preemption=True, budgets=lambda: budgets)


def test_a_victim_a_budget_protects_is_skipped_for_another_node() -> None:
    snap = ClusterState([node("n0", gpus=1), node("n1", gpus=1)])
    snap.assume(whole("db-0", priority=0, labels=PROTECTED), 0, (0,))
    snap.assume(whole("batch", priority=5), 1, (0,))
    urgent = whole("urgent", priority=100)
    # without budgets n0 wins (a lower-priority victim); with the budget, n1's victim breaks none
    assert schedule_one(prof(DisruptionBudgets()), urgent, snap).victims == ("default/db-0",)
    r = schedule_one(prof(protect()), urgent, snap)
    assert (r.nominated_node, r.victims) == (1, ("default/batch",))
    # a budget that allows one disruption protects nothing here
    assert schedule_one(prof(protect(1)), urgent, snap).victims == ("default/db-0",)


def test_on_one_node_the_protected_pod_is_reprieved_first() -> None:
    snap = ClusterState([node("n0", gpus=2)])
    # without budgets "web" is reprieved first (equal pods, by key) and "zz-db" goes
    snap.assume(whole("zz-db", priority=0, labels=PROTECTED), 0, (0,))
    snap.assume(whole("web", priority=0), 0, (1,))
    assert schedule_one(prof(DisruptionBudgets()), whole("u", priority=9), snap).victims == ("default/zz-db",)
    assert schedule_one(prof(protect()), whole("u", priority=9), snap).victims == ("default/web",)


def test_when_every_choice_breaks_a_budget_the_fewest_violations_win() -> None:
    snap = ClusterState([node("n0", gpus=2), node("n1", gpus=2)])
    for i in range(2):
        snap.assume(whole(f"db-a{i}", priority=0, labels=PROTECTED), 0, (i,))
    snap.assume(whole("db-b0", priority=0, labels=PROTECTED), 1, (0,))
    snap.assume(whole("web", priority=50), 1, (1,))
    # two GPUs: n0 breaks the budget twice; n1 once (and evicts a priority-50 pod): n1
    r = schedule_one(prof(protect()), whole("big", num=2, priority=100), snap)
    assert r.nominated_node == 1 and sorted(r.victims) == ["default/db-b0", "default/web"]


@PROPS
@given(
    layout=st.lists(st.lists(st.tuples(st.booleans(), st.integers(0, 3)), min_size=1, max_size=2), min_size=1,
                    max_size=4),
    want=st.integers(1, 2),
)  # fmt: skip
def test_no_protected_victim_when_a_choice_without_one_exists(
    layout: list[list[tuple[bool, int]]], want: int
) -> None:
    """Oracle: a node where evicting only unprotected lower-priority pods makes room exists
    exactly when preemption chooses no protected victim (a budget allowing none)."""
    snap = ClusterState([node(f"n{i}") for i in range(len(layout))])
    for n, pods in enumerate(layout):
        for g, (protected, prio) in enumerate(pods):
            labels = PROTECTED if protected else {"app": "web"}
            snap.assume(whole(f"p{n}-{g}", priority=prio, labels=labels), n, (g,))
    pod = whole("urgent", num=want, priority=10)
    profile = prof(protect())
    spare = False
    for n in range(len(snap)):
        with Statement(snap) as st_:
            for key in list(snap.node_pods[n]):
                a = snap.allocations[key]
                if a.pod.priority < 10 and a.pod.labels != PROTECTED:
                    st_.evict(key)
            spare |= fits(profile, pod, snap, n)
    r = schedule_one(profile, pod, snap, assume=False)
    if r.scheduled:
        return
    protected_victims = [k for k in r.victims if snap.allocations[k].pod.labels == PROTECTED]
    assert (not protected_victims) == spare or not r.victims
    if spare:
        assert r.victims and not protected_victims


def test_budgets_are_read_once_per_preemption() -> None:
    calls: list[int] = []

    def budgets() -> DisruptionBudgets:
        calls.append(1)
        return protect()

    snap = ClusterState([node("n0", gpus=1)])
    snap.assume(replace(whole("low"), priority=0), 0, (0,))
    schedule_one(make_profile("bestfit", preemption=True, budgets=budgets), whole("u", priority=5), snap)
    assert calls == [1]
    assert isinstance(whole("x"), PodSpec)
