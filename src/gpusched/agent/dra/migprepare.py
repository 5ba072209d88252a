"""Dynamic MIG at Prepare: the instance a claim's placement names is created, and destroyed at Unprepare.

``NodePrepareResources`` for a device of ``migdynamic`` creates a GPU instance at the placement and one
compute instance spanning it, through the agent's backend (``create_mig_instance``: NVML on a GPU node,
``agent/reshape/nvmlops.py``; the fake backend's in tests: the calls way (a) of MIG reshaping uses). The new
MIG device's UUID goes into the claim's CDI spec. A claim with several placements gets all or none: when one
creation fails, the instances already made for it are destroyed again and the claim's error says what failed
and that it was rolled back (or what could not be undone).

Which instances prepared claims made is kept in a small checkpoint file (``<plugins dir>/<driver>/
mig-claims.json``, written atomically), so an agent restarted between Prepare and Unprepare still destroys
them, and publishes their placements as its own (a placement under an instance nobody prepared is withheld).
``NodeUnprepareResources`` destroys the claim's instances (one already gone is no error) and forgets them; a
failed destroy (a process still on it: NVML's IN_USE) is the claim's error, and the kubelet calls again.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpusched.agent.dra.claims import ClaimError, ClaimRef
from gpusched.agent.dra.migdynamic import Placement
from gpusched.agent.inventory import Inventory
from gpusched.agent.migprofiles import MigError
from gpusched.agent.migreshape import MigReshaper

log = logging.getLogger(__name__)

CHECKPOINT = "mig-claims.json"


@dataclass(frozen=True)
class Made:
    """One instance a claim's Prepare made: the device it was for, its GPU and its MIG UUID; its GPU instance
    and compute instance IDs (-1: unknown, a checkpoint written before they were kept)."""

    device: str
    gpu_index: int
    uuid: str
    gi_id: int = -1
    ci_id: int = -1


class MigClaims:
    """The checkpoint: claim UID -> the instances made for it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.claims: dict[str, tuple[Made, ...]] = {}
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            raise ClaimError(f"{path}: the dynamic-MIG checkpoint cannot be read: {e}") from None
        for uid, made in (doc.get("claims") or {}).items():
            self.claims[str(uid)] = tuple(_made(m) for m in made)

    def save(self) -> None:
        doc = {
            "claims": {
                uid: [
                    {"device": m.device, "gpu": m.gpu_index, "uuid": m.uuid, "gi": m.gi_id, "ci": m.ci_id}
                    for m in made
                ]
                for uid, made in sorted(self.claims.items())
            }
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, self.path)

    def uuids(self) -> frozenset[str]:
        return frozenset(m.uuid for made in self.claims.values() for m in made)


def _made(m: dict[str, object]) -> Made:
    gi, ci = m.get("gi", -1), m.get("ci", -1)  # absent in a checkpoint written before they were kept
    return Made(str(m["device"]), int(str(m["gpu"])), str(m["uuid"]), int(str(gi)), int(str(ci)))


def _present(inv: Inventory, gpu_index: int, uuid: str) -> bool:
    dev = inv.by_index(gpu_index)
    return dev is not None and any(m.uuid == uuid for m in dev.mig_instances)


