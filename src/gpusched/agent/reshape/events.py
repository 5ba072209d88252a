"""The Node event of a reshape's result (``ReshapeResult`` or ``ManagerResult``: their ``event_type``,
``reason`` and ``message``), so that an operator sees on ``kubectl describe node`` that a GPU was reshaped,
rolled back or left alone. Best effort, as the agent's pod events are. ``OutcomeEvent`` gives both result
types ``ok``, ``event_type`` and ``reason`` from one table per type (outcome → event type, reason)."""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

log = logging.getLogger(__name__)


class ResultEvent(Protocol):
    @property
    def event_type(self) -> str: ...

    @property
    def reason(self) -> str: ...

    @property
    def message(self) -> str: ...


class OutcomeEvent:
    """A reshape result's event, read from its ``outcome`` through the class's ``EVENTS`` table; ``ok`` is
    the outcome ``applied``. Each result type says its own ``message``."""

    EVENTS: ClassVar[Mapping[Any, tuple[str, str]]]
    outcome: enum.Enum

    @property
    def ok(self) -> bool:
        return bool(self.outcome.value == "applied")

    @property
    def event_type(self) -> str:
        return self.EVENTS[self.outcome][0]

    @property
    def reason(self) -> str:
        return self.EVENTS[self.outcome][1]


class NodeEvents:
    """Events on Nodes over the Kubernetes API (``kubernetes.client.ApiClient``), in namespace ``default``
    as the kubelet records its Node events."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)

    def record(self, node: str, result: ResultEvent) -> None:
        from kubernetes import client

        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{node}.", namespace="default"),
            involved_object=client.V1ObjectReference(kind="Node", name=node),
            reason=result.reason,
            message=result.message[:1024],
            type=result.event_type,
            source=client.V1EventSource(component="gpusched-agent", host=node),
        )
        try:
            self._core.create_namespaced_event("default", body)
        except Exception as e:  # an event is best effort
            log.warning("could not record event %s on node %s: %s", result.reason, node, e)
