"""``NodePrepareResources`` / ``NodeUnprepareResources``: the kubelet's DRA service v1.

Prepare, per claim: read the claim from the API, take its allocation results of this driver (all in this
node's pool, all devices this node publishes), write the claim's CDI spec and answer the devices with their
CDI IDs. A claim already prepared (by this process) is answered from memory without reading the API again;
an agent restarted in between reads the claim again and writes the same spec (same input, same file), so
Prepare is idempotent either way. A claim that cannot be prepared gets an ``error`` naming it (the kubelet
retries it and reports it on the pod); the other claims of the call are prepared.

Unprepare, per claim: delete its CDI spec. A claim never prepared (or already unprepared) is no error: the
kubelet may call again after a restart (the API's rule: idempotent).

Dynamic MIG (``--dra-mig dynamic``): a device that names a placement gets its instance created before the spec
is written, and destroyed at Unprepare (:mod:`gpusched.agent.dra.migprepare`); a spec that cannot be written
destroys the instances again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpusched.agent.allocation import Assignment
from gpusched.agent.dra.cdi import CdiSpecs, PreparedDevice
from gpusched.agent.dra.claims import AllocationResult, ClaimError, ClaimRef, ClaimSource, results_for
from gpusched.agent.dra.migdynamic import Placement
from gpusched.agent.dra.migprepare import MigInstances
from gpusched.agent.dra.slices import NodeSlice
from gpusched.agent.dra.v1 import api_pb2 as pb
from gpusched.agent.dra.v1 import api_pb2_grpc as pbg
from gpusched.agent.sharing import Mount, Sharing
from gpusched.k8s.quantity import parse_quantity

log = logging.getLogger(__name__)


def base_request(request: str) -> str:
    """``gpu/mig`` (a ``firstAvailable`` sub-request) -> ``gpu``: the kubelet matches a container's
    ``resources.claims[].request`` against the base name."""
    return request.split("/", 1)[0]


def consumed(r: AllocationResult, driver: str, ref: ClaimRef) -> tuple[int | None, int | None]:
    """A share's ``milli`` and memory (MiB, rounded down) from its consumed capacity (names bare or
    qualified by the driver); None where it names none."""
    values: dict[str, str] = {k.removeprefix(f"{driver}/"): v for k, v in r.consumed.items()}
    try:
        milli = int(parse_quantity(values["milli"])) if "milli" in values else None
        memory = int(parse_quantity(values["memory"]) // (1024 * 1024)) if "memory" in values else None
    except (ValueError, ArithmeticError):
        raise ClaimError(
            f"{ref}: device {r.device}: consumedCapacity {dict(r.consumed)} is no quantity"
        ) from None
    return milli, memory


@dataclass(frozen=True)
class PreparedClaim:
    ref: ClaimRef
    devices: tuple[PreparedDevice, ...]
    cdi_ids: tuple[str, ...]

    def response(self) -> pb.NodePrepareResourceResponse:
        out = []
        for d, cdi in zip(self.devices, self.cdi_ids, strict=True):
            dev = pb.Device(
                request_names=[d.request], pool_name=d.pool, device_name=d.device, cdi_device_ids=[cdi]
            )
            if d.share_id:
                dev.share_id = d.share_id
            out.append(dev)
        return pb.NodePrepareResourceResponse(devices=out)


@dataclass
class Preparer:
    """What Prepare and Unprepare do, without gRPC (the servicer below wraps it)."""

    claims: ClaimSource
    cdi: CdiSpecs
    current_slice: Callable[[], NodeSlice]
    mig: MigInstances | None = None
    """Dynamic MIG: creates a placement's instance at Prepare, destroys it at Unprepare."""
    sharing: Sharing = field(default_factory=Sharing)
    """What enforces a share's consumed capacity (``--sharing``): its container's env and mounts."""
    prepared: dict[str, PreparedClaim] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def prepare(self, ref: ClaimRef) -> PreparedClaim:
        with self._lock:
            done = self.prepared.get(ref.uid)
        if done is not None:
            return done
        pool = self.current_slice()
        claim = self.claims.get_claim(ref.namespace, ref.name)
        results = results_for(claim, ref, pool.driver, pool.pool)
        for r in results:
            if r.device not in pool.by_name:
                raise ClaimError(
                    f"{ref}: device {r.device} is not published in pool {pool.pool!r} of driver {pool.driver}"
                )
        made = self._create_mig(ref, [(r.device, pool.by_name[r.device].placement) for r in results])
        try:
            made_ids = self.mig.instance_ids(ref) if made and self.mig is not None else {}
            devices = []
            for r in results:
                dev = pool.by_name[r.device]
                milli, memory = consumed(r, pool.driver, ref)
                visible = made.get(r.device, dev.visible_id)
                env: tuple[tuple[str, str], ...] = ()
                mounts: tuple[Mount, ...] = ()
                if r.share_id:
                    a = Assignment(pool.node, (dev.gpu_index,), 1000 if milli is None else milli, memory or 0)
                    share = self.sharing.container(visible, a, (ref.uid, f"{r.device}-{r.share_id}"))
                    env, mounts = tuple(share.envs.items()), share.mounts
                devices.append(
                    PreparedDevice(
                        base_request(r.request), r.pool, r.device, visible, dev.gpu_index, dev.gpu_minor,
                        r.share_id,
                        milli, memory, env, mounts, made_ids.get(r.device, dev.mig),
                    )
                )  # fmt: skip
            ids = self.cdi.write(ref.uid, f"{ref.namespace}/{ref.name}", devices)
        except BaseException:
            if made and self.mig is not None:
                try:
                    self.mig.destroy(ref)
                except ClaimError as e:
                    log.warning("%s", e)
            raise
        done = PreparedClaim(ref, tuple(devices), tuple(ids))
        with self._lock:
            self.prepared[ref.uid] = done
        log.info("prepared %s: %s", ref, ", ".join(ids) or "no device of this driver")
        return done

    def _create_mig(self, ref: ClaimRef, devices: list[tuple[str, Placement | None]]) -> dict[str, str]:
        wanted = [(d, p) for d, p in devices if p is not None]
        if not wanted:
            return {}
        if self.mig is None:
            raise ClaimError(
                f"{ref}: device {wanted[0][0]} is a MIG placement, and this agent cannot create one"
            )
        return self.mig.create(ref, wanted)

    def unprepare(self, ref: ClaimRef) -> None:
        with self._lock:
            self.prepared.pop(ref.uid, None)
        removed = self.cdi.remove(ref.uid)
        if self.mig is not None:
            self.mig.destroy(ref)
        if removed:
            log.info("unprepared %s", ref)


