"""Quota with borrowing and lending in a queue tree (after Kueue's hierarchical cohorts).

Per resource key, for queue ``q`` with nominal ``N(q)``:

- subtree quota ``S(q) = N(q) + sum of L(c)`` over its children ``c``: its own nominal and what
  the children lend it;
- lendable ``L(q) = min(lendingLimit(q), S(q))`` (all of ``S(q)`` without a limit; a root lends
  nothing) and guaranteed ``G(q) = S(q) - L(q)``: what no one else may use;
- demand ``D(q)``: a leaf's pods, plus for an inner queue what its children use beyond their
  guarantees, ``sum of max(0, D(c) - G(c))``.

A charge is admitted when afterwards, along its leaf's path to the root, every queue keeps
``D(q) - S(q) <= borrowingLimit(q)`` (what it borrowed from its parent's pool) and the root keeps
``D(root) <= S(root)``. So a queue uses its own quota first, borrows idle quota of its cohort up
to its borrowing limit, and never takes the part of a sibling's quota that its lending limit
keeps back. ``QueueBook`` keeps ``D`` per queue and key, updated along one path per charge.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpusched.core.queues.spec import QueueTree, ResourceKey
from gpusched.core.queues.usage import Usage


@dataclass(frozen=True, slots=True)
class Capacity:
    """``S``, ``L``, ``G`` of one queue for one key, and its borrowing limit (None: none)."""

    subtree: int
    lendable: int
    guaranteed: int
    borrowing_limit: int | None


def capacities(tree: QueueTree) -> dict[str, dict[ResourceKey, Capacity]]:
    """``Capacity`` of every queue for every key limited in its tree."""
    out: dict[str, dict[ResourceKey, Capacity]] = {n: {} for n in tree.specs}
    for name in tree.order:  # children first
        spec = tree.specs[name]
        for key in tree.keys(name):
            s = (spec.nominal_of(key) or 0) + sum(out[c][key].lendable for c in tree.children[name])
            if not spec.parent:
                lend = 0
            else:
                ll = tree.lending_limit(name, key)
                lend = s if ll is None else min(ll, s)
            bl = tree.borrowing_limit(name, key) if spec.parent else 0
            out[name][key] = Capacity(s, lend, s - lend, bl)
    return out


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a charge fits the quotas; when not, ``reason`` names the queue and the key."""

    ok: bool
    reason: str = ""
    queue: str = ""
    """The queue whose limit refused it."""
    key: ResourceKey | None = None


ADMITTED = Verdict(True)


class QueueBook:
    """Usage of every queue: what each leaf's pods are charged, ``D`` per queue and key, and the
    pods charged (by key, with what each was charged). Pure bookkeeping; ``check`` asks whether a
    charge would be admitted without booking it."""

    def __init__(self, tree: QueueTree) -> None:
        self.tree = tree
        self.cap = capacities(tree)
        self.demand: dict[str, dict[ResourceKey, int]] = {n: dict.fromkeys(c, 0) for n, c in self.cap.items()}
        self.own: dict[str, Usage] = {n: Usage() for n in tree.specs}
        self.charged: dict[str, tuple[str, Usage]] = {}
        """Pod key -> (leaf queue, charge)."""

    def copy(self) -> QueueBook:
        """An independent book with the same charges (cheap: no charge is recomputed), for a
        front end that keeps one book per cycle and lets each decision change its own copy."""
        out = QueueBook.__new__(QueueBook)
        out.tree, out.cap = self.tree, self.cap
        out.demand = {q: dict(keys) for q, keys in self.demand.items()}
        out.own = dict(self.own)
        out.charged = dict(self.charged)
        return out

    # -------------------------------------------------------------- arithmetic
    def _deltas(self, queue: str, usage: Usage, sign: int) -> list[tuple[str, ResourceKey, int]]:
        """``(queue, key, new D)`` along the path for ``sign * usage`` added at ``queue``."""
        out = []
        for key in self.tree.keys(queue):
            delta = sign * usage[key]
            for q in self.tree.paths[queue]:
                if delta == 0:
                    break
                old = self.demand[q][key]
                new = old + delta
                out.append((q, key, new))
                g = self.cap[q][key].guaranteed
                delta = max(0, new - g) - max(0, old - g)
        return out

    def check(self, queue: str, usage: Usage) -> Verdict:
        """Would charging ``usage`` to leaf ``queue`` stay within every limit on its path?"""
        for q, key, new in self._deltas(queue, usage, +1):
            c = self.cap[q][key]
            if not self.tree.specs[q].parent:
                if new > c.subtree:
                    why = f"queue {q} (root): {key} would be {new} of {c.subtree}"
                    return Verdict(False, why, q, key)
            elif c.borrowing_limit is not None and new - c.subtree > c.borrowing_limit:
                why = (
                    f"queue {q}: {key} would borrow {new - c.subtree}, over its borrowingLimit "
                    f"{c.borrowing_limit} (quota {c.subtree})"
                )
                return Verdict(False, why, q, key)
        return ADMITTED

    def charge(self, pod_key: str, queue: str, usage: Usage) -> None:
        """Book ``usage`` for ``pod_key`` to leaf ``queue`` (no check: ``check`` first)."""
        if pod_key in self.charged:
            raise KeyError(f"pod {pod_key} is charged already")
        for q, key, new in self._deltas(queue, usage, +1):
            self.demand[q][key] = new
        self.own[queue] = self.own[queue] + usage
        self.charged[pod_key] = (queue, usage)

    def release(self, pod_key: str) -> tuple[str, Usage]:
        """Undo ``charge`` of ``pod_key``; returns its queue and charge."""
        queue, usage = self.charged.pop(pod_key)
        for q, key, new in self._deltas(queue, usage, -1):
            self.demand[q][key] = new
        self.own[queue] = self.own[queue] - usage
        return queue, usage

    # -------------------------------------------------------------- views
    def usage(self, queue: str) -> Usage:
        """What the pods of ``queue`` and of every queue under it are charged."""
        return Usage.total(self.own[q] for q in self.tree.specs if queue in self.tree.paths[q])

    def borrowed(self, queue: str) -> Mapping[ResourceKey, int]:
        """Per key, how far the queue is over its (subtree) quota: ``max(0, D - S)``."""
        return {k: max(0, d - self.cap[queue][k].subtree) for k, d in self.demand[queue].items()}

    def over_nominal(self, queue: str) -> bool:
        """Whether the queue uses more than its quota in some limited key (it borrows)."""
        return any(v > 0 for v in self.borrowed(queue).values())

    def within(self, queue: str, extra: Usage) -> bool:
        """Whether ``queue`` with ``extra`` more stays within its own quota in every key (it would
        borrow nothing): the condition under which it may reclaim what it lent."""
        for key in self.tree.keys(queue):
            if self.demand[queue][key] + extra[key] > self.cap[queue][key].subtree:
                return False
        return True

    def violations(self) -> list[str]:
        """Every limit broken now (empty in a consistent book): for the tests and the simulator."""
        out = []
        for q, keys in self.demand.items():
            for key, d in keys.items():
                c = self.cap[q][key]
                if not self.tree.specs[q].parent and d > c.subtree:
                    out.append(f"queue {q}: {key} {d} over {c.subtree}")
                elif c.borrowing_limit is not None and d - c.subtree > c.borrowing_limit:
                    out.append(f"queue {q}: {key} borrows {d - c.subtree} over {c.borrowing_limit}")
        return out
