"""A claim's ``matchAttribute`` / ``distinctAttribute`` constraints, checked device by device."""

from __future__ import annotations

from gpusched.core.dra.model import AttrValue, Claim, Constraint, qualify
from gpusched.core.dra.pools import Candidate


def _applies(con: Constraint, parent: str, result_name: str) -> bool:
    return not con.requests or parent in con.requests or result_name in con.requests


def _value(cand: Candidate, attribute: str) -> AttrValue | None:
    for name, value in cand.device.attributes.items():
        if qualify(cand.driver, name) == attribute:
            return value
    return None


class ConstraintBook:
    """The attribute values each constraint has seen so far, as a stack undone on backtracking."""

    def __init__(self, claim: Claim) -> None:
        self._constraints = claim.constraints
        self._seen: list[list[AttrValue]] = [[] for _ in claim.constraints]
        self._pushed: list[list[int]] = []
        self.last_refusal: Candidate | None = None

    def add(self, parent: str, result_name: str, cand: Candidate) -> bool:
        pushes: list[tuple[int, AttrValue]] = []
        for i, con in enumerate(self._constraints):
            if not _applies(con, parent, result_name):
                continue
            attribute = con.match_attribute or con.distinct_attribute or ""
            value = _value(cand, attribute)
            seen = self._seen[i]
            ok = value is not None and (
                (con.match_attribute is not None and (not seen or seen[0] == value))
                or (con.distinct_attribute is not None and value not in seen)
            )
            if not ok:
                self.last_refusal = cand
                return False
            assert value is not None
            pushes.append((i, value))
        for i, value in pushes:
            self._seen[i].append(value)
        self._pushed.append([i for i, _ in pushes])
        return True

    def remove(self) -> None:
        for i in self._pushed.pop():
            self._seen[i].pop()
