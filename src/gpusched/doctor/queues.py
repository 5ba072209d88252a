"""Tenant queues in doctor: the queue book as the standalone scheduler builds it, whether a pod's
queue admits it (the core's ``QueueBook.check``, as ``k8s/tenants.py`` asks it), what the queue
uses, borrows and could borrow, and the smallest quota change after which it is admitted.

The scheduler decides a pod under a queue in this order (``k8s/tenants.TenantQueues.schedule``):
an unknown or invalid queue makes it wait; then **quota** (the charge of the pod, every model
together); then placement; then quota again with the model of the node it would land on. Doctor
asks the same questions of the same core on copies of the book; nothing here decides admission
itself. A snapshot without Queues (``Snapshot.queues`` None: the CRD is not served, or an old
snapshot) has no queue book: the scheduler then ignores queues, and so does doctor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpusched.core.cluster import ClusterState
from gpusched.core.framework import Profile
from gpusched.core.gang import Unit, without_post_filters
from gpusched.core.model import PodSpec
from gpusched.core.queues.quota import QueueBook, Verdict
from gpusched.core.queues.reclaim import ReclaimPlan, plan_reclaim
from gpusched.core.queues.spec import ANY_MODEL, QueueSpec, QueueTree, Quota, ResourceKey
from gpusched.core.queues.status import queue_statuses
from gpusched.core.queues.usage import Usage, charge_of
from gpusched.doctor.findings import Counterfactual, Finding
from gpusched.k8s.queues import LABEL_QUEUE, Directory, build_directory, charge_booked

UNITS = {"gpus": "GPU(s)", "gpu_milli": "milli-GPU", "gpu_memory_mib": "MiB of GPU memory"}


def directory_of(queues: Iterable[Mapping[str, Any]], namespaces: Iterable[Mapping[str, Any]]) -> Directory:
    """The queues as the scheduler's ``k8s.queues.QueueDirectory`` sees them
    (``k8s.queues.build_directory``), from a list of Queue objects and Namespaces."""
    objs = {str((o.get("metadata") or {}).get("name")): o for o in queues}
    labels = {}
    for ns in namespaces:
        meta = ns.get("metadata") or {}
        labels[str(meta.get("name", ""))] = str((meta.get("labels") or {}).get(LABEL_QUEUE, ""))
    return build_directory(objs, labels)[0]


def book_of(state: ClusterState, d: Directory) -> QueueBook:
    """Every booked pod under a valid leaf queue charged (``k8s.queues.charge_booked``)."""
    return charge_booked(state, d)


@dataclass
class QueueBooks:
    """The queues of a snapshot: the directory, the book of the booked pods, pending pods by queue."""

    directory: Directory
    book: QueueBook
    pending: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        queues: Sequence[Mapping[str, Any]],
        namespaces: Sequence[Mapping[str, Any]],
        state: ClusterState,
        pending: Iterable[PodSpec],
    ) -> QueueBooks:
        d = directory_of(queues, namespaces)
        counts: dict[str, int] = {}
        for p in pending:
            q, _ = d.queue_of(p)
            if q:
                counts[q] = counts.get(q, 0) + 1
        return cls(d, book_of(state, d), counts)


@dataclass(frozen=True)
class Admission:
    """Whether the pod's queue admits it now, and why not (the core's verdict)."""

    queue: str
    source: str
    problem: str = ""
    """Why the queue cannot admit any pod (unknown, invalid, not a leaf); "" when it is usable."""
    verdict: Verdict | None = None
    model: str = ANY_MODEL
    """The GPU model whose per-model quota refused it (ANY_MODEL: the total, or admitted)."""

    @property
    def ok(self) -> bool:
        return not self.problem and self.verdict is not None and self.verdict.ok


def admission(qb: QueueBooks, pod: PodSpec, models: Callable[[], Sequence[str]]) -> Admission | None:
    """The scheduler's quota questions for pending ``pod`` (None: under no queue). ``models``: the
    GPU models of the nodes the pod fits on now, asked only once the total is admitted (the second
    check, per model, is asked for each; the pod is admitted if one of them admits it)."""
    d = qb.directory
    queue, source = d.queue_of(pod)
    if not queue:
        return None
    problem = d.problem(queue, source)
    if problem:
        return Admission(queue, source, problem)
    verdict = qb.book.check(queue, charge_of(pod))
    if not verdict.ok:
        return Admission(queue, source, verdict=verdict)
    refused: tuple[str, Verdict] | None = None
    fit = models()
    if not fit:
        return Admission(queue, source, verdict=verdict)
    for m in fit:
        v = qb.book.check(queue, charge_of(pod, m))
        if v.ok:
            return Admission(queue, source, verdict=v)
        refused = refused or (m, v)
    assert refused is not None
    return Admission(queue, source, verdict=refused[1], model=refused[0])


def headroom(book: QueueBook, queue: str, key: ResourceKey) -> int:
    """The most of ``key`` that leaf ``queue`` could be charged now (its own quota left and what
    it may borrow), found by asking the core's ``check`` (binary search: admission is monotone)."""
    lo, hi = 0, sum(c[key].subtree for c in book.cap.values() if key in c) + 1
    hi += sum(book.demand[q].get(key, 0) for q in book.tree.specs)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if book.check(queue, Usage({key: mid})).ok:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class KeyLine:
    """One limited key of a queue: used, quota, borrowed now, borrowing limit, what it may still
    take of its own quota and borrow from its cohort."""

    key: ResourceKey
    used: int
    quota: int
    borrowed: int
    borrowing_limit: int | None
    own_left: int
    cohort_idle: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": str(self.key),
            "used": self.used,
            "quota": self.quota,
            "borrowed": self.borrowed,
            "borrowing_limit": self.borrowing_limit,
            "own_left": self.own_left,
            "cohort_idle": self.cohort_idle,
        }

    def text(self) -> str:
        bl = "none" if self.borrowing_limit is None else str(self.borrowing_limit)
        return (
            f"{self.key} {self.used} of {self.quota} (borrows {self.borrowed}, borrowing limit {bl}, "
            f"may still take {self.own_left} of its own and borrow {self.cohort_idle} from its cohort)"
        )


