"""GPUFit and NodeResourcesFit (Filter): the reasons and codes of a node that does not fit."""

from __future__ import annotations

import pytest

from builders import node, share, whole
from gpusched.core.cluster import ClusterState
from gpusched.core.model import PodSpec
from gpusched.core.policies import make_profile
from gpusched.core.scheduler import schedule_one
from gpusched.core.status import Code


@pytest.mark.parametrize(
    ("pod", "reason", "code"),
    [
        (whole("too-many", 4), "Insufficient GPU count", Code.UNSCHEDULABLE_AND_UNRESOLVABLE),
        (
            share("big-mem", 100, gpu_memory_mib=32_768),
            "Insufficient GPU memory",
            Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
        ),
        (whole("busy", 1), "Insufficient GPU", Code.UNSCHEDULABLE),
        (share("busy-share", 800), "Insufficient GPU share", Code.UNSCHEDULABLE),
        (share("mem-now", 100, gpu_memory_mib=12_000), "Insufficient GPU memory", Code.UNSCHEDULABLE),
        (PodSpec("mem", memory_mib=70_000), "Insufficient memory", Code.UNSCHEDULABLE_AND_UNRESOLVABLE),
    ],
)
def test_gpufit_and_resources_reasons(pod: PodSpec, reason: str, code: Code) -> None:
    snap = ClusterState([node("n", gpus=2)])
    snap.assume(share("half0", 500, gpu_memory_mib=8192), 0, [0])
    snap.assume(share("half1", 500, gpu_memory_mib=8192), 0, [1])
    r = schedule_one(make_profile("bestfit"), pod, snap, diagnose_failures=True)
    assert not r.scheduled
    assert r.status.message() == f"0/1 nodes are available: 1 {reason}."
    assert r.status.code == code
