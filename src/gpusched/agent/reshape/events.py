"""The Node event of a reshape's result (``ReshapeResult`` or ``ManagerResult``: their ``event_type``,
``reason`` and ``message``), so that an operator sees on ``kubectl describe node`` that a GPU was reshaped,
rolled back or left alone. Best effort, as the agent's pod events are."""

from __future__ import annotations

import logging
from typing import Any, Protocol

log = logging.getLogger(__name__)


class ResultEvent(Protocol):
    @property
    def event_type(self) -> str: ...

    @property
    def reason(self) -> str: ...

    @property
    def message(self) -> str: ...


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
