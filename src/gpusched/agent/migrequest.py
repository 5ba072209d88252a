"""The node agent applies a MIG re-cut asked for on its Node (issue 31 item 3, way (a)): the annotation
``gpusched.io/mig-reshape`` names one GPU and the instances to destroy and create (``core.mig.reshape``'s
plan); the agent applies it through its backend (``agent.migreshape``: never a held instance, every step
rolled back on a failure), lists the new devices to the kubelet (``DevicePlugin.replace_inventory``) and
answers in ``gpusched.io/mig-reshape-status`` (``{"id", "state": "success"|"failed", "message"}``); the new
geometry reaches the scheduler in ``gpusched.io/mig-geometry`` at once (``Agent.check_reshape`` reads the Node
every ``reshape_check_s``). A request is applied once per ``id``; the scheduler writes it
(``k8s/migreshape.py``). Only the fake backend can re-cut yet (NVML's create/destroy calls are not written).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpusched.agent import mig
from gpusched.agent.migreshape import MigReshaper, ReshapeError, apply
from gpusched.agent.plugin import DevicePlugin
from gpusched.agent.pods import NodeWriter, PodSource
from gpusched.core.names import ANN_MIG_RESHAPE, ANN_MIG_RESHAPE_STATUS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReshapeRequest:
    id: str
    gpu: int
    destroy: tuple[tuple[str, int], ...]
    create: tuple[tuple[str, int], ...]


def _places(items: object, field: str) -> tuple[tuple[str, int], ...]:
    if not isinstance(items, list):
        raise ReshapeError(f"annotation {ANN_MIG_RESHAPE} field {field} is not a list")
    out = []
    for it in items:
        p, s = (it.get("profile"), it.get("start")) if isinstance(it, dict) else (None, None)
        if not isinstance(p, str) or not isinstance(s, int) or isinstance(s, bool) or s < 0:
            raise ReshapeError(
                f"annotation {ANN_MIG_RESHAPE} field {field}: {it!r} is not {{profile, start}}"
            )
        out.append((p, s))
    return tuple(out)


def parse_request(node: Mapping[str, Any]) -> ReshapeRequest | None:
    """The node's re-cut request (None without one); ReshapeError naming the field for one that does not
    read."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(ANN_MIG_RESHAPE)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        raise ReshapeError(f"annotation {ANN_MIG_RESHAPE} is not JSON: {raw!r}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("id"), str) or not doc["id"]:
        raise ReshapeError(f"annotation {ANN_MIG_RESHAPE} has no id: {raw!r}")
    gpu = doc.get("gpu")
    if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0:
        raise ReshapeError(f"annotation {ANN_MIG_RESHAPE} field gpu is not a GPU index: {raw!r}")
    return ReshapeRequest(
        doc["id"], gpu, _places(doc.get("destroy", []), "destroy"), _places(doc.get("create", []), "create")
    )


def answered(node: Mapping[str, Any]) -> str:
    """The id of the request the node's status answers ("" for none)."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(ANN_MIG_RESHAPE_STATUS)
    try:
        doc = json.loads(raw) if raw else {}
    except ValueError:
        return ""
    return str(doc.get("id", "")) if isinstance(doc, dict) else ""


class MigReshapes:
    """Applies the re-cuts asked for on this agent's Node (one per id), through a backend that can re-cut."""

    def __init__(
        self, backend: MigReshaper, plugin: DevicePlugin, pods: PodSource, nodes: NodeWriter, node: str
    ) -> None:
        self.backend, self.plugin, self.pods, self.nodes, self.node = backend, plugin, pods, nodes, node

    def check(self, node_obj: Mapping[str, Any]) -> bool:
        """Apply the node's request when it is new; True when one was answered (the GPUs may have changed)."""
        try:
            req = parse_request(node_obj)
        except ReshapeError as e:
            self._answer("", "failed", str(e))
            return True
        if req is None or answered(node_obj) == req.id:
            return False
        try:
            held = mig.held_mig(self.pods.pods_on_node(self.node), self.node, "", self._unwritten())
            made = apply(self.backend, req.gpu, req.destroy, req.create, set(held))
        except ReshapeError as e:
            log.warning("MIG re-cut %s on GPU %d of %s: %s", req.id, req.gpu, self.node, e)
            self._answer(req.id, "failed", str(e))
            return True
        self.plugin.replace_inventory(self.backend.inventory())
        what = ", ".join(f"{m.profile} at {m.placement_start}" for m in made) or "nothing"
        log.info("MIG re-cut %s on GPU %d of %s: created %s", req.id, req.gpu, self.node, what)
        self._answer(req.id, "success", f"GPU {req.gpu}: created {what}")
        return True

    def _unwritten(self) -> dict[str, str]:
        pending = self.plugin.allocator._unwritten
        return {f"{ns}/{name}": v for (ns, name), v in pending.items()}

    def _answer(self, rid: str, state: str, message: str) -> None:
        status = json.dumps({"id": rid, "state": state, "message": message}, separators=(",", ":"))
        self.nodes.patch_node(self.node, {"metadata": {"annotations": {ANN_MIG_RESHAPE_STATUS: status}}})
