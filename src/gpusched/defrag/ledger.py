"""The defragmentation controller's record, kept on its Lease so that it outlives the process and
passes to the next leader (issue 28 F2b, F4):

- ``gpusched.io/defrag-moves``: the moves of the window, ``[[unix seconds, "ns/pod"], ...]``. Each
  move is written *before* its eviction (an eviction refused then is taken back), so a controller
  killed between the two over-counts, never under-counts: after a restart or a change of leader the
  per-window and per-pod move budgets still hold.
- ``gpusched.io/defrag-plan``: the plan being carried out (``PlanRecord``: id, pending pods, the
  holder, when it lapses). The scheduler holds a pod's room only while this names its plan.

Every write is a read-modify-replace carrying the Lease's ``resourceVersion`` (the Role grants
get and update on this one Lease), retried on a conflict with the leader elector's renewals. The
Lease is created (no holder) when it does not exist yet; the elector then takes it as usual.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from gpusched.defrag.errors import DefragError
from gpusched.k8s.errors import InvalidRequest
from gpusched.k8s.reservation import ANN_MOVES, ANN_PLAN, PlanRecord, parse_plan_record

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 5


class LedgerError(DefragError):
    """The Lease could not be read or written (names it and the API's answer)."""


class LeaseLedger:
    def __init__(self, coord: Any, namespace: str, name: str, window_s: float) -> None:
        self.coord, self.namespace, self.name = coord, namespace, name
        self.window_s = window_s

    @property
    def where(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    # ------------------------------------------------------------------ reading
    def moves(self, now: float) -> list[tuple[float, str]]:
        """The moves of the window ending ``now``, oldest first."""
        return self._window(self._annotations(self._read()), now)

    def plan(self) -> PlanRecord | None:
        """The plan recorded now (None: none, or unreadable: it then backs no room either)."""
        raw = self._annotations(self._read()).get(ANN_PLAN)
        if not raw:
            return None
        try:
            return parse_plan_record(raw, self.where)
        except InvalidRequest as e:
            log.warning("%s", e)
            return None

    def _window(self, ann: dict[str, str], now: float) -> list[tuple[float, str]]:
        raw = ann.get(ANN_MOVES)
        if not raw:
            return []
        try:
            out = [(float(t), str(k)) for t, k in json.loads(raw)]
        except (ValueError, TypeError):
            # unreadable: refuse to plan rather than forget the moves it recorded
            raise LedgerError(f"{self.where}: annotation {ANN_MOVES} is not valid: {raw[:200]!r}") from None
        return sorted(m for m in out if m[0] >= now - self.window_s)

    def _read(self) -> dict[str, Any] | None:
        try:
            resp = self.coord.read_namespaced_lease(self.name, self.namespace, _preload_content=False)
        except Exception as e:
            if getattr(e, "status", None) == 404:
                return None
            raise LedgerError(f"{self.where}: cannot be read: {e}") from None
        obj: dict[str, Any] = json.loads(resp.data)
        return obj

    @staticmethod
    def _annotations(obj: dict[str, Any] | None) -> dict[str, str]:
        return dict(((obj or {}).get("metadata") or {}).get("annotations") or {})

    # ------------------------------------------------------------------ writing
    def add_move(self, now: float, key: str) -> None:
        """Record a move of ``key`` at ``now`` (before its eviction)."""
        self._update(lambda ann: self._set_moves(ann, [*self._window(ann, now), (now, key)]))

    def drop_move(self, now: float, key: str) -> None:
        """Take back the move recorded at ``now`` (its eviction was refused)."""
        self._update(lambda ann: self._set_moves(ann, [m for m in self._window(ann, now) if m != (now, key)]))

    def set_plan(self, record: PlanRecord) -> None:
        self._update(lambda ann: ann.__setitem__(ANN_PLAN, record.annotation()))

    def clear_plan(self, plan_id: str) -> None:
        """Remove the plan record when it is still ``plan_id``'s."""

        def clear(ann: dict[str, str]) -> None:
            raw = ann.get(ANN_PLAN) or ""
            if plan_id in raw:
                ann.pop(ANN_PLAN, None)

        self._update(clear)

    @staticmethod
    def _set_moves(ann: dict[str, str], moves: list[tuple[float, str]]) -> None:
        ann[ANN_MOVES] = json.dumps([[round(t, 3), k] for t, k in moves], separators=(",", ":"))

    def _update(self, change: Callable[[dict[str, str]], None]) -> None:
        for _ in range(CONFLICT_RETRIES):
            obj = self._read()
            ann = self._annotations(obj)
            change(ann)
            try:
                if obj is None:
                    body = {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": self.name, "namespace": self.namespace, "annotations": ann},
                        "spec": {},
                    }
                    self.coord.create_namespaced_lease(self.namespace, body, _preload_content=False)
                else:
                    # the annotations replaced whole: removed keys go (a merge patch cannot drop them
                    # under a resourceVersion precondition more simply)
                    obj.setdefault("metadata", {})["annotations"] = ann
                    self.coord.replace_namespaced_lease(
                        self.name, self.namespace, obj, _preload_content=False
                    )
                return
            except Exception as e:
                if getattr(e, "status", None) in (409,):
                    continue  # the elector renewed (or another wrote) in between: read again
                raise LedgerError(f"{self.where}: cannot be written: {e}") from None
        raise LedgerError(f"{self.where}: still conflicting after {CONFLICT_RETRIES} tries")
