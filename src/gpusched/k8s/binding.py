"""Carrying a decision to the API without ever losing a booking whose outcome is unknown.

A binding that fails is not always a binding that did not happen. When the connection drops
after the apiserver received the request (an apiserver restart, a proxy, a timeout), the API
may have committed it; the retry then answers ``409 ... already assigned``. A scheduler that
forgets its booking on such a failure sees the pod's GPUs as free and gives them to another pod
before its informer shows the pod bound: a GPU booked twice.

So the bind plugin's answer is read as one of four outcomes (``BindPlugin`` in
``core/framework.py``):

- SUCCESS: bound.
- UNSCHEDULABLE_AND_UNRESOLVABLE: the pod is gone (404): release the booking.
- UNSCHEDULABLE: the API refused and wrote nothing (403, 422, ...): release, decide again later.
- ERROR: **the outcome is unknown** (connection lost, timeout, 5xx, 429, or 409: already bound,
  perhaps by our own earlier attempt). The booking is kept and the pod is read back from the
  API (``settle``): bound → booked where the API says (``LiveCluster.upsert_pod``); gone or
  recreated under another UID → released; still pending → the *same* decision is bound again
  (so a late commit of the earlier attempt and the retry agree), with backoff.

When a front end stops retrying while the outcome is still unknown (it lost leadership, it is
stopping, or the extender's verb ran out of time) the booking goes to ``Settler.hold``: a
background loop reads the pod back until the API says what happened, and releases a pod still
pending only after ``grace_s``, by when a request the apiserver received has either been
committed or timed out (kube-apiserver's ``--request-timeout`` is 60 s).
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpusched.core.model import PodSpec
from gpusched.core.status import Code, Status
from gpusched.k8s.state import LiveCluster, Verdict

log = logging.getLogger(__name__)

PodReader = Callable[[str, str], Mapping[str, Any] | None]
"""``read(namespace, name)``: the pod as the API has it now, None when it does not exist;
raises when the API cannot be asked."""


class Result(enum.Enum):
    BOUND = "bound"
    """Bound: by this attempt, or by an earlier one whose answer was lost (the API says so)."""
    GONE = "gone"
    """The pod is gone; nothing is held."""
    REFUSED = "refused"
    """The API refused and wrote nothing; the booking is released: decide again later."""
    HELD = "held"
    """Retrying stopped with the outcome unknown; the booking is held until the API settles it."""


@dataclass(frozen=True, slots=True)
class Outcome:
    result: Result
    status: Status
    """The last answer of the bind plugin."""
    node: str = ""
    """Where the API shows the pod bound (``result`` BOUND)."""
    attempts: int = 1


class Settler:
    """Reads pods back from the API to settle bookings whose binding outcome is unknown.

    ``settle`` asks once (called by the binding loops); ``hold`` keeps a booking until the
    background loop it starts (every ``interval_s``; 0: none) or ``run_once`` sees it settled.
    """

    def __init__(
        self,
        cluster: LiveCluster,
        read_pod: PodReader,
        *,
        grace_s: float = 60.0,
        interval_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        on_released: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.read_pod = read_pod
        self.on_released = on_released
        """Called with the pod (as last read) whose held booking was released after ``grace_s``:
        it is still pending and needs a new decision (the standalone scheduler requeues it)."""
        self.grace_s = grace_s
        self.interval_s = interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._held: dict[str, tuple[PodSpec, float]] = {}  # key -> (pod, when its last attempt was made)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def settle(self, pod: PodSpec) -> Verdict | None:
        """Read ``pod`` back and make the books agree with the API; None if the API could not
        be asked (the booking stays)."""
        return self._settle(pod)[0]

    def _settle(self, pod: PodSpec) -> tuple[Verdict | None, Mapping[str, Any] | None]:
        try:
            obj = self.read_pod(pod.namespace, pod.name)
        except Exception as e:
            log.warning("cannot read back %s to settle its binding: %s", pod.key, e)
            return None, None
        return self.cluster.settle(pod.key, pod.uid, obj), obj

    def hold(self, pod: PodSpec) -> None:
        """Keep ``pod``'s booking until the API shows it bound or gone, or it has stayed pending
        for ``grace_s`` since now (the last binding attempt). Starts the background loop."""
        with self._lock:
            self._held[pod.key] = (pod, self.clock())
            start = self._thread is None and self.interval_s > 0
            if start:
                self._thread = threading.Thread(target=self._loop, name="settler", daemon=True)
        if start and self._thread is not None:
            self._thread.start()

    def held(self) -> list[str]:
        with self._lock:
            return sorted(self._held)

    def run_once(self) -> None:
        with self._lock:
            items = list(self._held.items())
        for key, (pod, since) in items:
            verdict, obj = self._settle(pod)
            if verdict is Verdict.PENDING and obj is not None and self.clock() - since >= self.grace_s:
                self.cluster.forget(key)
                log.info("released %s: unbound %.0f s after its last binding attempt", key, self.grace_s)
                if self.on_released is not None:
                    self.on_released(obj)
            elif verdict is Verdict.PENDING or verdict is None:
                continue
            with self._lock:
                if self._held.get(key, (None, 0.0))[1] == since:
                    del self._held[key]

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.run_once()
            except Exception:  # never let the loop die: bookings would be held forever
                log.exception("settling held bindings failed")


def bind_until_settled(
    bind: Callable[[], Status],
    pod: PodSpec,
    settler: Settler,
    *,
    keep_trying: Callable[[], bool],
    sleep: Callable[[float], None] = time.sleep,
    initial_backoff_s: float = 0.2,
    max_backoff_s: float = 5.0,
) -> Outcome:
    """Bind (``bind()`` runs the profile's bind plugins for the booked decision) until the API
    says what happened. The booking is released only when the pod is gone or the API refused
    the binding; on an unknown outcome the same decision is bound again while ``keep_trying()``,
    and handed to ``settler.hold`` when it stops."""
    delay = initial_backoff_s
    attempts = 0
    while True:
        attempts += 1
        st = bind()
        if st.ok:
            return Outcome(Result.BOUND, st, attempts=attempts)
        if st.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE:  # 404: the pod is gone
            settler.cluster.gone(pod.key, pod.uid)
            return Outcome(Result.GONE, st, attempts=attempts)
        verdict = settler.settle(pod)
        if verdict is Verdict.BOUND:
            return Outcome(Result.BOUND, st, settler.cluster.bound_node(pod.key), attempts)
        if verdict is Verdict.GONE:
            return Outcome(Result.GONE, st, attempts=attempts)
        if verdict is Verdict.PENDING and st.code == Code.UNSCHEDULABLE:
            settler.cluster.forget(pod.key)  # refused: nothing was written
            return Outcome(Result.REFUSED, st, attempts=attempts)
        if keep_trying():
            log.warning("binding %s: outcome unknown (%s); keeping its GPUs, retrying", pod.key, st.message())
            sleep(delay)
            delay = min(max_backoff_s, delay * 2)
        if not keep_trying():
            settler.hold(pod)
            return Outcome(Result.HELD, st, attempts=attempts)
