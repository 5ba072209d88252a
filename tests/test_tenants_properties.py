"""Properties of gangs and tenant queues under random streams of submits, finishes and cycles
(with reclaim): no queue beyond quota plus borrowing limit, lending limits held, no gang partly
bound at the end of a cycle, reclaim never takes from a queue within its quota, and every book
back at zero once everything finished."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import node, profile, whole
from gpusched.core.batch import run_cycle
from gpusched.core.cluster import ClusterState
from gpusched.core.gang import GangSpec, gang_key, group_units, partly_bound
from gpusched.core.model import PodSpec
from gpusched.core.queues import QueueBook, QueueSpec, QueueTree, Quota

PROPS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LEAVES = ("a", "b", "c")
PROFILE = profile()


@dataclass(frozen=True)
class Config:
    nominal: tuple[int, ...]
    borrowing: tuple[int | None, ...]
    lending: tuple[int | None, ...]

    def tree(self) -> QueueTree:
        return QueueTree([
            QueueSpec("root"),
            *(
                QueueSpec(
                    q, "root", Quota(gpus=n),
                    borrowing_limit=None if b is None else Quota(gpus=b),
                    lending_limit=None if lend is None else Quota(gpus=lend),
                )
                for q, n, b, lend in zip(LEAVES, self.nominal, self.borrowing, self.lending, strict=True)
            ),
        ])


limits = st.one_of(st.none(), st.integers(0, 4))
configs = st.builds(
    Config,
    st.tuples(*[st.integers(0, 6)] * 3),
    st.tuples(*[limits] * 3),
    st.tuples(*[limits] * 3),
)
submit = st.tuples(
    st.just("submit"), st.integers(0, 2), st.integers(1, 4), st.integers(1, 2), st.booleans(),
    st.integers(0, 2),
)
ops = st.lists(
    st.one_of(submit, submit, st.tuples(st.just("finish"), st.integers(0, 50)), st.tuples(st.just("cycle"))),
    min_size=4,
    max_size=40,
)


def gpus_of(book: QueueBook, q: str) -> int:
    return book.usage(q).get("gpus")


def check_invariants(cfg: Config, book: QueueBook, snap: ClusterState, gangs: dict[str, GangSpec]) -> None:
    nominal = dict(zip(LEAVES, cfg.nominal, strict=True))
    for q, b in zip(LEAVES, cfg.borrowing, strict=True):
        used = gpus_of(book, q)
        if b is not None:
            assert used <= nominal[q] + b, f"queue {q} uses {used} > quota {nominal[q]} + borrowing {b}"
    total = sum(nominal.values())
    assert sum(gpus_of(book, q) for q in LEAVES) <= total
    for q, lend in zip(LEAVES, cfg.lending, strict=True):
        if lend is None:
            continue
        kept = nominal[q] - min(lend, nominal[q])
        others = sum(gpus_of(book, o) for o in LEAVES if o != q)
        assert others <= total - kept, f"others use {others} of {q}'s kept {kept} (total {total})"
    assert partly_bound([a.pod for a in snap.allocations.values()], gangs) == []
    assert set(book.charged) == set(snap.allocations)
    assert snap.verify() == []


@PROPS
@given(cfg=configs, stream=ops)
def test_queues_and_gangs_keep_their_invariants(cfg: Config, stream: list[tuple]) -> None:
    book = QueueBook(cfg.tree())
    snap = ClusterState([node(f"n{i}", gpus=4) for i in range(2)])
    pending: list[PodSpec] = []
    queue_of: dict[str, str] = {}
    gangs: dict[str, GangSpec] = {}
    nominal = dict(zip(LEAVES, cfg.nominal, strict=True))
    for seq, op in enumerate([*stream, ("cycle",)]):
        if op[0] == "submit":
            _, qi, n, g, is_gang, prio = op
            name = f"j{seq}"
            pods = [
                whole(f"{name}-{i}", g, queue=LEAVES[qi], priority=prio, gang=name if is_gang else "")
                for i in range(n if is_gang else 1)
            ]
            if is_gang:
                gangs[f"default/{name}"] = GangSpec(name, min_member=n)
            pending.extend(pods)
            queue_of.update((p.key, p.queue) for p in pods)
        elif op[0] == "finish":
            if snap.allocations:
                keys = sorted(snap.allocations)
                done = snap.allocations[keys[op[1] % len(keys)]].pod
                unit = gang_key(done) or done.key
                for k in [k for k in keys if (gang_key(snap.allocations[k].pod) or k) == unit]:
                    snap.forget(k)
                    book.release(k)
        else:
            for unit in group_units(pending, gangs):
                before = {q: gpus_of(book, q) for q in LEAVES}
                (out,) = run_cycle(PROFILE, snap, [unit], book=book, evict_now=True)
                for q in {queue_of[v] for v in out.victims}:
                    assert q != unit.queue
                    assert before[q] > nominal[q], f"reclaim took from {q} within its quota"
                placed = {r.pod.key for r in out.placed}
                pending = [p for p in pending if p.key not in placed]
            check_invariants(cfg, book, snap, gangs)
    # everything finishes: the books are back at zero
    for k in sorted(snap.allocations):
        snap.forget(k)
        book.release(k)
    assert not book.charged and all(u.zero for u in book.own.values())
    assert all(d == 0 for keys in book.demand.values() for d in keys.values())

