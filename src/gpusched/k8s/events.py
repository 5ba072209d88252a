"""Pod Events and the PodScheduled condition, written asynchronously as kube-scheduler does.

``EventRecorder`` queues writes (bounded: when the API cannot keep up, events are dropped,
as client-go's broadcaster drops them) and a few worker threads send them:

- ``scheduled`` — Normal ``Scheduled`` "Successfully assigned ns/pod to node".
- ``preempted`` — Normal ``Preempted`` on a victim: "Preempted by ns/pod on node n".
- ``failed`` — Warning ``FailedScheduling`` (or any reason, e.g. ``InvalidGPURequest``) with
  the message; the same (pod, reason, message) is emitted once, so retries do not spam; with
  ``condition=True`` the pod's ``PodScheduled`` condition is set False / Unschedulable too.
  That write carries the pod's ``resourceVersion`` as a precondition: the queue may hold it until
  after the pod was bound, and a bound pod must not be marked Unschedulable. On a conflict the pod
  is read again; bound, deleted or replaced, the write is dropped (``stale``), still pending, it is
  sent once more at the pod's new version.

Core v1 Events (``involvedObject``, ``source.component``, ``reportingComponent``).
``counts()`` says what became of the writes (sent, dropped, failed, stale); the standalone
scheduler exposes it as ``gpusched_event_writes_total{result}``.
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpusched.core.caches import LRUCache
from gpusched.k8s.binder import read_pod

log = logging.getLogger(__name__)

_DEDUP_MAX = 50_000
STALE = "stale"
RESULTS = ("sent", "dropped", "failed", STALE)
"""What became of each write (``EventRecorder.counts``; ``gpusched_event_writes_total{result}``)."""


class _Flushed:
    """``flush``'s marker in the queue: not a write."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()

    def __call__(self) -> None:
        self.done.set()


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    def __init__(
        self,
        core: Any,
        component: str = "gpusched",
        instance: str = "",
        *,
        workers: int = 2,
        max_queue: int = 10_000,
    ) -> None:
        self.core = core
        self.component = component
        self.instance = instance or component
        self._q: queue.Queue[Callable[[], object] | None] = queue.Queue(max_queue)
        self._seen: LRUCache[tuple[str, str], str] = LRUCache(_DEDUP_MAX)  # (uid, reason) -> last message
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(RESULTS, 0)
        self._threads = [
            threading.Thread(target=self._work, name=f"events-{i}", daemon=True) for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    # ----------------------------------------------------------- public
    def scheduled(self, pod: Mapping[str, Any], node: str) -> None:
        meta = pod.get("metadata") or {}
        msg = f"Successfully assigned {meta.get('namespace', 'default')}/{meta.get('name')} to {node}"
        self.forget(str(meta.get("uid", "")))
        self._submit(lambda: self._event(pod, "Normal", "Scheduled", msg))

    def preempted(self, victim: Mapping[str, Any], by: str, node: str) -> None:
        """``victim``: a pod object or just its ``metadata`` (name, namespace, uid)."""
        pod = victim if "metadata" in victim else {"metadata": victim}
        self._submit(lambda: self._event(pod, "Normal", "Preempted", f"Preempted by {by} on node {node}"))

    def failed(
        self, pod: Mapping[str, Any], message: str, reason: str = "FailedScheduling", condition: bool = True
    ) -> bool:
        """Warn once per distinct message; returns whether anything was queued."""
        meta = pod.get("metadata") or {}
        if not self._first((str(meta.get("uid", "")), reason), message):
            return False
        self._submit(lambda: self._event(pod, "Warning", reason, message))
        if condition:
            self._submit(lambda: self._condition(pod, message))
        return True

    def about(self, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> bool:
        """An event on any object (``involved``: its ``apiVersion``, ``kind``, ``namespace``, ``name``,
        ``uid``; e.g. a PodGroup), once per distinct message; returns whether anything was queued."""
        k = (str(involved.get("uid") or f"{involved.get('kind')}/{involved.get('name')}"), reason)
        if not self._first(k, message):
            return False
        self._submit(lambda: self._write(dict(involved), type_, reason, message))
        return True

    def _first(self, k: tuple[str, str], message: str) -> bool:
        """Whether ``message`` is news for (object, reason); remembers it (the newest ``_DEDUP_MAX``)."""
        with self._lock:
            if self._seen.get(k) == message:
                return False
            self._seen.put(k, message)
        return True

    def write(self, fn: Callable[[], object]) -> None:
        """Queue another best-effort write (e.g. a group's status) behind the events."""
        self._submit(fn)

    def forget(self, uid: str, reasons: tuple[str, ...] = ("FailedScheduling", "InvalidGPURequest")) -> None:
        """The pod was bound or deleted (or, with ``reasons``, the object's trouble ended): a later
        event of those reasons is news again."""
        with self._lock:
            for reason in reasons:
                self._seen.pop((uid, reason))

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until queued writes are sent (tests, shutdown)."""
        marker = _Flushed()
        self._submit(marker)
        marker.done.wait(timeout)

    def stop(self) -> None:
        for _ in self._threads:
            try:
                self._q.put_nowait(None)
            except queue.Full:
                break

    # ---------------------------------------------------------- workers
    def counts(self) -> dict[str, int]:
        """Writes so far by result (``RESULTS``): sent, dropped (the queue was full), failed (the
        API refused or did not answer), stale (not sent: the pod was bound, replaced or deleted first,
        or a newer write of the same status went first)."""
        with self._lock:
            return dict(self._counts)

    def _count(self, result: str) -> None:
        with self._lock:
            self._counts[result] += 1

    def _submit(self, fn: Callable[[], object]) -> None:
        try:
            self._q.put_nowait(fn)
        except queue.Full:
            self._count("dropped")

    def _work(self) -> None:
        while True:
            fn = self._q.get()
            if fn is None:
                return
            if isinstance(fn, _Flushed):
                fn()
                continue
            try:
                self._count(STALE if fn() == STALE else "sent")
            except Exception as e:  # an event is best effort: log and go on
                self._count("failed")
                log.debug("event write failed: %s", e)

    def _event(self, pod: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        meta = pod.get("metadata") or {}
        involved = {"apiVersion": "v1", "kind": "Pod", "name": meta.get("name"), "uid": meta.get("uid")}
        self._write({**involved, "namespace": meta.get("namespace", "default")}, type_, reason, message)

    def _write(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        ns = involved.get("namespace") or "default"
        now = _now()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{involved.get('name')}.", "namespace": ns},
            "involvedObject": involved,
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "action": "Scheduling",
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self.core.create_namespaced_event(ns, body, _preload_content=False)

    def _condition(self, pod: Mapping[str, Any], message: str) -> str | None:
        """Set ``PodScheduled`` False / Unschedulable, unless the pod was bound meanwhile (module doc)."""
        meta = pod.get("metadata") or {}
        name, ns, uid = meta.get("name"), meta.get("namespace", "default"), meta.get("uid")
        # as kube-scheduler's UpdatePodCondition: the transition time moves only when the status does
        since = next(
            (
                c.get("lastTransitionTime")
                for c in (pod.get("status") or {}).get("conditions") or ()
                if c.get("type") == "PodScheduled" and c.get("status") == "False"
            ),
            None,
        )
        cond = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": since or _now(),
            "lastProbeTime": None,
        }
        version = meta.get("resourceVersion")
        for attempt in range(2):
            body: dict[str, Any] = {"status": {"conditions": [cond]}}
            if version:
                body["metadata"] = {"resourceVersion": str(version)}
            try:
                self.core.patch_namespaced_pod_status(name, ns, body, _preload_content=False)
                return None
            except ApiException as e:
                if e.status == 404:  # deleted: nothing to mark
                    return STALE
                if e.status != 409 or attempt:
                    raise
            fresh = read_pod(self.core, str(ns), str(name))
            fresh_meta = (fresh or {}).get("metadata") or {}
            if fresh is None or fresh_meta.get("uid") != uid or (fresh.get("spec") or {}).get("nodeName"):
                return STALE
            version = fresh_meta.get("resourceVersion")
        return None
