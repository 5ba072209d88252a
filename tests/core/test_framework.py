"""The framework: Reserve/Unreserve, typed cycle state and caches, PreFilter once per pod, the device
choice, profiles."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from builders import node, profile, share, whole, with_gpu_free
from gpusched.core.caches import LRUCache
from gpusched.core.cluster import ClusterState
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.framework import CycleState, Profile, StateKey
from gpusched.core.model import PodSpec
from gpusched.core.plugins.interpodaffinity import VERDICTS as AFFINITY_VERDICTS
from gpusched.core.plugins.interpodaffinity import InterPodAffinity
from gpusched.core.plugins.podtopologyspread import PodTopologySpread
from gpusched.core.policies import POLICIES, PolicyContext, make_profile
from gpusched.core.scheduler import ScheduleResult, choose_devices, fits, reserve, schedule_one, unreserve
from gpusched.core.selectors import LabelSelector, PodAffinityTerm, SpreadConstraint
from gpusched.core.status import Code, Status
from gpusched.core.workload import WorkloadSource, typical_workload


# ------------------------------------------------------------------------------ Reserve, Unreserve
class Recorder:
    def __init__(self, name: str, log: list[str], reserve_ok: bool = True) -> None:
        self.name, self.log, self.reserve_ok = name, log, reserve_ok

    def reserve(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> Status:
        self.log.append(f"reserve {self.name} assumed={pod.key in snap.allocations}")
        return Status.success() if self.reserve_ok else Status.unschedulable("no", self.name)

    def unreserve(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> None:
        self.log.append(f"unreserve {self.name}")


def _with(reserves: Sequence[Recorder]) -> Profile:
    base = make_profile("bestfit")
    return Profile("t", filters=base.filters, scores=base.scores, reserves=reserves)


def test_reserve_runs_before_the_assumption() -> None:
    log: list[str] = []
    snap = ClusterState([node("n", gpus=1)])
    r = schedule_one(_with([Recorder("r1", log), Recorder("r2", log)]), share("s", 100), snap)
    assert r.scheduled and log == ["reserve r1 assumed=False", "reserve r2 assumed=False"]
    assert "default/s" in snap.allocations


def test_reserve_failure_unreserves_the_earlier_ones_and_books_nothing() -> None:
    log: list[str] = []
    snap = ClusterState([node("n", gpus=1)])
    prof = _with([Recorder("r1", log), Recorder("r2", log, reserve_ok=False), Recorder("r3", log)])
    r = schedule_one(prof, share("s", 100), snap)
    assert not r.scheduled and r.status.plugin == "r2" and r.feasible_nodes == 1
    assert log == [
        "reserve r1 assumed=False",
        "reserve r2 assumed=False",
        "unreserve r1",
    ]  # last in first out
    assert snap.allocations == {} and snap.node_gpu_free(0) == [1000] and snap.verify() == []


def test_reserve_step_rolls_back_in_reverse_and_names_the_plugin() -> None:
    log: list[str] = []
    prof = _with([Recorder("r1", log), Recorder("r2", log), Recorder("r3", log, reserve_ok=False)])
    snap = ClusterState([node("n", gpus=1)])
    st = reserve(CycleState(), prof, share("s", 100), snap, 0)
    assert st.code == Code.UNSCHEDULABLE and st.plugin == "r3"
    assert [x.split(" assumed")[0] for x in log] == [
        "reserve r1", "reserve r2", "reserve r3", "unreserve r2", "unreserve r1"
    ]  # fmt: skip
    log.clear()
    unreserve(CycleState(), prof, share("s", 100), snap, 0)
    assert log == ["unreserve r3", "unreserve r2", "unreserve r1"]


# ------------------------------------------------------------------------------------ the cycle
def test_assume_false_books_nothing() -> None:
    snap = ClusterState([node("n", gpus=1)])
    schedule_one(make_profile("bestfit"), share("s", 100), snap)
    assert snap.node_gpu_free(0) == [900]
    r2 = schedule_one(make_profile("bestfit"), share("t", 100), snap, assume=False)
    assert isinstance(r2, ScheduleResult) and r2.scheduled and r2.gpus == (0,)
    assert "default/t" not in snap.allocations and snap.node_gpu_free(0) == [900]


def test_score_cache_drops_the_least_recently_used_entry() -> None:
    from gpusched.core.caches import LRUCache

    c: LRUCache[str, int] = LRUCache(capacity=2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1  # "a" is now the most recently used
    c.put("c", 3)
    assert c.keys() == ["a", "c"] and c.get("b") is None and c.get("missing") is None
    c.put("a", 10)  # overwriting refreshes too
    c.put("d", 4)
    assert c.keys() == ["a", "d"]
    assert c.pop("a") == 10 and c.pop("a") is None and c.keys() == ["d"]
    with pytest.raises(ValueError, match="capacity must be positive"):
        LRUCache(0)


# ------------------------------------------------------------------------------- typed cycle state
def test_state_keys_carry_their_type_and_compare_by_identity() -> None:
    a: StateKey[int] = StateKey("same-name")
    b: StateKey[str] = StateKey("same-name")
    state = CycleState()
    assert state.read(a) is None and a not in state
    state.write(a, 3)
    state.write(b, "x")
    assert state.read(a) == 3 and state.read(b) == "x"  # same name, two keys: no clash
    assert a in state and repr(a) == "StateKey('same-name')"


# ------------------------------------------------------------------- PreFilter, once per pod
ZONE = "zone"
HOST = "kubernetes.io/hostname"


def _zoned() -> ClusterState:
    nodes = [
        node(f"n{i}", gpus=1, labels={ZONE: "ab"[i % 2], "kubernetes.io/hostname": f"n{i}"}) for i in range(4)
    ]
    snap = ClusterState(nodes)
    for i in range(4):
        snap.assume(share(f"web{i}", 100, labels={"app": "web"}), i, [0])
    return snap


@pytest.mark.parametrize("plugin", [InterPodAffinity, PodTopologySpread])
def test_pre_filter_computes_the_verdicts_once_per_pod(plugin: type, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = plugin._verdicts

    def counting(self: object, *args: object) -> object:
        calls.append(plugin.__name__)
        return real(self, *args)

    monkeypatch.setattr(plugin, "_verdicts", counting)
    web = LabelSelector((("app", "web"),))
    if plugin is InterPodAffinity:  # anti-affinity to every web pod by host: fits nowhere
        p = share("p", 100, pod_anti_affinity=(PodAffinityTerm("kubernetes.io/hostname", web),))
    else:  # a zone spread over web pods that the nodes' label makes impossible: "ab" only
        p = share("p", 100, spread=(SpreadConstraint("missing", max_skew=1, selector=web),))
    r = schedule_one(make_profile("bestfit"), p, _zoned(), diagnose_failures=True)
    assert not r.scheduled and r.diagnosis is not None and len(r.diagnosis.failures) == 4
    # Filter and every node's explain read what PreFilter wrote: one pass over the running pods
    assert calls == [plugin.__name__]


def test_filter_without_pre_filter_runs_it_itself() -> None:
    web = LabelSelector((("app", "web"),))
    p = share("p", 100, pod_anti_affinity=(PodAffinityTerm("kubernetes.io/hostname", web),))
    snap = _zoned()
    state = CycleState()
    assert not InterPodAffinity().filter(state, p, snap).any()
    assert state.read(AFFINITY_VERDICTS) is not None


def test_preemption_what_if_sees_the_changed_snapshot() -> None:
    """The what-if starts a fresh cycle state: evicting the web pod on a node lifts the
    anti-affinity there, though the cycle's PreFilter saw it."""
    web = LabelSelector((("app", "web"),))
    prio = share("p", 100, priority=10, pod_anti_affinity=(PodAffinityTerm("kubernetes.io/hostname", web),))
    snap = _zoned()
    r = schedule_one(profile("bestfit", preemption=True), prio, snap)
    assert not r.scheduled and r.nominated_node >= 0 and len(r.victims) == 1
    assert fits(profile("bestfit"), prio, snap, r.nominated_node) is False


