"""GPU model names: one normalisation (``canonical_gpu_model``) for pods' gpu-models, nodes' product
labels and queues' per-model quotas, so the forms users write match the labels nodes carry."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from builders import k8s_node, k8s_pod, profile, whole
from gpusched.core.batch import Outcome, run_cycle
from gpusched.core.cluster import ClusterState
from gpusched.core.gang import group_units
from gpusched.core.gpumodel import canonical_gpu_model
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.policies import make_profile
from gpusched.core.queues import InvalidQueue, QueueBook, QueueSpec, QueueTree, Quota
from gpusched.core.scheduler import schedule_one
from gpusched.k8s.convert import node_from_k8s, pod_from_k8s


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("NVIDIA-A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),  # NVML's name, before GFD's sanitising
        ("NVIDIA-H100-80GB-HBM3", "H100-80GB-HBM3"),
        ("Tesla-T4", "T4"),
        ("T4", "T4"),
        ("Tesla T4", "T4"),
        ("nvidia-tesla-V100-SXM2-32GB", "V100-SXM2-32GB"),
        ("NVIDIA-GeForce-RTX-4090", "GeForce-RTX-4090"),
        ("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", "A100-SXM4-80GB-MIG-1g.10gb"),
        ("NVIDIA", "NVIDIA"),
        ("NVIDIA-", "NVIDIA-"),  # a prefix alone is kept
        ("A100-SXM4-40GB", "A100-SXM4-40GB"),  # memory size is part of the model
    ],
)
def test_canonical_forms(name: str, canonical: str) -> None:
    assert canonical_gpu_model(name) == canonical


_NAME = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,30}[A-Za-z0-9])?", fullmatch=True)


@given(_NAME, st.sampled_from(["", "NVIDIA-", "Tesla-", "NVIDIA-Tesla-", "nvidia-"]))
def test_canonical_is_idempotent_and_ignores_the_vendor_prefix(name: str, prefix: str) -> None:
    c = canonical_gpu_model(name)
    assert canonical_gpu_model(c) == c
    assert canonical_gpu_model(prefix + name) == c


def _node(product: str) -> NodeSpec:
    return node_from_k8s(k8s_node("n", 2, model=product, gpu_mem_mib=81920))


@pytest.mark.parametrize(
    ("product", "asked"),
    [
        ("NVIDIA-A100-SXM4-80GB", "A100-SXM4-80GB|H100-80GB-HBM3"),
        ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
        ("A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
        ("Tesla-T4", "T4"),
        ("Tesla-T4", "Tesla-T4"),
        ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB|NVIDIA-H100-80GB-HBM3"),
    ],
)
def test_a_pod_asking_for_a_model_in_any_form_lands_on_the_node_with_it(product: str, asked: str) -> None:
    pod = pod_from_k8s(
        k8s_pod("p", {"nvidia.com/gpu": "1"}, limits=True, annotations={"gpusched.io/gpu-models": asked})
    )
    r = schedule_one(make_profile("bestfit"), pod, ClusterState([_node(product)]))
    assert r.scheduled, r.status.message()


@pytest.mark.parametrize(
    ("product", "asked"), [("NVIDIA-A100-SXM4-40GB", "A100-SXM4-80GB"), ("Tesla-T4", "A10")]
)
def test_another_model_still_does_not_match(product: str, asked: str) -> None:
    pod = PodSpec("p", num_gpu=1, gpu_milli=1000, gpu_models=frozenset({asked}))
    r = schedule_one(make_profile("bestfit"), pod, ClusterState([_node(product)]))
    assert not r.scheduled
    assert "GPU model mismatch" in r.status.message()


def test_specs_hold_the_canonical_form() -> None:
    assert _node("NVIDIA-A100-SXM4-80GB").gpu_model == "A100-SXM4-80GB"
    pod = PodSpec("p", num_gpu=1, gpu_milli=1000, gpu_models=frozenset({"Tesla-T4", "NVIDIA-L4"}))
    assert pod.gpu_models == {"T4", "L4"}


def test_per_model_quota_written_with_the_prefix_limits_pods_on_nodes_labelled_by_gfd() -> None:
    t = QueueTree([QueueSpec("A", nominal=Quota(gpus=8), per_model={"NVIDIA-A100-SXM4-80GB": Quota(gpus=1)})])
    snap = ClusterState([_node("NVIDIA-A100-SXM4-80GB")])
    pods = [whole(f"p{i}", queue="A", gpu_models=frozenset({"A100-SXM4-80GB"})) for i in range(2)]
    out = run_cycle(profile(), snap, group_units(pods, {}), book=QueueBook(t))
    assert [o.outcome for o in out] == [Outcome.PLACED, Outcome.WAITING]
    assert "gpus[A100-SXM4-80GB] would be 2 of 1" in out[1].reason


def test_per_model_quota_naming_one_model_twice_is_refused() -> None:
    with pytest.raises(InvalidQueue, match="perModel names GPU model T4 twice"):
        QueueSpec("A", per_model={"Tesla-T4": Quota(gpus=1), "T4": Quota(gpus=2)})