@dataclass
class MigInstances:
    """Creates and destroys the instances of prepared claims through ``ops`` (the agent's backend)."""

    ops: MigReshaper
    checkpoint: MigClaims
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def snapshot(self) -> tuple[Inventory, frozenset[str]]:
        """The GPUs as they are and the MIG UUIDs prepared claims made, read together (no instance is seen
        half made)."""
        with self._lock:
            return self.ops.inventory(), self.checkpoint.uuids()

    def create(self, ref: ClaimRef, wanted: Sequence[tuple[str, Placement]]) -> dict[str, str]:
        """The instances for ``wanted`` (device name, placement); returns device name -> MIG UUID. A claim
        prepared before (this process or an earlier one) gets the instances made then, if they still exist."""
        with self._lock:
            inv = self.ops.inventory()
            before = self.checkpoint.claims.get(ref.uid, ())
            if {m.device for m in before} == {d for d, _ in wanted} and all(
                _present(inv, m.gpu_index, m.uuid) for m in before
            ):
                return {m.device: m.uuid for m in before}
            if before:  # made for another allocation of this UID, or lost in a GPU reset: start over
                self._destroy(ref, before)
            made: list[Made] = []
            for device, p in wanted:
                try:
                    m = self.ops.create_mig_instance(p.gpu_index, p.profile, p.start)
                except MigError as e:
                    raise ClaimError(self._rolled_back(ref, device, p, str(e), made)) from None
                made.append(Made(device, p.gpu_index, m.uuid, m.gi_id, m.ci_id))
                log.info("%s: created %s (%s) for device %s", ref, p, m.uuid, device)
            self.checkpoint.claims[ref.uid] = tuple(made)
            try:
                self.checkpoint.save()
            except OSError as e:
                self.checkpoint.claims.pop(ref.uid, None)
                raise ClaimError(self._rolled_back(ref, "", None, f"checkpoint: {e}", made)) from None
            return {m.device: m.uuid for m in made}

    def instance_ids(self, ref: ClaimRef) -> dict[str, tuple[int, int]]:
        """Device name -> (GPU instance ID, compute instance ID) of the instances made for ``ref`` (those of
        an older checkpoint without them: as the GPUs show them now)."""
        with self._lock:
            made = self.checkpoint.claims.get(ref.uid, ())
            inv = self.ops.inventory() if any(m.gi_id < 0 for m in made) else None
        out = {}
        for m in made:
            if m.gi_id >= 0:
                out[m.device] = (m.gi_id, m.ci_id)
                continue
            dev = inv.by_index(m.gpu_index) if inv is not None else None
            found = [x for x in (dev.mig_instances if dev is not None else ()) if x.uuid == m.uuid]
            if found:
                out[m.device] = (found[0].gi_id, found[0].ci_id)
        return out

    def _rolled_back(
        self, ref: ClaimRef, device: str, p: Placement | None, error: str, made: list[Made]
    ) -> str:
        what = f"cannot create {p} for device {device}: {error}" if p else error
        try:
            self._destroy(ref, tuple(made))
        except ClaimError as e:
            return f"{ref}: {what}; undoing failed: {e}"
        undone = f"; rolled back: destroyed {', '.join(m.uuid for m in made)}" if made else ""
        return f"{ref}: {what}{undone}"

    def _destroy(self, ref: ClaimRef, made: tuple[Made, ...]) -> None:
        inv = self.ops.inventory()
        failed = []
        for m in reversed(made):
            if not _present(inv, m.gpu_index, m.uuid):
                continue  # already gone (a GPU reset, an earlier Unprepare that failed part-way)
            try:
                gone = self.ops.destroy_mig_instance(m.gpu_index, m.uuid)
                log.info("%s: destroyed MIG %s at %d on GPU %d (%s)", ref, gone.profile, gone.placement_start,
                         m.gpu_index, m.uuid)  # fmt: skip
            except MigError as e:
                failed.append(f"destroy {m.uuid} on GPU {m.gpu_index}: {e}")
        if failed:
            raise ClaimError(f"{ref}: " + "; ".join(failed))

    def destroy(self, ref: ClaimRef) -> bool:
        """Destroys the claim's instances and forgets them; False when it had none. A failed destroy is a
        ``ClaimError`` and the claim stays recorded (the kubelet calls Unprepare again)."""
        with self._lock:
            made = self.checkpoint.claims.get(ref.uid)
            if not made:
                return False
            self._destroy(ref, made)
            del self.checkpoint.claims[ref.uid]
            self.checkpoint.save()
            return True
