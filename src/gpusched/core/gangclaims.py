"""Joint allocation of a gang's ResourceClaims: every member's claims fit together, or none stays.

kube-scheduler allocates each pod's claims on its own, the first solution in device order, and has
no joint allocation across a gang's pods (kubernetes#138765): the devices the first member takes may
be the ones the next needs, although another choice for the first (a later ``firstAvailable``
sub-request, other devices, another node) lets both fit. ``schedule_gang`` places a gang's members
through the one decider (``statement.schedule_all``: each member's cycle with the DynamicResources
plugin, its claims allocated against the front end's ledger, which holds what the members before it
reserved, so no device is given twice and a shared claim is allocated once); when that first pass
(each member's first solution, as kube-scheduler would choose it) does not fit and a member has
claims, it searches the members' joint choices:

- the members placed before the one that did not fit are steered, the latest first (depth first):
  one of its devices is not offered to it again (``PodClaims.avoid_devices``: the allocator then
  takes its next solution, still preferring each claim's earlier sub-requests), or its node is not
  (``PodClaims.avoid_nodes``), and the whole gang is tried again with that steer;
- a steer already tried is not tried again; the first pass that places the gang's minimum wins;
- bound: at most ``JOINT_PASSES`` passes over the gang (the first included) and ``JOINT_CYCLES``
  member cycles in all, so a gang that fits under no joint choice costs a bounded amount of work.

A pass that fails is discarded whole (``Statement.discard`` unreserves what Reserve took), so a
gang that does not fit holds no device afterwards, and its reason is the first pass's (the
kube-scheduler view) with the number of joint choices tried.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpusched.core.cluster import I64, ClusterState
from gpusched.core.dra.model import DeviceId
from gpusched.core.framework import Profile
from gpusched.core.model import PodSpec
from gpusched.core.plugins.dynamicresources import chosen
from gpusched.core.statement import GroupResult, schedule_all
from gpusched.core.status import Status

JOINT_PASSES = 32
"""Passes over the gang at most (the first, pod-by-pod pass included)."""
JOINT_CYCLES = 512
"""Member scheduling cycles at most, over all passes."""

Steer = tuple[tuple[frozenset[str], frozenset[DeviceId]], ...]
"""Per member (in the gang's order): the nodes and devices it is kept off in one pass."""


def _has_claims(pod: PodSpec) -> bool:
    return pod.claims is not None and bool(pod.claims.to_allocate)


def schedule_gang(
    profile: Profile,
    pods: Sequence[PodSpec],
    snap: ClusterState,
    *,
    tiebreak: I64 | None = None,
    min_count: int | None = None,
    diagnose_failures: bool = True,
    nodes: I64 | None = None,
    leaving: frozenset[str] = frozenset(),
) -> GroupResult:
    """``schedule_all`` for a gang, searching the members' joint claim choices when the first pass
    fails (module doc). On success the results name the unit's own pods (not the steered ones).
    ``nodes``: only these snapshot indices are candidates (a gang topology domain). ``leaving``: a
    what-if's evicted pods (their DRA claims count as free, ``core.scheduler.fits``)."""
    first = schedule_all(
        profile, pods, snap, tiebreak=tiebreak, min_count=min_count, diagnose_failures=diagnose_failures,
        nodes=nodes, leaving=leaving,
    )  # fmt: skip
    if first.scheduled or not any(_has_claims(p) for p in pods):
        return first
    base: Steer = tuple((frozenset(), frozenset()) for _ in pods)
    seen = {base}
    stack: list[Steer] = []
    _branch(stack, seen, first, base, pods, snap)
    passes, cycles = 1, len(first.results)
    while stack and passes < JOINT_PASSES and cycles < JOINT_CYCLES:
        steer = stack.pop()
        r = schedule_all(
            profile, _steered(pods, steer), snap, tiebreak=tiebreak, min_count=min_count,
            diagnose_failures=False, nodes=nodes, leaving=leaving,
        )  # fmt: skip
        passes, cycles = passes + 1, cycles + len(r.results)
        if r.scheduled:
            own = {p.key: p for p in pods}
            return GroupResult(r.status, tuple(replace(x, pod=own[x.pod.key]) for x in r.results))
        _branch(stack, seen, r, steer, pods, snap)
    if passes == 1:  # no member's claim choice to change (none was placed)
        return first
    st = first.status
    note = (
        f" (no joint choice of the members' claims fits either: {passes} pass(es) tried, "
        f"at most {JOINT_PASSES})"
    )
    return GroupResult(Status(st.code, (st.message() + note,), st.plugin), first.results)


def _steered(pods: Sequence[PodSpec], steer: Steer) -> list[PodSpec]:
    out = []
    for p, (nodes, devices) in zip(pods, steer, strict=True):
        if p.claims is None or (not nodes and not devices):
            out.append(p)
            continue
        out.append(replace(p, claims=replace(p.claims, avoid_nodes=nodes, avoid_devices=devices)))
    return out


def _branch(
    stack: list[Steer],
    seen: set[Steer],
    r: GroupResult,
    steer: Steer,
    pods: Sequence[PodSpec],
    snap: ClusterState,
) -> None:
    """Push the steers that change one placed member's claim choice in the failed pass ``r``: the
    latest member first (popped first), each of its devices, then its node."""
    children: list[Steer] = []
    for i in reversed(range(len(r.results))):
        x = r.results[i]
        if not x.scheduled or x.reserved is None or not _has_claims(pods[i]):
            continue
        nodes, devices = steer[i]
        for d in chosen(x.reserved.state, x.node):
            children.append(_with(steer, i, (nodes, devices | {d})))
        children.append(_with(steer, i, (nodes | {snap.names[x.node]}, devices)))
    for c in reversed(children):
        if c not in seen:
            seen.add(c)
            stack.append(c)


def _with(steer: Steer, i: int, one: tuple[frozenset[str], frozenset[DeviceId]]) -> Steer:
    return (*steer[:i], one, *steer[i + 1 :])
