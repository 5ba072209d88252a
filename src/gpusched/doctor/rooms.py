"""Defragmentation rooms that bear on a pending pod (issue 28 F4): the rooms other pending pods
carry (``gpusched.io/defrag-room``) that the scheduler keeps from this pod (same or lower
priority), and the pod's own room. Each names its node, GPUs, plan and expiry; a room that names
no plan (hand-written, or from a version before plans were recorded) is said to hold nothing.
Whether the controller's Lease backs a room is the scheduler's check (``k8s/reservation.py``):
doctor reads pods, not the Lease, and says so."""

from __future__ import annotations

import datetime as dt

from gpusched.core.model import PodSpec
from gpusched.doctor.books import Books
from gpusched.doctor.findings import Finding
from gpusched.k8s.convert import InvalidRequest
from gpusched.k8s.migconvert import slots_json
from gpusched.k8s.reservation import Room, parse_room, room_text


def _when(expires: float) -> str:
    if not expires:
        return "no expiry"
    return "expires " + dt.datetime.fromtimestamp(expires, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _describe(key: str, room: Room) -> str:
    where = f"node {room.node} {room_text(room.gpus, room.mig)} for {key}"
    kept = [f"{room_text((), s.mig)} on node {s.node}" for s in room.steer if s.mig]
    if kept:
        where += f", and for the pods it moves {'; '.join(kept)}"
    if not room.plan:
        return f"{where}: names no plan, so the scheduler holds nothing for it (not the controller's)"
    return f"{where} (plan {room.plan}, {_when(room.expires)}; held while the controller's Lease records it)"


def room_findings(books: Books, pod: PodSpec) -> list[Finding]:
    out: list[Finding] = []
    for key in sorted(books.pending):
        obj = books.pod_objs.get(key)
        if obj is None:
            continue
        try:
            room = parse_room(obj)
        except InvalidRequest as e:
            out.append(Finding("scheduling", "warn", "defrag-room-invalid", str(e), {}, key))
            continue
        if room is None:
            continue
        evidence: dict[str, object] = {
            "node": room.node, "gpus": list(room.gpus), "plan": room.plan, "expires": room.expires,
        }  # fmt: skip
        if room.mig:
            evidence["mig"] = slots_json(room.mig)
        if key == pod.key:
            msg = f"defragmentation is making room: {_describe(key, room)}"
            out.append(Finding("scheduling", "info", "defrag-room-own", msg, evidence, key))
        elif books.pending[key].priority >= pod.priority:
            msg = f"a defragmentation room may keep it off: {_describe(key, room)}"
            out.append(Finding("scheduling", "warn", "defrag-room", msg, evidence, key))
    return out
