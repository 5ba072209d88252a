"""The kwok GPU nodes of the e2e tests advertise what a real node with gpusched's agent advertises."""

from gpusched.agent.plugin import DEFAULT_SLOTS
from gpusched.k8s.convert import RES_GPU, RES_SHARE
from gpusched.testenv.kwoknodes import SHARE_SLOTS_PER_GPU, kwok_gpu_node


def test_share_slots_match_the_agents_default() -> None:
    # With the webhook installed every share container asks for one slot: a kwok node without them (or
    # with another count than the agent's) would schedule share pods differently from a real node.
    assert SHARE_SLOTS_PER_GPU == DEFAULT_SLOTS
    node = kwok_gpu_node("n", 4, model="A100-SXM4-80GB", gpu_memory_mib=81920)
    for field in ("capacity", "allocatable"):
        assert node["status"][field][RES_SHARE] == str(4 * DEFAULT_SLOTS)
        assert node["status"][field][RES_GPU] == "4"
