"""When each pod of a namespace was seen bound: a watch (``k8s.informer.Reflector``) in the
benchmark's own process, the same observer for every scheduler compared.

``BindingWatcher`` records, per pod, the monotonic time its ``spec.nodeName`` was first seen
set, and counts pods seen bound to one node and later to another (never expected: a pod is
bound once). ``rate()`` is the binding rate from the first binding seen to the last.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpusched.k8s.informer import Handlers, Reflector


@dataclass(frozen=True)
class BindingRate:
    bound: int
    seconds: float
    """From the first binding seen to the last."""
    pods_per_s: float
    first: float = 0.0
    last: float = 0.0
    """``time.monotonic()`` of the first and last binding seen."""


class BindingWatcher:
    """Watches the pods of ``namespace`` through ``core`` (a ``CoreV1Api``)."""

    def __init__(self, core: Any, namespace: str) -> None:
        self._lock = threading.Lock()
        self.bound_at: dict[str, float] = {}
        self.node_of: dict[str, str] = {}
        self.seen: set[str] = set()
        self.rebound: list[str] = []
        """Pods seen bound to one node, then to another."""
        list_fn = functools.partial(core.list_namespaced_pod, namespace)
        self._reflector = Reflector(f"bench-{namespace}", list_fn, Handlers(self._upsert, lambda _o: None))

    def _upsert(self, obj: Mapping[str, Any]) -> None:
        now = time.monotonic()
        name = str((obj.get("metadata") or {}).get("name", ""))
        node = (obj.get("spec") or {}).get("nodeName")
        with self._lock:
            self.seen.add(name)
            if not node:
                return
            old = self.node_of.get(name)
            if old is None:
                self.node_of[name] = node
                self.bound_at[name] = now
            elif old != node:
                self.rebound.append(name)

    def start(self) -> BindingWatcher:
        self._reflector.start()
        if not self._reflector.wait_synced(60.0):
            raise TimeoutError("the benchmark's pod watch did not sync in 60 s")
        return self

    def stop(self) -> None:
        self._reflector.stop()

    def count_seen(self) -> int:
        with self._lock:
            return len(self.seen)

    def count_bound(self, names: set[str] | None = None) -> int:
        with self._lock:
            return len(self.bound_at) if names is None else sum(1 for n in names if n in self.bound_at)

    def times(self, names: set[str] | None = None) -> dict[str, float]:
        with self._lock:
            return {n: t for n, t in self.bound_at.items() if names is None or n in names}

    def rate(self, names: set[str] | None = None) -> BindingRate:
        ts = sorted(self.times(names).values())
        if len(ts) < 2:
            return BindingRate(len(ts), 0.0, 0.0)
        span = ts[-1] - ts[0]
        per_s = round((len(ts) - 1) / span, 1) if span > 0 else 0.0
        return BindingRate(len(ts), round(span, 3), per_s, ts[0], ts[-1])