def key_lines(book: QueueBook, queue: str) -> list[KeyLine]:
    """Per key limited in the queue's tree (totals first, then per model)."""
    out = []
    usage = book.usage(queue)
    borrowed = book.borrowed(queue)
    keys = sorted(book.tree.keys(queue), key=lambda k: (k.model != ANY_MODEL, k.model, k.dim))
    for key in keys:
        c = book.cap[queue][key]
        room = headroom(book, queue, key)
        own = max(0, c.subtree - book.demand[queue][key])
        out.append(
            KeyLine(key, usage[key], c.subtree, borrowed.get(key, 0), c.borrowing_limit, min(own, room),
                    max(0, room - own))
        )  # fmt: skip
    return out


# ------------------------------------------------------------------------ the counterfactual
def _raised(spec: QueueSpec, key: ResourceKey, by: int) -> QueueSpec:
    """``spec`` with its nominal quota of ``key`` raised by ``by`` (a dimension not given: 0 + by)."""
    if key.model == ANY_MODEL:
        q = spec.nominal
        return replace(spec, nominal=q.raised(key.dim, by))
    per_model = dict(spec.per_model)
    q = per_model.get(key.model, Quota())
    per_model[key.model] = q.raised(key.dim, by)
    return replace(spec, per_model=per_model)


def rebooked(book: QueueBook, specs: Mapping[str, QueueSpec]) -> QueueBook:
    """A new book on the queues ``specs`` with the same usage as ``book``, for ``check``: each
    leaf charged its pods' total at once (the demands ``D`` depend only on each leaf's total, so
    they are those of charging the pods one by one; the pods themselves are not in it)."""
    out = QueueBook(QueueTree(specs.values()))
    for q, usage in book.own.items():
        if not usage.zero:
            out.charge(f"queue/{q}", q, usage)
    return out


@dataclass(frozen=True)
class QuotaChange:
    """The smallest raise of the queue's nominal quota (per key) after which the core admits the
    pod, and the admission checked on a book with the raise applied (``verified``)."""

    queue: str
    raises: Mapping[ResourceKey, int]
    verified: bool
    lines: tuple[KeyLine, ...]