def _ref(c: Any) -> ClaimRef:
    return ClaimRef(str(c.namespace), str(c.name), str(c.uid))


class DraServicer(pbg.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer

    def NodePrepareResources(
        self, request: pb.NodePrepareResourcesRequest, context: Any
    ) -> pb.NodePrepareResourcesResponse:
        out = pb.NodePrepareResourcesResponse()
        for c in request.claims:
            ref = _ref(c)
            try:
                out.claims[ref.uid].CopyFrom(self.preparer.prepare(ref).response())
            except ClaimError as e:
                log.warning("NodePrepareResources: %s", e)
                out.claims[ref.uid].CopyFrom(pb.NodePrepareResourceResponse(error=str(e)))
            except Exception as e:  # the API unreachable, a full disk: the kubelet retries
                log.warning("NodePrepareResources: %s: %s", ref, e)
                out.claims[ref.uid].CopyFrom(pb.NodePrepareResourceResponse(error=f"{ref}: {e}"))
        return out

    def NodeUnprepareResources(
        self, request: pb.NodeUnprepareResourcesRequest, context: Any
    ) -> pb.NodeUnprepareResourcesResponse:
        out = pb.NodeUnprepareResourcesResponse()
        for c in request.claims:
            ref = _ref(c)
            try:
                self.preparer.unprepare(ref)
                out.claims[ref.uid].CopyFrom(pb.NodeUnprepareResourceResponse())
            except ClaimError as e:
                log.warning("NodeUnprepareResources: %s", e)
                out.claims[ref.uid].CopyFrom(pb.NodeUnprepareResourceResponse(error=str(e)))
            except OSError as e:
                log.warning("NodeUnprepareResources: %s: %s", ref, e)
                out.claims[ref.uid].CopyFrom(pb.NodeUnprepareResourceResponse(error=f"{ref}: {e}"))
        return out
