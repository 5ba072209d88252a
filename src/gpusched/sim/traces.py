"""Readers for the Alibaba GPU cluster trace v2023 ("openb") CSV format.

Nodes: ``sn,cpu_milli,memory_mib,gpu,model``.
Pods: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,qos,pod_phase,creation_time,
deletion_time,scheduled_time]``.

Every row is validated; a bad one raises ``TraceError`` naming the file, the line and the
field, and nothing is silently dropped.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpusched.core.errors import InvalidInput
from gpusched.core.model import GPU_MILLI, Controller, InvalidSpec, NodeSpec, PodSpec

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_REQUIRED = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_OPTIONAL = ("gpu_spec", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time")

# GPU memory per model (MiB), for the models whose memory is public; G1-G3 are undisclosed.
GPU_MEMORY_MIB = {"T4": 15360, "P100": 16384, "V100M16": 16384, "V100M32": 32768, "A10": 24576}

SIM_CONTROLLER = Controller("ReplicaSet", "simulated", "apps")
"""The controller of every simulated pod: the simulator recreates a pod that defragmentation moves
(it books it at the plan's destination), as a ReplicaSet would; so simulated pods may move."""


class TraceError(InvalidInput):
    """A trace file that cannot be read as written; the message names file and line."""

    def __init__(self, path: str | Path, line: int, message: str) -> None:
        self.path, self.line = str(path), line
        super().__init__(f"{path}:{line}: {message}")


@dataclass(frozen=True, slots=True)
class TracePod:
    spec: PodSpec
    created: int | None = None
    deleted: int | None = None


def _rows(
    path: Path, required: tuple[str, ...], optional: tuple[str, ...]
) -> Iterator[tuple[int, dict[str, str]]]:
    if not path.is_file():
        raise TraceError(path, 0, "file not found" if not path.exists() else "not a regular file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise TraceError(path, line, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        yield from _records(path, reader, required, optional)
    except csv.Error as e:
        raise TraceError(path, reader.line_num, f"malformed CSV: {e}") from None


def _records(
    path: Path, reader: Any, required: tuple[str, ...], optional: tuple[str, ...]
) -> Iterator[tuple[int, dict[str, str]]]:
    header = next(reader, None)
    if not header:
        raise TraceError(path, 1, "empty file: no header line")
    header = [h.strip() for h in header]
    missing = [c for c in required if c not in header]
    if missing:
        raise TraceError(path, 1, f"missing column(s) {', '.join(missing)}; expected {', '.join(required)}")
    unknown = [c for c in header if c not in required and c not in optional]
    if unknown:
        raise TraceError(path, 1, f"unknown column(s) {', '.join(unknown)}")
    seen = 0
    for row in reader:
        lineno = reader.line_num
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise TraceError(path, lineno, f"{len(row)} fields, header has {len(header)}")
        seen += 1
        yield lineno, dict(zip(header, (c.strip() for c in row), strict=True))
    if seen == 0:
        raise TraceError(path, 1, "no data rows after the header")


_INT = re.compile(r"^[+-]?\d+(\.0*)?$")


def _int(path: Path, line: int, row: dict[str, str], col: str, *, optional: bool = False) -> int | None:
    raw = row.get(col, "")
    if raw == "":
        if optional:
            return None
        raise TraceError(path, line, f"{col} is empty")
    if not _INT.match(raw):
        raise TraceError(path, line, f"{col} is not an integer: {raw!r}")
    v = int(raw.split(".", 1)[0])
    if v < 0:
        raise TraceError(path, line, f"{col} is negative: {v}")
    return v


def read_nodes(path: str | Path, *, gpu_nodes_only: bool = False) -> list[NodeSpec]:
    p = Path(path)
    nodes: list[NodeSpec] = []
    names: set[str] = set()
    for line, row in _rows(p, NODE_COLUMNS, ()):
        name = row["sn"]
        if not name:
            raise TraceError(p, line, "sn (node name) is empty")
        if name in names:
            raise TraceError(p, line, f"duplicate node name {name!r}")
        gpus = _int(p, line, row, "gpu")
        model = row["model"]
        if gpus and not model:
            raise TraceError(p, line, f"node {name} has {gpus} GPUs but no model")
        try:
            node = NodeSpec(
                name=name,
                cpu_milli=_int(p, line, row, "cpu_milli") or 0,
                memory_mib=_int(p, line, row, "memory_mib") or 0,
                gpu_count=gpus or 0,
                gpu_model=model if gpus else "",
                gpu_memory_mib=GPU_MEMORY_MIB.get(model, 0) if gpus else 0,
            )
        except InvalidSpec as e:
            raise TraceError(p, line, str(e)) from None
        names.add(name)
        if gpus or not gpu_nodes_only:
            nodes.append(node)
    return nodes


def read_pods(path: str | Path) -> list[TracePod]:
    p = Path(path)
    pods: list[TracePod] = []
    names: set[str] = set()
    for line, row in _rows(p, POD_REQUIRED, POD_OPTIONAL):
        name = row["name"]
        if not name:
            raise TraceError(p, line, "name is empty")
        if name in names:
            raise TraceError(p, line, f"duplicate pod name {name!r}")
        num = _int(p, line, row, "num_gpu") or 0
        milli = _int(p, line, row, "gpu_milli") or 0
        if milli > GPU_MILLI:
            raise TraceError(p, line, f"gpu_milli {milli} is more than one GPU ({GPU_MILLI})")
        if num > 1 and milli < GPU_MILLI:
            raise TraceError(
                p,
                line,
                f"gpu_milli {milli} < {GPU_MILLI} (a share) with num_gpu {num}: shares need num_gpu 1",
            )
        if (num == 0) != (milli == 0):
            raise TraceError(
                p, line, f"num_gpu {num} and gpu_milli {milli} disagree (both zero or both positive)"
            )
        spec = row.get("gpu_spec", "")
        models = frozenset(m.strip() for m in spec.split("|") if m.strip())
        created = _int(p, line, row, "creation_time", optional=True)
        deleted = _int(p, line, row, "deletion_time", optional=True)
        if created is not None and deleted is not None and deleted < created:
            raise TraceError(p, line, f"deletion_time {deleted} is before creation_time {created}")
        try:
            pod = PodSpec(
                name=name,
                cpu_milli=_int(p, line, row, "cpu_milli") or 0,
                memory_mib=_int(p, line, row, "memory_mib") or 0,
                num_gpu=num,
                gpu_milli=milli,
                gpu_models=models if num else frozenset(),
                controller=SIM_CONTROLLER,
            )
        except InvalidSpec as e:
            raise TraceError(p, line, str(e)) from None
        names.add(name)
        pods.append(TracePod(pod, created, deleted))
    return pods
