"""``gpusched testenv up|down``: a throw-away real control plane with kwok GPU nodes; ``gpusched up|down``:
the same with gpusched's scheduler and webhook running (``gpusched.testenv.local``)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from gpusched.cli.common import reports_errors

testenv_app = typer.Typer(no_args_is_help=True, help="A throw-away real control plane with kwok GPU nodes.")

BUILD_NOTE = (
    "control-plane binaries: $GPUSCHED_CONTROLPLANE_BIN, else hack/build-control-plane.sh (the first run "
    "builds Kubernetes, etcd, kwok and helm from Go: 12-25 minutes, then cached in "
    "~/.cache/gpusched/controlplane)"
)
GpuModelOpt = Annotated[
    str,
    typer.Option(help="The fake GPUs' NVML name; nodes get the agent's labels for it (docs/fake-gpus.md)."),
]
StateDirOpt = Annotated[Path | None, typer.Option(help="Where the state and logs go.")]


class NodeKind(StrEnum):
    auto = "auto"
    real = "real"
    kwok = "kwok"


@testenv_app.command("up")
@reports_errors
def testenv_up_cmd(
    nodes: Annotated[int, typer.Option(help="kwok GPU nodes to create.")] = 4,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node.")] = 8,
    gpu_model: GpuModelOpt = "NVIDIA A100-SXM4-80GB",
    with_scheduler: Annotated[bool, typer.Option(help="Also run kube-scheduler (default profile).")] = False,
    state_dir: StateDirOpt = None,
) -> None:
    """Start etcd, kube-apiserver and kwok in the background (built by hack/build-control-plane.sh)."""
    from gpusched.agent.fake import fake_node_labels
    from gpusched.testenv import session

    typer.echo(BUILD_NOTE, err=True)
    labels = fake_node_labels(gpu_model, gpus_per_node)
    session.testenv_up(
        state_dir or session.DEFAULT_STATE_DIR, nodes, gpus_per_node, with_scheduler, node_labels=labels
    )


@testenv_app.command("down")
@reports_errors
def testenv_down_cmd(
    state_dir: Annotated[Path | None, typer.Option(help="The state folder given to 'up'.")] = None,
) -> None:
    """Stop the background control plane and remove its state."""
    from gpusched.testenv import session

    session.testenv_down(state_dir or session.DEFAULT_STATE_DIR)


@reports_errors
def up(
    node: Annotated[
        NodeKind,
        typer.Option(
            envvar="GPUSCHED_UP_NODE",
            help="real: one real node (containerd, kubelet, gpusched's agent on fake GPUs; needs root, "
            "containerd, runc, the CNI plugins and hack/build-node-images.sh's images); kwok: kwok nodes (no "
            "container runs); auto: real where it can run, else kwok, saying why.",
        ),
    ] = NodeKind.auto,
    nodes: Annotated[
        int | None, typer.Option(help="kwok GPU nodes to create (default 2; more than 1 means kwok).")
    ] = None,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node.")] = 4,
    gpu_model: GpuModelOpt = "NVIDIA A100-SXM4-80GB",
    state_dir: StateDirOpt = None,
) -> None:
    """A local cluster in one command: the control plane, a real node with gpusched's agent on fake GPUs
    (or kwok GPU nodes labelled as the agent labels them), gpusched's scheduler and webhook. Prints the
    kubeconfig and the next commands; 'gpusched down' removes it all."""
    from gpusched.agent.fake import fake_node_labels
    from gpusched.testenv import local, session

    typer.echo(BUILD_NOTE, err=True)
    labels = fake_node_labels(gpu_model, gpus_per_node)
    local.cluster_up(
        state_dir or session.DEFAULT_STATE_DIR, nodes, gpus_per_node, labels, node=node.value,
        gpu_model=gpu_model,
    )  # fmt: skip


@reports_errors
def down(
    state_dir: Annotated[Path | None, typer.Option(help="The state folder given to 'up'.")] = None,
) -> None:
    """Stop everything 'gpusched up' started and remove its state."""
    from gpusched.testenv import local, session

    local.cluster_down(state_dir or session.DEFAULT_STATE_DIR)
