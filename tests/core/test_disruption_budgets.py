"""PodDisruptionBudgets as data: the Eviction API's rule (may_disrupt) and kube-scheduler's
violation count (split), one test per rule, and a property tying the two together."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from builders import pod
from gpusched.core.disruption import DisruptionBudget, DisruptionBudgets
from gpusched.core.selectors import LabelSelector

APP_A = LabelSelector((("app", "a"),))


def budget(allowed: int, selector: LabelSelector = APP_A) -> DisruptionBudget:
    return DisruptionBudget(f"pdb-{allowed}", "default", selector, allowed)


def test_may_disrupt_only_while_every_covering_budget_allows_one() -> None:
    a = pod("a", labels={"app": "a"})
    assert DisruptionBudgets((budget(1),)).may_disrupt(a)
    blocked = DisruptionBudgets((budget(0),))
    assert not blocked.may_disrupt(a)
    assert [b.name for b in blocked.blocking(a)] == ["pdb-0"]
    assert blocked.may_disrupt(pod("b", labels={"app": "b"}))  # not selected
    assert blocked.may_disrupt(pod("a", labels={"app": "a"}, namespace="x"))  # other namespace
    # a pod the budget counts as disrupted already costs nothing again
    assert DisruptionBudgets((budget(0),), {"default/pdb-0": frozenset({"a"})}).may_disrupt(a)


def test_an_empty_selector_covers_the_namespace_for_eviction_but_not_for_preemption() -> None:
    a = pod("a", labels={"app": "a"})
    every = DisruptionBudgets((budget(0, LabelSelector()),))
    assert not every.may_disrupt(a)
    assert every.split([a]) == ([], [a])  # kube-scheduler: an empty selector matches nothing


def test_split_counts_in_order_as_kube_scheduler_does() -> None:
    pods = [pod(f"p{i}", labels={"app": "a"}) for i in range(4)]
    violating, fine = DisruptionBudgets((budget(2),)).split(pods)
    assert [p.name for p in fine] == ["p0", "p1"]
    assert [p.name for p in violating] == ["p2", "p3"]
    violating, fine = DisruptionBudgets((budget(1),), {"default/pdb-1": frozenset({"p0"})}).split(pods)
    assert [p.name for p in fine] == ["p0", "p1"]
    assert DisruptionBudgets((budget(0),)).split([pod("bare")]) == ([], [pod("bare")])


@given(
    allowed=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    apps=st.lists(st.sampled_from("abc"), max_size=8),
)
def test_split_finds_no_violation_exactly_when_all_may_go_together(
    allowed: list[int], apps: list[str]
) -> None:
    budgets = DisruptionBudgets(
        tuple(
            DisruptionBudget(f"b{i}", "default", LabelSelector((("app", "abc"[i]),)), n)
            for i, n in enumerate(allowed)
        )
    )
    pods = [pod(f"p{i}", labels={"app": a}) for i, a in enumerate(apps)]
    violating, fine = budgets.split(pods)
    assert len(violating) + len(fine) == len(pods)
    assert (not violating) == budgets.allowed_together(pods)
    assert budgets.allowed_together(fine)