# ------------------------------------------------------------------------------- device choice
@pytest.mark.parametrize("policy", POLICIES)
def test_choose_devices_on_the_chosen_node_is_the_cycles_choice(policy: str) -> None:
    """The extender's bind (node given, devices chosen by the core) and ``schedule_one`` agree."""
    pods = [share("a", 300), share("b", 600), whole("w"), share("c", 250)]
    snap = ClusterState([node("n0", gpus=4), node("n1", gpus=2)])
    with_gpu_free(snap, 0, [1000, 700, 400, 900])
    prof = profile(policy, pods)
    for p in pods:
        before = snap.copy()
        r = schedule_one(prof, p, snap)
        assert r.scheduled
        assert choose_devices(CycleState(), prof, p, before, r.node) == r.gpus


# ------------------------------------------------------------------------ target workload
def test_workload_source_fixed_learnt_and_default() -> None:
    pods = [share("a", 300), whole("w")]
    learnt = TargetWorkload.from_pods(pods)
    assert WorkloadSource().learnt([]) is None
    got = WorkloadSource().learnt(pods)
    assert got is not None and got.counts == learnt.counts and WorkloadSource().learns
    assert WorkloadSource().current().counts == typical_workload().counts
    fixed = TargetWorkload.from_pods([whole("x", 2)])
    assert WorkloadSource(fixed).learnt(pods) is fixed and not WorkloadSource(fixed).learns


def test_profile_names_the_workload_its_policy_uses() -> None:
    tw = typical_workload()
    for policy in ("default", "fgd"):
        prof = make_profile(policy, PolicyContext(tw))
        assert prof.workload is not None and prof.workload is prof.scores[0].plugin.workload
    assert make_profile("bestfit", PolicyContext(tw)).workload is None
