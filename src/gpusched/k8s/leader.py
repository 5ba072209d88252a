"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's ``leaderelection``.

Not ``kubernetes.leaderelection`` of the Python client: it uses the global client
configuration, cannot be stopped, and gives leadership up only after its renew loop ends.
This loop is small and explicit:

- every ``retry_s`` read the Lease; a candidate takes it when it does not exist, when it is
  free (empty holder) or when its record has not changed for ``lease_s`` *as observed
  locally* (no clock comparison across machines); the write is a ``replace`` carrying the
  read ``resourceVersion``, so two candidates can never both win (409 Conflict);
- the leader renews every ``retry_s``; when it has not renewed for ``renew_s``, or sees
  another holder, it stops leading at once (``on_stopped`` runs before anything else);
- ``stop()`` releases the Lease (empty holder) so that a standby takes over without waiting.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)


def default_identity() -> str:
    return f"{socket.gethostname()}_{os.getpid()}_{uuid.uuid4().hex[:6]}"


class LeaderElector:
    def __init__(
        self,
        api: Any,
        *,
        name: str = "gpusched-scheduler",
        namespace: str = "kube-system",
        identity: str | None = None,
        lease_s: float = 15.0,
        renew_s: float = 10.0,
        retry_s: float = 2.0,
        on_started: Callable[[], None] | None = None,
        on_stopped: Callable[[], None] | None = None,
    ) -> None:
        self.coord = client.CoordinationV1Api(api)
        self.name, self.namespace = name, namespace
        self.identity = identity or default_identity()
        self.lease_s, self.renew_s, self.retry_s = lease_s, renew_s, retry_s
        self.on_started, self.on_stopped = on_started, on_stopped
        self.leading = threading.Event()
        self._stop = threading.Event()
        self._observed: tuple[object, ...] | None = None
        self._observed_at = 0.0
        self._last_renew = 0.0
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ loop
    def start(self) -> LeaderElector:
        self._thread = threading.Thread(target=self.run, name="leader-election", daemon=True)
        self._thread.start()
        return self

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                ok = self.try_acquire_or_renew()
            except Exception as e:  # API down: keep trying, the deadline decides
                log.warning("lease %s/%s: %s", self.namespace, self.name, e)
                ok = False
            now = time.monotonic()
            if ok:
                self._last_renew = now
                if not self.leading.is_set():
                    log.info("%s became leader (lease %s/%s)", self.identity, self.namespace, self.name)
                    self.leading.set()
                    if self.on_started:
                        self.on_started()
            elif self.leading.is_set() and (now - self._last_renew > self.renew_s or self._held_by_other()):
                self._lose("could not renew the lease" if not self._held_by_other() else "lease taken")
            self._stop.wait(self.retry_s)

    def _held_by_other(self) -> bool:
        return self._observed is not None and self._observed[0] not in ("", self.identity)

    def _lose(self, why: str) -> None:
        log.warning("%s stopped leading: %s", self.identity, why)
        self.leading.clear()
        if self.on_stopped:
            self.on_stopped()

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.retry_s + 5)
        if self.leading.is_set():
            self.leading.clear()
            if self.on_stopped:
                self.on_stopped()
            if release:
                self._release()

    # ------------------------------------------------------ one attempt
    def try_acquire_or_renew(self) -> bool:
        now = dt.datetime.now(dt.UTC)
        try:
            lease = self.coord.read_namespaced_lease(self.name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                spec=self._spec(now, now, 0),
            )
            try:
                self.coord.create_namespaced_lease(self.namespace, body)
            except ApiException as e2:
                if e2.status == 409:
                    return False
                raise
            self._observe((self.identity, now))
            return True
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity or ""
        record = (holder, spec.renew_time, spec.lease_transitions)
        self._observe(record)
        duration = spec.lease_duration_seconds or self.lease_s
        expired = time.monotonic() - self._observed_at > duration
        if holder and holder != self.identity and not expired:
            return False
        transitions = spec.lease_transitions or 0
        if holder == self.identity:
            acquired = spec.acquire_time or now
        else:
            acquired, transitions = now, transitions + 1
        lease.spec = self._spec(acquired, now, transitions)
        try:
            self.coord.replace_namespaced_lease(self.name, self.namespace, lease)  # carries resourceVersion
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        self._observe((self.identity, now))
        return True

    def _observe(self, record: tuple[object, ...]) -> None:
        if record != self._observed:
            self._observed = record
            self._observed_at = time.monotonic()

    def _spec(self, acquired: dt.datetime, renewed: dt.datetime, transitions: int) -> client.V1LeaseSpec:
        return client.V1LeaseSpec(
            holder_identity=self.identity,
            lease_duration_seconds=int(self.lease_s),
            acquire_time=acquired,
            renew_time=renewed,
            lease_transitions=transitions,
        )

    def _release(self) -> None:
        try:
            lease = self.coord.read_namespaced_lease(self.name, self.namespace)
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            lease.spec.holder_identity = ""
            lease.spec.lease_duration_seconds = 1
            lease.spec.renew_time = dt.datetime.now(dt.UTC)
            self.coord.replace_namespaced_lease(self.name, self.namespace, lease)
        except Exception as e:
            log.warning("could not release lease %s/%s: %s", self.namespace, self.name, e)

    def holder(self) -> str:
        lease = self.coord.read_namespaced_lease(self.name, self.namespace)
        return str((lease.spec.holder_identity if lease.spec else "") or "")
