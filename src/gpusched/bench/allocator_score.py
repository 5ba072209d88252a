"""``gpusched bench dra-score``: kube-scheduler's first-fit DRA allocation against the scored one (core).

Runs ``sim.dra_quality`` (NVIDIA-shaped nodes of 8 A100 40GB in dynamic-MIG mode, a MIG-heavy and a
mixed stream of claim pods) for each seed and both budgets, and times it: CPU per pod (every node the
pod is tried on) and CPU per allocator call on one node (the cost the search budget bounds). The
control-plane side-by-side benchmark (kube-scheduler against gpusched on kwok nodes) is ``gpusched
bench dra``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from gpusched.core.dra.celexpr import CelCompiler
from gpusched.core.dra.score import FIRST_FIT, SCORED
from gpusched.sim.dra_quality import Outcome, run, stream


@dataclass(frozen=True)
class Row:
    stream: str
    seed: int
    outcome: Outcome
    cpu_ms_per_pod: float
    cpu_ms_per_call: float


def measure(streams: list[str], seeds: list[int], nodes: int, pods: int) -> list[Row]:
    compiler = CelCompiler()
    rows = []
    for kind in streams:
        for seed in seeds:
            claims = stream(kind, pods, seed)
            for budget in (FIRST_FIT, SCORED):
                t0 = time.process_time()
                out = run(claims, nodes, budget, compiler)
                cpu = (time.process_time() - t0) * 1000
                rows.append(Row(kind, seed, out, cpu / out.offered, cpu / out.allocations))
    return rows


def render(rows: list[Row], nodes: int, json_out: bool) -> str:
    if json_out:
        import json

        return json.dumps([asdict(r) for r in rows], indent=1)
    lines = [
        f"{nodes} nodes x 8 A100 40GB (dynamic MIG, NVIDIA's shape), {rows[0].outcome.offered} pods offered",
        f"{'stream':7} {'seed':>4} {'policy':9} {'before refusal':>14} {'at saturation':>13}"
        f" {'1 PCIe root':>11} {'CPU ms/pod':>10} {'ms/call':>8}",
    ]
    for r in rows:
        o = r.outcome
        root = f"{o.one_root}/{o.multi_gpu}" if o.multi_gpu else "-"
        lines.append(
            f"{r.stream:7} {r.seed:>4} {o.policy:9} {o.before_refusal:>14} {o.placed:>13} {root:>11}"
            f" {r.cpu_ms_per_pod:>10.1f} {r.cpu_ms_per_call:>8.2f}"
        )
    for kind in dict.fromkeys(r.stream for r in rows):
        for policy in ("first-fit", "scored"):
            mine = [r for r in rows if r.stream == kind and r.outcome.policy == policy]
            lines.append(
                f"{kind:7} {'sum':>4} {policy:9} {sum(r.outcome.before_refusal for r in mine):>14}"
                f" {sum(r.outcome.placed for r in mine):>13}"
                f" {sum(r.outcome.one_root for r in mine)}/{sum(r.outcome.multi_gpu for r in mine):<5}"
                f" {sum(r.cpu_ms_per_pod for r in mine) / len(mine):>10.1f}"
                f" {sum(r.cpu_ms_per_call for r in mine) / len(mine):>8.2f}"
            )
    return "\n".join(lines)
