"""``gpusched bench gang-preemption``: a gang as a preemptor in the core, the worst case.

``nodes`` nodes of 8 GPUs, every GPU held by a one-GPU pod of priority 0 (none of them in a gang,
no disruption budgets); a gang of ``size`` pods of 8 whole GPUs each, priority 10, asks for room:
``core.preemption_gang.plan_gang_preemption`` must find the fewest victims (``size`` × 8, whole
nodes) in a copy of the books. Timed ``repeats`` times on the same books (the plan leaves them
untouched), wall clock and process CPU.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from gpusched.core.cluster import ClusterState
from gpusched.core.errors import InvalidInput
from gpusched.core.gang import GangSpec, group_units
from gpusched.core.model import GPU_MILLI, NodeSpec, PodSpec
from gpusched.core.policies import PolicyContext, make_profile
from gpusched.core.preemption_gang import plan_gang_preemption
from gpusched.core.workload import typical_workload

GPUS = 8


@dataclass(frozen=True)
class GangPreemptionReport:
    nodes: int
    size: int
    victims: int
    minimum_victims: int
    placed: int
    wall_median_s: float
    cpu_median_s: float
    repeats: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pod(name: str, gpus: int, priority: int, gang: str = "") -> PodSpec:
    return PodSpec(name, cpu_milli=1000, memory_mib=4096, num_gpu=gpus, gpu_milli=GPU_MILLI,
                   priority=priority, gang=gang)  # fmt: skip


def bench_gang_preemption(nodes: int = 5000, size: int = 64, repeats: int = 3) -> GangPreemptionReport:
    if nodes < 1 or size < 1 or repeats < 1 or size > nodes:
        raise InvalidInput("nodes, size and repeats must be positive, and size at most nodes")
    specs = [NodeSpec(f"n{i:05d}", cpu_milli=128_000, memory_mib=1 << 20, gpu_count=GPUS, gpu_model="A100",
                      gpu_memory_mib=81_920) for i in range(nodes)]  # fmt: skip
    snap = ClusterState(specs)
    for n in range(nodes):
        for g in range(GPUS):
            snap.assume(_pod(f"low-{n}-{g}", 1, 0), n, [g])
    members = [_pod(f"g-{i}", GPUS, 10, gang="g") for i in range(size)]
    unit = group_units(members, {"default/g": GangSpec("g", min_member=size)})[0]
    profile = make_profile("default", PolicyContext(workload=typical_workload()))
    wall, cpu = [], []
    plan = None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        plan = plan_gang_preemption(profile, snap, unit)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    assert plan is not None
    return GangPreemptionReport(
        nodes=nodes,
        size=size,
        victims=len(plan.victims),
        minimum_victims=size * GPUS,
        placed=len(plan.placement),
        wall_median_s=round(statistics.median(wall), 3),
        cpu_median_s=round(statistics.median(cpu), 3),
        repeats=repeats,
    )
