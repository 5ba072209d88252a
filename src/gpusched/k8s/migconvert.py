"""MIG on Kubernetes objects ⇄ the core (``core.mig.books``): the MIG slices a pod asks for, a node's MIG
geometry from its agent's annotation ``gpusched.io/mig-geometry``, and the slices of an assignment.

- A pod asks for MIG slices with ``nvidia.com/mig-<profile>: N`` (NVIDIA's mixed strategy names; ``+me`` is
  written ``.me`` in a resource name, ``nvidia.com/mig-1g.10gb.me``). ``PodSpec.mig`` lists one profile per
  slice.
- The node annotation (written by ``gpusched.agent.labels.mig_annotation``)::

      {"strategy": "mixed", "gpus": [{"index": 0, "model": "a100-80gb", "migEnabled": true,
        "instances": [{"profile": "3g.40gb", "start": 4, "uuid": "MIG-..."}]}]}

  ``index`` is the GPU's NVML index on the node, ``model`` a class of ``core.mig.profiles``. A node without
  it books MIG slices as counts only; one that cannot be read is used so too, with a warning naming the node.
  Under ``"strategy": "single"`` each MIG device is one ``nvidia.com/gpu`` of the node, booked as a GPU
  (the memory label is the MIG device's); no geometry is needed.
- The assignment's ``mig`` field: ``[{"gpu": 0, "start": 4, "profile": "3g.40gb"}]`` (docs/annotations.md).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import orjson

from gpusched.core.mig.books import MigSlot, NodeMig
from gpusched.core.mig.geometry import Geometry, Instance, MigGpu
from gpusched.core.mig.profiles import ALL_PROFILE_NAMES, MigError
from gpusched.core.mig.whatif import MIG_RESOURCE_PREFIX, mig_resource
from gpusched.core.names import ANN_ASSIGNMENT, ANN_MIG, ANN_MIG_RESHAPE, ANN_MIG_RESHAPE_STATUS
from gpusched.k8s.errors import InvalidRequest

log = logging.getLogger(__name__)

RES_MIG_PREFIX = MIG_RESOURCE_PREFIX


def profile_of(resource: str) -> str | None:
    """The MIG profile of a resource name (``nvidia.com/mig-1g.10gb.me`` -> ``1g.10gb+me``), else None."""
    if not resource.startswith(RES_MIG_PREFIX):
        return None
    p = resource.removeprefix(RES_MIG_PREFIX)
    return p[: -len(".me")] + "+me" if p.endswith(".me") else p


def resource_of(profile: str) -> str:
    return mig_resource(profile)


def pod_mig(req: Mapping[str, Decimal], *, running: bool) -> tuple[str, ...]:
    """One profile name per MIG slice the requests ask for, sorted. A ``running`` pod's unknown profiles are
    left out (it is booked as the kubelet admitted it: by count only)."""
    out: list[str] = []
    for name, q in req.items():
        p = profile_of(name)
        if p is None or q <= 0:
            continue
        if running and p not in ALL_PROFILE_NAMES:
            continue
        out += [p] * int(q)
    return tuple(sorted(out))


def node_mig(node: Mapping[str, Any]) -> NodeMig | None:
    """The node's MIG geometry from its agent's annotation; None without one, or (with a warning) for one
    that cannot be read."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name") or "?")
    raw = (meta.get("annotations") or {}).get(ANN_MIG)
    if raw is None:
        return None
    try:
        return _parse(name, raw, node)
    except (MigError, ValueError, TypeError, KeyError, AttributeError) as e:
        _warn(name, str(raw)[:200], str(e))
        return None


def _int(v: object, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ValueError(f"{what} {v!r} is not a non-negative integer")
    return v


def _parse(node: str, raw: object, doc_node: Mapping[str, Any]) -> NodeMig | None:
    if not isinstance(raw, str) or len(raw) > 65536:
        raise ValueError("is not a JSON document of at most 64 KiB")
    doc = orjson.loads(raw)
    strategy = doc.get("strategy", "mixed")
    if strategy not in ("mixed", "single"):
        raise ValueError(f"strategy {strategy!r} is not mixed or single")
    if strategy == "single":
        return None  # each MIG device is one nvidia.com/gpu: booked as a GPU (docs/mig.md, "single")
    gpus, indices = [], []
    for g in doc["gpus"]:
        index = _int(g["index"], "GPU index")
        geom = Geometry.of(str(g["model"]))
        insts = tuple(
            Instance(str(i["profile"]), _int(i["start"], f"GPU {index} start"))
            for i in g.get("instances") or []
        )
        gpu = MigGpu(f"{node}/{index}", geom, bool(g.get("migEnabled", True)))
        for inst in insts:  # checks each profile and start against the model (MigError)
            gpu = gpu.place(inst.profile, inst.start)
        gpus.append(gpu)
        indices.append(index)
    return NodeMig(tuple(gpus), tuple(indices), reshaping(doc_node))


def reshaping(node: Mapping[str, Any]) -> frozenset[int]:
    """The GPU a re-cut asked on the node (``gpusched.io/mig-reshape``) is for, while the agent has not
    answered it (``gpusched.io/mig-reshape-status`` with its id); empty otherwise."""
    ann = (node.get("metadata") or {}).get("annotations") or {}
    try:
        req = orjson.loads(ann[ANN_MIG_RESHAPE]) if ANN_MIG_RESHAPE in ann else None
        done = orjson.loads(ann[ANN_MIG_RESHAPE_STATUS]) if ANN_MIG_RESHAPE_STATUS in ann else {}
        if not isinstance(req, dict) or (isinstance(done, dict) and done.get("id") == req.get("id")):
            return frozenset()
        return frozenset({_int(req["gpu"], "gpu")})
    except (ValueError, KeyError, TypeError):
        return frozenset()


@functools.lru_cache(maxsize=1024)
def _warn(node: str, raw: str, why: str) -> None:
    """Once per node and value (node objects are re-read on every status update)."""
    log.warning(
        "node %s: annotation %s is not used (MIG slices booked as counts only): %s", node, ANN_MIG, why
    )


def slots_json(slots: tuple[MigSlot, ...]) -> list[dict[str, object]]:
    return [{"gpu": s.gpu, "start": s.start, "profile": s.profile} for s in slots]


def slots_of(items: Any) -> tuple[MigSlot, ...]:
    """MIG slices from their JSON form (``slots_json``). Raises ValueError, KeyError or TypeError for one
    that cannot be read."""
    return tuple(MigSlot(_int(i["gpu"], "gpu"), _int(i["start"], "start"), str(i["profile"])) for i in items)


def assignment_mig(pod: Mapping[str, Any]) -> tuple[MigSlot, ...] | None:
    """The MIG slices of the pod's assignment annotation; None when it has none (or no ``mig`` field).
    Raises InvalidRequest naming the pod and the field for one that cannot be read."""
    meta = pod.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(ANN_ASSIGNMENT)
    if raw is None:
        return None
    key = f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"
    try:
        data = orjson.loads(raw)
        items = data.get("mig")
        if items is None:
            return None
        return slots_of(items)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise InvalidRequest(f"pod {key}: annotation {ANN_ASSIGNMENT} field mig is not valid: {e}") from None
