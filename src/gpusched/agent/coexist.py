"""Other device plugins in the kubelet's device-plugin directory that serve this node's GPUs.

The kubelet keeps one plugin per resource name: the last one to register. When gpusched's agent serves
``nvidia.com/gpu`` (or ``nvidia.com/mig-*``) and NVIDIA's device plugin runs on the same node too (both
installed by mistake), whichever registered last hands out the devices, and a restart of either flips it
(see ``docs/gpu-operator.md``). The agent cannot ask the kubelet which plugin holds a resource, so it asks
the plugins: every socket in the directory that is not the kubelet's nor the agent's own is called as a
device plugin (``ListAndWatch``, its first list, as the kubelet reads it), and one listing a device ID that
the agent serves under a resource of its own (GPU UUIDs, MIG UUIDs) is a second plugin for the same GPUs.
NVIDIA's plugin uses UUIDs as IDs by default (``--device-id-strategy=uuid``); with ``index`` IDs it is not
recognised.

The agent publishes what it found on its Node (``ANN_CONFLICT``), where ``gpusched doctor`` reads it.
With ``--no-nvidia-resources`` (NVIDIA's plugin serves ``nvidia.com/gpu``, the agent only share slots)
the same finding is expected and is no conflict.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpusched.agent.v1beta1 import api_pb2 as pb
from gpusched.agent.v1beta1 import api_pb2_grpc as pbg
from gpusched.core.names import ANN_CONFLICT as ANN_CONFLICT

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OtherPlugin:
    """A device plugin's socket in the directory and the device IDs of its first list."""

    socket: str
    device_ids: frozenset[str]


def list_devices(path: Path, timeout_s: float = 2.0) -> frozenset[str] | None:
    """The device IDs of the first ``ListAndWatch`` answer of the plugin at ``path``; None when it is no
    device plugin (nothing listens, another service, no answer within ``timeout_s``)."""
    with grpc.insecure_channel(f"unix://{path}") as ch:
        stream = pbg.DevicePluginStub(ch).ListAndWatch(  # type: ignore[no-untyped-call]
            pb.Empty(), timeout=timeout_s
        )
        try:
            first = next(iter(stream))
        except (grpc.RpcError, StopIteration) as e:
            log.debug("%s answered no device list: %s", path, e)
            return None
        finally:
            stream.cancel()
    return frozenset(d.ID for d in first.devices)


def other_plugins(plugin_dir: Path, own: Iterable[str], timeout_s: float = 2.0) -> list[OtherPlugin]:
    """The device plugins serving in ``plugin_dir`` other than the kubelet and the sockets ``own``."""
    skip = {"kubelet.sock", *own}
    out = []
    for path in sorted(plugin_dir.glob("*.sock")):
        if path.name in skip or not path.is_socket():
            continue
        ids = list_devices(path, timeout_s)
        if ids is not None:
            out.append(OtherPlugin(path.name, ids))
    return out


def conflicts(served: Mapping[str, Iterable[str]], others: Iterable[OtherPlugin]) -> dict[str, list[str]]:
    """resource -> the other plugins' sockets listing any of the device IDs the agent serves under it."""
    out: dict[str, list[str]] = {}
    for o in others:
        for resource, ids in served.items():
            if o.device_ids & set(ids):
                out.setdefault(resource, []).append(o.socket)
    return out


def conflict_annotation(served: Mapping[str, Iterable[str]], others: Iterable[OtherPlugin]) -> str | None:
    """``ANN_CONFLICT``'s value (None: no other plugin serves what the agent serves)."""
    others = list(others)
    found = conflicts(served, others)
    if not found:
        return None
    named = {s for socks in found.values() for s in socks}
    sockets = {o.socket: sorted(o.device_ids) for o in others if o.socket in named}
    return json.dumps({"resources": found, "sockets": sockets}, sort_keys=True, separators=(",", ":"))


# ------------------------------------------------- what the kubelet gave, when another plugin chose it

#: The kubelet's PodResources socket (``<kubelet root dir>/pod-resources/kubelet.sock``).
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")

#: (namespace, pod) -> container -> resource -> device IDs
Allocations = dict[tuple[str, str], dict[str, dict[str, list[str]]]]


def kubelet_allocations(socket: Path, resources: Iterable[str], timeout_s: float = 5.0) -> Allocations:
    """The devices of ``resources`` the kubelet gave each container (its PodResources ``List``): what the
    containers got, whichever plugin chose them. Raises ``grpc.RpcError`` when the kubelet does not answer."""
    from gpusched.agent.podresources_v1 import api_pb2 as pr
    from gpusched.agent.podresources_v1 import api_pb2_grpc as prg

    wanted = set(resources)
    out: Allocations = {}
    with grpc.insecure_channel(f"unix://{socket}") as ch:
        stub = prg.PodResourcesListerStub(ch)  # type: ignore[no-untyped-call]
        resp = stub.List(pr.ListPodResourcesRequest(), timeout=timeout_s)
    for p in resp.pod_resources:
        for c in p.containers:
            for d in c.devices:
                if d.resource_name in wanted and d.device_ids:
                    ids = out.setdefault((p.namespace, p.name), {}).setdefault(c.name, {})
                    ids.setdefault(d.resource_name, []).extend(d.device_ids)
    return out


def allocated_update(current: str | None, kubelet: Mapping[str, Mapping[str, list[str]]]) -> str | None:
    """The pod's ``gpusched.io/allocated`` with the kubelet's record of ``kubelet``'s resources merged in
    (the agent's own entries, e.g. share slots, kept); None when it already says so."""
    try:
        have = json.loads(current) if current else {}
        if not isinstance(have, dict):
            have = {}
    except ValueError:
        have = {}
    want = {c: dict(r) for c, r in have.items() if isinstance(r, dict)}
    for container, res in kubelet.items():
        want.setdefault(container, {}).update({r: sorted(ids) for r, ids in res.items()})
    if want == have:
        return None
    return json.dumps(want, sort_keys=True, separators=(",", ":"))
