"""The node agent applies a MIG re-cut asked for on its Node (issue 31 item 3): the annotation
``gpusched.io/mig-reshape`` names one GPU and the instances to destroy and create (``core.mig.reshape``'s
plan); the agent applies it the node's way (its label ``gpusched.io/mig-reshape-way``, else the agent's flag):

- ``nvml`` (way (a)): through its backend (``agent.migreshape.apply``: the GPU must hold the layout the plan
  was made from, never a held instance, every step rolled back on a failure);
- ``mig-manager`` (way (b)): the GPU's target layout as a mig-parted configuration and the node label
  ``nvidia.com/mig.config`` (``agent.reshape.manager.MigManagerWay``), waiting for
  ``nvidia.com/mig.config.state`` on a thread of its own (the wait may last minutes); refused when a live pod
  holds an instance of that GPU, since mig-manager re-creates every instance of a GPU it changes;
- ``off``: refused.

It then lists the new devices to the kubelet (``DevicePlugin.replace_inventory``) and answers in
``gpusched.io/mig-reshape-status`` (``{"id", "state": "success"|"failed", "message"}``); the new geometry
reaches the scheduler in ``gpusched.io/mig-geometry`` at once (``Agent.check_reshape`` reads the Node every
``reshape_check_s``). A request is applied once per ``id``; the scheduler writes it (``k8s/migreshape.py``).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpusched.agent import mig
from gpusched.agent.inventory import Inventory
from gpusched.agent.migreshape import MigReshaper, ReshapeError, apply, request_step
from gpusched.agent.plugin import DevicePlugin
from gpusched.agent.pods import NodeWriter, PodSource
from gpusched.agent.reshape.apply import why_stale
from gpusched.agent.reshape.manager import MigManagerWay
from gpusched.agent.reshape.way import ReshapeWay, reshape_way
from gpusched.core.errors import GpuschedError
from gpusched.core.mig.reshape import GpuReshape
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
    """Applies the re-cuts asked for on this agent's Node (one per id), the node's way."""

    def __init__(
        self,
        backend: MigReshaper,
        plugin: DevicePlugin,
        pods: PodSource,
        nodes: NodeWriter,
        node: str,
        *,
        way: ReshapeWay = ReshapeWay.NVML,
        manager: MigManagerWay | None = None,
    ) -> None:
        self.backend, self.plugin, self.pods, self.nodes, self.node = backend, plugin, pods, nodes, node
        self.way, self.manager = way, manager
        self._waiting: str = ""  # the request id mig-manager is working on (way (b))
        self._finished = threading.Event()  # way (b) answered since the last check
        self._lock = threading.Lock()

    def check(self, node_obj: Mapping[str, Any]) -> bool:
        """Apply the node's request when it is new; True when one was answered (the GPUs may have changed)."""
        if self._finished.is_set():
            self._finished.clear()
            return True
        try:
            req = parse_request(node_obj)
        except ReshapeError as e:
            self._answer("", "failed", str(e))
            return True
        with self._lock:
            if req is None or answered(node_obj) == req.id or self._waiting == req.id:
                return False
        try:
            labels = (node_obj.get("metadata") or {}).get("labels") or {}
            way = reshape_way(self.node, labels, self.way)
            held = set(mig.held_mig(self.pods.pods_on_node(self.node), self.node, "", self._unwritten()))
            if way is ReshapeWay.MIG_MANAGER:
                self._by_manager(req, held)
                return False
            if way is not ReshapeWay.NVML:
                raise ReshapeError(f"MIG reshaping is {way.value} on node {self.node}")
            made = apply(self.backend, req.gpu, req.destroy, req.create, held)
        except GpuschedError as e:
            log.warning("MIG re-cut %s on GPU %d of %s: %s", req.id, req.gpu, self.node, e)
            self._answer(req.id, "failed", str(e))
            return True
        self.plugin.replace_inventory(self.backend.inventory())
        what = ", ".join(f"{m.profile} at {m.placement_start}" for m in made) or "nothing"
        log.info("MIG re-cut %s on GPU %d of %s: created %s", req.id, req.gpu, self.node, what)
        self._answer(req.id, "success", f"GPU {req.gpu}: created {what}")
        return True

    def _by_manager(self, req: ReshapeRequest, held: set[str]) -> None:
        """Way (b): checks, then mig-manager's configuration and the wait on a thread of its own."""
        if self.manager is None:
            raise ReshapeError(f"node {self.node}: the mig-manager way is not set up on its agent")
        inv = self.backend.inventory()
        d = inv.by_index(req.gpu)
        if d is None:
            raise ReshapeError(f"GPU {req.gpu}: no such GPU on {self.node}")
        step = request_step(inv, req.gpu, req.destroy, req.create, name=f"{self.node}/{req.gpu}")
        why = why_stale(d, step, held, self.node)
        if why:
            raise ReshapeError(f"GPU {req.gpu}: {why}")
        taken = sorted(m.uuid for m in d.mig_instances if m.uuid in held)
        if taken:
            raise ReshapeError(
                f"GPU {req.gpu}: mig-manager re-creates every instance of the GPU, and live pods hold "
                f"{', '.join(taken)}"
            )
        with self._lock:
            self._waiting = req.id
        threading.Thread(
            target=self._manager_job, args=(req, inv, step), daemon=True, name="gpusched-mig-manager"
        ).start()

    def _manager_job(self, req: ReshapeRequest, inv: Inventory, step: GpuReshape) -> None:
        assert self.manager is not None
        try:
            res = self.manager.apply(self.node, inv, [step])
            if res.ok:
                self.plugin.replace_inventory(self.backend.inventory())
                self._answer(req.id, "success", f"GPU {req.gpu}: {res.message}")
            else:
                self._answer(req.id, "failed", f"GPU {req.gpu}: {res.message}")
        except Exception as e:  # the API failed under the wait: answered, so the scheduler frees the GPU
            log.warning("MIG re-cut %s through mig-manager on %s: %s", req.id, self.node, e)
            try:
                self._answer(req.id, "failed", f"GPU {req.gpu}: {e}")
            except Exception as e2:
                log.warning("could not answer the MIG re-cut %s on %s: %s", req.id, self.node, e2)
        finally:
            with self._lock:
                self._waiting = ""
            self._finished.set()

    def _unwritten(self) -> dict[str, str]:
        pending = self.plugin.allocator._unwritten
        return {f"{ns}/{name}": v for (ns, name), v in pending.items()}

    def _answer(self, rid: str, state: str, message: str) -> None:
        status = json.dumps({"id": rid, "state": state, "message": message}, separators=(",", ":"))
        self.nodes.patch_node(self.node, {"metadata": {"annotations": {ANN_MIG_RESHAPE_STATUS: status}}})