def quota_change(book: QueueBook, queue: str, charge: Usage) -> QuotaChange:
    """Raise the binding key of ``queue``'s nominal quota by the least amount (binary search over
    books rebuilt with the raise) until the core's ``check`` admits ``charge``; another key that
    then binds is raised the same way."""
    specs = dict(book.tree.specs)
    raises: dict[ResourceKey, int] = {}
    lines = {kl.key: kl for kl in key_lines(book, queue)}
    cur = book
    for _ in range(len(book.tree.keys(queue)) + 1):
        v = cur.check(queue, charge)
        if v.ok:
            break
        key = v.key
        assert key is not None
        base = specs[queue]
        lo, hi = 1, charge[key] + sum(cur.demand[q].get(key, 0) for q in cur.tree.specs) + 1
        while lo < hi:  # least raise of key that clears it (other keys may still bind)
            mid = (lo + hi) // 2
            trial = rebooked(book, {**specs, queue: _raised(base, key, mid)})
            tv = trial.check(queue, charge)
            if tv.ok or tv.key != key:
                hi = mid
            else:
                lo = mid + 1
        specs[queue] = _raised(base, key, lo)
        raises[key] = raises.get(key, 0) + lo
        cur = rebooked(book, specs)
    ok = cur.check(queue, charge).ok
    shown = tuple(lines[k] for k in raises if k in lines)
    return QuotaChange(queue, raises, ok, shown)


# ------------------------------------------------------------------ findings and the change
_CRD_FIELDS = {"gpus": "gpus", "gpu_milli": "gpuMilli", "gpu_memory_mib": "gpuMemoryMiB"}


def _quota_body(q: Quota) -> dict[str, int]:
    return {_CRD_FIELDS[d]: v for d, v in q.items()}


def patch_of(spec: QueueSpec) -> dict[str, Any]:
    """A merge patch of the Queue object that sets its nominal quotas to ``spec``'s."""
    body: dict[str, Any] = {"nominalQuota": _quota_body(spec.nominal)}
    if spec.per_model:
        body["perModel"] = [
            {"model": m, "nominalQuota": _quota_body(q)} for m, q in sorted(spec.per_model.items())
        ]
    return {"spec": body}


def reclaim_plan(
    qb: QueueBooks, adm: Admission, pod: PodSpec, profile: Profile, state: ClusterState
) -> ReclaimPlan | None:
    """What the scheduler does next for a pod its queue refuses while the queue would stay within
    its own quota: reclaim, evicting pods of borrowing queues (``core.queues.reclaim.plan_reclaim``
    on a copy of the book, as ``k8s/tenants.py`` asks it). None when it would not reclaim."""
    if adm.problem or adm.ok:
        return None
    p = replace(pod, queue=adm.queue)
    plan = plan_reclaim(without_post_filters(profile), state, qb.book.copy(), Unit(p.key, (p,), 1))
    return plan if plan.ok else None


def queue_finding(
    qb: QueueBooks, adm: Admission, key: str, reclaim: ReclaimPlan | None = None, gang: str = ""
) -> Finding:
    """The ``queue`` finding of a pending pod: its queue, usage against quota per key, what it
    borrows and could borrow, and whether the queue admits it now (or why it never can); when the
    scheduler would reclaim for it (``reclaim_plan``), the pods it would evict."""
    if adm.problem:
        code = "queue-invalid" if adm.queue in qb.directory.invalid else "queue-unknown"
        msg = f"{adm.problem}: the scheduler makes the pod wait (FailedScheduling) until the queue is fixed"
        return Finding("scheduling", "error", code, msg, {"queue": adm.queue, "source": adm.source}, key)
    assert adm.verdict is not None
    lines = key_lines(qb.book, adm.queue)
    state = "admits the pod now" if adm.ok else f"does not admit the pod now: {adm.verdict.reason}"
    msg = f"queue {adm.queue} ({adm.source}): {state}; " + "; ".join(kl.text() for kl in lines)
    if gang:
        msg += (
            f"; the pod is a member of gang {gang}: the scheduler admits the gang's members as one "
            "unit (k8s/gangs.py), this is the pod's own charge"
        )
    if reclaim is not None:
        n = len(reclaim.victims)
        msg += (
            f"; within its own quota, so the scheduler reclaims it: evicts {n} pod(s) of borrowing "
            f"queues ({', '.join(reclaim.victims[:5])}{', ...' if n > 5 else ''}) and waits for them"
        )
    evidence = {
        "queue": adm.queue,
        "source": adm.source,
        "admits": adm.ok,
        "verdict": adm.verdict.reason,
        "refused_by": adm.verdict.queue,
        "model": adm.model,
        "pending": qb.pending.get(adm.queue, 0),
        "keys": [kl.to_dict() for kl in lines],
        "reclaim": list(reclaim.victims) if reclaim is not None else [],
    }
    return Finding("scheduling", "ok" if adm.ok else "error", "queue", msg, evidence, key)


