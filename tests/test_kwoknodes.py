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


def test_testenv_nodes_carry_the_agents_labels_for_their_gpus() -> None:
    """``gpusched up``/``testenv up``'s kwok nodes: the labels the agent writes for fake GPUs of the model,
    the product as NVIDIA's (NVIDIA-A100-SXM4-80GB, not A100-SXM4-80GB); the default is the agent's."""
    from gpusched.agent.fake import fake_node_labels
    from gpusched.testenv.session import GPU_MEMORY_MIB, GPU_PRODUCT, gpu_node_manifest

    labels = fake_node_labels("NVIDIA A100-SXM4-80GB", 4)
    assert (GPU_PRODUCT, str(GPU_MEMORY_MIB)) == (
        labels["nvidia.com/gpu.product"],
        labels["nvidia.com/gpu.memory"],
    )
    node = gpu_node_manifest("n", 4, labels)
    assert labels.items() <= node["metadata"]["labels"].items()
    assert (
        gpu_node_manifest("n", 4)["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    )
    t4 = gpu_node_manifest("t", 2, fake_node_labels("Tesla T4", 2))
    assert t4["metadata"]["labels"]["nvidia.com/gpu.product"] == "Tesla-T4"
    assert t4["status"]["allocatable"]["gpusched.io/gpu-memory"] == str(2 * 15360)
