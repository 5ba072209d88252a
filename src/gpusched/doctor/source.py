"""A snapshot of a live cluster through the Kubernetes API (kubeconfig or in-cluster)."""

from __future__ import annotations

import json
import os
from typing import Any

from gpusched.doctor.errors import ApiUnreachable
from gpusched.doctor.snapshot import Snapshot

API_TIMEOUT_S = 10.0


def from_api(
    kubeconfig: str | None = None, *, timeout_s: float = API_TIMEOUT_S, queues: bool = True
) -> Snapshot:
    """List every Node and Pod, and (with ``queues``) the Queues (``queues.gpusched.io``) with the
    Namespaces when the API serves Queues (a cluster without the CRD: no queues, not an error).
    Raises ApiUnreachable naming the server (or the kubeconfig) when the API cannot be read."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException
    from urllib3.exceptions import HTTPError

    from gpusched.k8s.client import api_client

    path = kubeconfig or os.environ.get("KUBECONFIG") or ""
    where = f"kubeconfig {path}" if path else "in-cluster config"
    try:
        api = api_client(kubeconfig)
    except (ConfigException, OSError, ValueError, TypeError) as e:
        hint = "" if path else " (no --kubeconfig and $KUBECONFIG unset)"
        raise ApiUnreachable(f"Kubernetes API: cannot load {where}{hint}: {e}") from None
    host = api.configuration.host
    v1 = client.CoreV1Api(api)
    try:
        raw_nodes: Any = v1.list_node(_preload_content=False, _request_timeout=timeout_s)
        raw_pods: Any = v1.list_pod_for_all_namespaces(_preload_content=False, _request_timeout=timeout_s)
        nodes, pods = json.loads(raw_nodes.data), json.loads(raw_pods.data)
        queue_objs, namespaces, unreadable = _queues(api, timeout_s) if queues else (None, [], "")
        dra = _dra(api, timeout_s)
    except ApiException as e:
        raise ApiUnreachable(f"Kubernetes API at {host}: {e.status} {e.reason}") from None
    except (HTTPError, OSError) as e:
        raise ApiUnreachable(f"Kubernetes API at {host} is unreachable: {type(e).__name__}: {e}") from None
    finally:
        api.close()  # type: ignore[no-untyped-call]
    return Snapshot(
        nodes.get("items") or [],
        pods.get("items") or [],
        f"API {host}",
        queues=queue_objs,
        namespaces=namespaces,
        queues_unreadable=unreadable,
        dra=dra,
    )


def _dra(api: Any, timeout_s: float) -> dict[str, list[Any]]:
    """The ``resource.k8s.io/v1`` objects by kind (``snapshot.DRA_KINDS``); a kind the API does not
    serve (404) or refuses doctor (403) is left out. Other errors propagate."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    r = client.ResourceV1Api(api)
    lists: dict[str, Any] = {
        "deviceClasses": r.list_device_class,
        "resourceSlices": r.list_resource_slice,
        "resourceClaims": r.list_resource_claim_for_all_namespaces,
        "deviceTaintRules": r.list_device_taint_rule,
    }
    out: dict[str, list[Any]] = {}
    for kind, fn in lists.items():
        try:
            raw: Any = fn(_preload_content=False, _request_timeout=timeout_s)
        except ApiException as e:
            if e.status in (403, 404):
                continue
            raise
        out[kind] = json.loads(raw.data).get("items") or []
    return out


def _queues(api: Any, timeout_s: float) -> tuple[list[Any] | None, list[Any], str]:
    """The Queue objects, the Namespaces and why they could not be read: (None, [], "") when Queues
    are not served (404), as the scheduler then ignores queues; (None, [], why) when the API
    refuses to list them (403: a reader without that permission, e.g. the defrag controller's
    service account), which doctor then names instead of checking quotas. Other errors propagate."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from gpusched.k8s.queues import GROUP, PLURAL, VERSION

    try:
        raw: Any = client.CustomObjectsApi(api).list_cluster_custom_object(
            GROUP, VERSION, PLURAL, _preload_content=False, _request_timeout=timeout_s
        )
        raw_ns: Any = client.CoreV1Api(api).list_namespace(_preload_content=False, _request_timeout=timeout_s)
    except ApiException as e:
        if e.status == 404:
            return None, [], ""
        if e.status == 403:
            return None, [], f"listing Queues or Namespaces: {e.status} {e.reason}"
        raise
    return json.loads(raw.data).get("items") or [], json.loads(raw_ns.data).get("items") or [], ""