def finishing(book: QueueBook, queue: str, charge: Usage) -> tuple[str, ...]:
    """The fewest pods of leaf ``queue`` whose finishing lets the core admit ``charge``: released
    on a copy of the book largest first (in the key that refuses), then each spared again, the
    smallest first, while the charge is still admitted; () when even all of them would not do."""
    v = book.check(queue, charge)
    if v.ok or v.key is None:
        return ()
    key = v.key
    size = {k: u[key] for k, (q, u) in book.charged.items() if q == queue}
    trial = book.copy()
    gone: list[str] = []
    for k in sorted(size, key=lambda k: (-size[k], k)):
        if trial.check(queue, charge).ok:
            break
        trial.release(k)
        gone.append(k)
    if not trial.check(queue, charge).ok:
        return ()
    for k in sorted(gone, key=lambda k: (size[k], k)):
        trial.charge(k, queue, book.charged[k][1])
        if trial.check(queue, charge).ok:
            gone.remove(k)
        else:
            trial.release(k)
    return tuple(sorted(gone))


def quota_counterfactual(qb: QueueBooks, adm: Admission, pod: PodSpec, node: str = "") -> Counterfactual:
    """The quota counterfactual, "waits for quota in queue Q: needs N more ...": the smallest
    raise of the queue's quota, verified by the core's admission on a book rebuilt with the raise.
    ``node``: where the pod fits physically ("" when it fits nowhere: other changes are needed)."""
    if adm.problem:
        msg = (
            f"waits for its queue: {adm.problem}; create the Queue or fix it (nothing is admitted till then)"
        )
        return Counterfactual("queue", msg, 0, False, "", {"queue": adm.queue})
    change = quota_change(qb.book, adm.queue, charge_of(pod, adm.model))
    spec = qb.book.tree.specs[adm.queue]
    raised = spec
    parts, raises = [], []
    for k, by in change.raises.items():
        raised = _raised(raised, k, by)
        kl = next((x for x in change.lines if x.key == k), None)
        bl = "none" if kl is None or kl.borrowing_limit is None else str(kl.borrowing_limit)
        where = f"{UNITS[k.dim]}" + (f" of {k.model}" if k.model else "")
        used = f"used {kl.used} of quota {kl.quota}" if kl else "not limited"
        idle = kl.cohort_idle if kl else 0
        parts.append(f"needs {by} more {where} ({used}, borrowing limit {bl}, cohort idle {idle})")
        field_ = f"spec.perModel[{k.model}].nominalQuota" if k.model else "spec.nominalQuota"
        raises.append({"key": str(k), "by": by, "field": f"{field_}.{_CRD_FIELDS[k.dim]}",
                       "to": raised.nominal_of(k)})  # fmt: skip
    fix = ", ".join(f"{r['field']} to {r['to']}" for r in raises)
    done = finishing(qb.book, adm.queue, charge_of(pod, adm.model))
    if done:
        shown = ", ".join(done[:5]) + (", ..." if len(done) > 5 else "")
        fix += f" (or once {len(done)} pod(s) of the queue finish: {shown})"
    where = f"; it then fits on {node}" if node else "; it also does not fit on any node now (see below)"
    msg = f"waits for quota in queue {adm.queue}: {'; '.join(parts)}; admitted once {fix}{where}"
    evidence = {
        "queue": adm.queue,
        "raises": raises,
        "patch": patch_of(raised),
        "or_finish": list(done),
        "fits_physically": node != "",
    }
    return Counterfactual("quota", msg, 0, change.verified, node, evidence)


def queue_rows(qb: QueueBooks) -> list[dict[str, Any]]:
    """Per queue (``core.queues.queue_statuses``): usage, quota, borrowed per key, admitted and
    pending pods; the invalid queues with why."""
    rows = []
    for st in queue_statuses(qb.book, qb.pending):
        rows.append(
            {
                "queue": st.name,
                "usage": {str(k): st.usage[k] for k in sorted(st.quota)},
                "quota": {str(k): v for k, v in sorted(st.quota.items())},
                "borrowed": {str(k): v for k, v in sorted(st.borrowed.items())},
                "admitted": st.admitted,
                "pending": st.pending,
                "invalid": "",
            }
        )
    for name, why in sorted(qb.directory.invalid.items()):
        rows.append({"queue": name, "usage": {}, "quota": {}, "borrowed": {}, "admitted": 0,
                     "pending": qb.pending.get(name, 0), "invalid": why})  # fmt: skip
    return rows
