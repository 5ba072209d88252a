"""``gpusched agent discover|labels|run|bench|compare-smi|fake-nvml-config``: the node agent's commands
(``gpusched.agent``); also ``python -m gpusched.cli agent ...``, the DaemonSet's entry point.

Imports of the agent are lazy: the CLI starts fast everywhere, machines without a driver too.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpusched.cli.common import reports_errors
from gpusched.core.errors import InvalidInput

if TYPE_CHECKING:
    from gpusched.agent.inventory import GpuBackend

agent_app = typer.Typer(
    no_args_is_help=True, help="The node agent: GPU discovery, labels, device plugin, metrics."
)


def agent_main(argv: Sequence[str] | None = None) -> None:
    """``gpusched agent ...`` (the DaemonSet's ``python -m gpusched.cli agent run ...``) loading
    this module alone: not the simulator, the schedulers or the other commands."""
    agent_app(args=list(argv) if argv is not None else None, prog_name="gpusched agent")


FakeOpt = Annotated[
    Path | None,
    typer.Option(
        "--fake", help="Fake GPUs from this YAML/JSON file (default: $GPUSCHED_FAKE_GPUS, else NVML)."
    ),
]


def backend_from(fake: Path | None) -> GpuBackend:
    """The fake backend when a file is given or $GPUSCHED_FAKE_GPUS is set, else real NVML
    (``FakeConfigError``, ``NvmlUnavailable``: an ``error:`` line under ``reports_errors``)."""
    from gpusched.agent.fake import ENV_VAR, FakeBackend
    from gpusched.agent.nvml import NvmlBackend

    if fake is not None:
        return FakeBackend.from_file(fake)
    if os.environ.get(ENV_VAR):
        return FakeBackend.from_env()
    return NvmlBackend(os.environ.get("NODE_NAME"))


@agent_app.command("discover")
@reports_errors
def discover_cmd(fake: FakeOpt = None, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Print the node's GPU inventory."""
    from gpusched.cli import render

    b = backend_from(fake)
    inv = b.inventory()
    readings = {d.index: b.readings(d.index) for d in inv.devices} if as_json else {}
    render.agent_inventory(inv, readings, as_json)
    b.close()


@agent_app.command("labels")
@reports_errors
def labels_cmd(
    fake: FakeOpt = None,
    mig_strategy: Annotated[
        str | None, typer.Option(help="none, single or mixed (default: mixed if MIG is on).")
    ] = None,
) -> None:
    """Print the node labels (GFD's names and values) and gpusched's topology annotation."""
    from gpusched.agent import labels
    from gpusched.cli import render

    b = backend_from(fake)
    inv = b.inventory()
    try:
        lab = labels.gfd_labels(inv, mig_strategy)
    except ValueError as e:  # an unknown or unsupported --mig-strategy
        raise InvalidInput(str(e)) from None
    render.agent_labels(lab, {labels.ANN_TOPOLOGY: labels.topology_annotation(inv)})
    b.close()


@agent_app.command("run")
@reports_errors
def run_cmd(
    fake: FakeOpt = None,
    node: Annotated[str | None, typer.Option(help="This node's name (default: $NODE_NAME).")] = None,
    kubeconfig: Annotated[str | None, typer.Option(help="Default: $KUBECONFIG, else in-cluster.")] = None,
    plugin_dir: Annotated[Path, typer.Option(help="The kubelet's device-plugin directory.")] = Path(
        "/var/lib/kubelet/device-plugins"
    ),
    kubelet_socket: Annotated[Path | None, typer.Option(help="Default: <plugin-dir>/kubelet.sock.")] = None,
    slots: Annotated[int, typer.Option(help="gpusched.io/gpu-share slots per GPU.")] = 16,
    cdi: Annotated[bool, typer.Option(help="Also return CDI device names nvidia.com/gpu=<UUID>.")] = False,
    nvidia_resources: Annotated[
        bool,
        typer.Option(
            help="Serve nvidia.com/gpu and nvidia.com/mig-* (off beside NVIDIA's device plugin: then only "
            "gpusched.io/gpu-share)."
        ),
    ] = True,
    pod_resources_socket: Annotated[
        Path,
        typer.Option(
            help="The kubelet's PodResources socket: without --nvidia-resources, where the agent reads which "
            "GPUs NVIDIA's plugin gave each container (recorded as gpusched.io/allocated)."
        ),
    ] = Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
    mig_strategy: Annotated[
        str | None,
        typer.Option(
            help="none, single (each MIG device is one nvidia.com/gpu) or mixed (default: mixed if MIG on)."
        ),
    ] = None,
    gfd_labels: Annotated[bool, typer.Option(help="Write GFD's labels (same values as GFD).")] = True,
    metrics_port: Annotated[int, typer.Option(help="Prometheus port (dcgm-exporter's is 9400).")] = 9400,
    log_level: Annotated[str, typer.Option(help="debug, info, warning.")] = "info",
    no_api: Annotated[
        bool,
        typer.Option(
            "--no-api", help="No Kubernetes API (measurements): no pods, node updates kept in memory."
        ),
    ] = False,
    sharing: Annotated[
        str,
        typer.Option(
            help="What enforces GPU shares: mps (one NVIDIA MPS control daemon per shared GPU), hami-core "
            "(HAMi-core's libvgpu.so, --hami-lib), none (scheduled, not enforced). See docs/gpu-sharing.md."
        ),
    ] = "none",
    mps_root: Annotated[
        Path, typer.Option(help="MPS: each GPU's pipe, log and shm directories (a host path).")
    ] = Path("/run/gpusched/mps"),
    mps_control: Annotated[
        str, typer.Option(help="MPS: the nvidia-cuda-mps-control binary.")
    ] = "nvidia-cuda-mps-control",
    hami_lib: Annotated[
        Path, typer.Option(help="hami-core: HAMi-core's libvgpu.so on the node (mounted at the same path).")
    ] = Path("/usr/local/vgpu/libvgpu.so"),
    toolkit_config: Annotated[
        Path, typer.Option(help="The NVIDIA container toolkit's config.toml (GPU visibility check).")
    ] = Path("/etc/nvidia-container-runtime/config.toml"),
    dra: Annotated[
        bool,
        typer.Option(
            "--dra",
            help="Serve the GPUs as a DRA driver (ResourceSlices, the kubelet's DRA service, CDI specs) "
            "instead of the device plugin; refused beside a device plugin serving them (docs/dra.md).",
        ),
    ] = False,
    dra_driver: Annotated[
        str, typer.Option(help="--dra: the driver's name (NVIDIA's, so its DeviceClasses select the GPUs).")
    ] = "gpu.nvidia.com",
    cdi_dir: Annotated[Path, typer.Option(help="--dra: where the claims' CDI specs are written.")] = Path(
        "/var/run/cdi"
    ),
    dra_registry_dir: Annotated[
        Path, typer.Option(help="--dra: the kubelet's plugin-registration directory.")
    ] = Path("/var/lib/kubelet/plugins_registry"),
    dra_plugins_dir: Annotated[
        Path, typer.Option(help="--dra: where the DRA socket is served (<dir>/<driver>/dra.sock).")
    ] = Path("/var/lib/kubelet/plugins"),
    dra_dev_root: Annotated[
        Path,
        typer.Option(help="--dra: the GPUs' device nodes (nvidia<index>, nvidiactl) listed in CDI specs."),
    ] = Path("/dev"),
    dra_shares: Annotated[
        bool,
        typer.Option(
            "--dra-shares",
            help="--dra: whole GPUs as shared devices, consumable capacity milli and memory (GPU shares).",
        ),
    ] = False,
    dra_unhealthy_effect: Annotated[
        str,
        typer.Option(
            help="--dra: the device taint's effect on an unhealthy GPU: NoSchedule, NoExecute, None."
        ),
    ] = "NoSchedule",
    mig_reshape_way: Annotated[
        str,
        typer.Option(help="How MIG re-cuts are applied: nvml, mig-manager, off (the Node's label wins)."),
    ] = "nvml",
    mig_manager_namespace: Annotated[str, typer.Option(help="mig-manager's ConfigMap namespace.")] = (
        "gpu-operator"
    ),
    mig_manager_configmap: Annotated[str, typer.Option(help="mig-manager's ConfigMap.")] = (
        "gpusched-mig-parted-config"
    ),
    mig_manager_timeout_s: Annotated[float, typer.Option(help="How long to wait for mig-manager.")] = 600.0,
    dra_mig: Annotated[
        str,
        typer.Option(
            help="--dra: MIG GPUs as their configured MIG devices (static) or every placement, the instance "
            "created at Prepare (dynamic)."
        ),
    ] = "static",
    held_gpu_taints: Annotated[
        bool,
        typer.Option(
            help="Device-plugin mode: a DeviceTaintRule for every GPU a pod here holds, so that another DRA "
            "driver publishing the same GPUs gets no claim on it from kube-scheduler (docs/dra.md)."
        ),
    ] = True,
) -> None:
    """Run the device plugin (or, with --dra, the DRA driver), the node labeller, GPU health on the Node
    and the metrics exporter."""
    from gpusched.agent.pods import KubePods, MemoryPods
    from gpusched.agent.reshape.manager import ManagerSettings
    from gpusched.agent.reshape.way import ReshapeWay
    from gpusched.agent.run import Agent, AgentConfig

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    name = node or os.environ.get("NODE_NAME")
    if not name:
        raise InvalidInput("--node or $NODE_NAME is required")
    kube = MemoryPods() if no_api else KubePods(kubeconfig)
    dra_config = dra_api = None
    if dra:
        from gpusched.agent.dra.node import DraConfig
        from gpusched.agent.dra.publish import KubeSlices, MemorySlices
        from gpusched.agent.dra.slices import check_driver_name, check_effect, check_mig_mode

        dra_config = DraConfig(
            driver=check_driver_name(dra_driver),
            cdi_dir=cdi_dir,
            dev_root=dra_dev_root,
            registry_dir=dra_registry_dir,
            plugins_dir=dra_plugins_dir,
            unhealthy_effect=check_effect(dra_unhealthy_effect),
            shares=dra_shares,
            mig=check_mig_mode(dra_mig),
        )
        dra_api = MemorySlices() if no_api else KubeSlices(kubeconfig)
    cfg = AgentConfig(
        node=name,
        plugin_dir=plugin_dir,
        kubelet_socket=kubelet_socket,
        slots=slots,
        nvidia_resources=nvidia_resources,
        pod_resources_socket=pod_resources_socket,
        cdi=cdi,
        mig_strategy=mig_strategy,
        write_gfd_labels=gfd_labels,
        metrics_port=metrics_port,
        sharing=sharing,
        mps_root=mps_root,
        mps_control=mps_control,
        hami_lib=hami_lib,
        toolkit_config=toolkit_config,
        dra=dra_config,
        reshape_way=ReshapeWay.parse(mig_reshape_way, "--mig-reshape-way"),
        mig_manager=ManagerSettings(
            namespace=mig_manager_namespace, configmap=mig_manager_configmap, timeout_s=mig_manager_timeout_s
        ),
    )
    configmaps = None
    if not no_api:
        from gpusched.agent.reshape.manager import KubeConfigMaps
        from gpusched.k8s.client import api_client

        configmaps = KubeConfigMaps(api_client(kubeconfig))
    taint_api = None
    if held_gpu_taints and not dra and not no_api:
        from gpusched.agent.dra.heldtaints import KubeTaintRules

        taint_api = KubeTaintRules(kubeconfig)
    agent = Agent(cfg, backend_from(fake), kube, kube, dra_api, configmaps=configmaps, taint_api=taint_api)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    agent.start()
    done.wait()
    agent.stop()


@agent_app.command("bench")
@reports_errors
def bench_cmd(
    gpus: Annotated[int, typer.Option(help="Fake GPUs on the node.")] = 8,
    calls: Annotated[int, typer.Option(help="Allocate calls to time.")] = 2000,
    pending: Annotated[int, typer.Option(help="Other Pending pods on the node while matching.")] = 20,
) -> None:
    """Allocate latency (gRPC over a unix socket, fake GPUs and pods) and the agent's idle CPU and RSS."""
    from gpusched.agent.bench import bench_allocate, bench_idle
    from gpusched.cli import render

    render.agent_bench(bench_allocate(gpus, calls, pending))
    render.agent_bench(bench_idle(gpus))


@agent_app.command("fake-nvml-config")
@reports_errors
def fake_nvml_config_cmd(
    fake: Annotated[Path, typer.Argument(help="A fake-GPU file (YAML/JSON, as --fake reads).")],
    out: Annotated[
        Path, typer.Argument(help="Where to write the flat form for hack/fakenvml's libnvidia-ml.")
    ],
) -> None:
    """Write the flat form of a fake-GPU file that hack/fakenvml's libnvidia-ml.so.1 reads
    ($GPUSCHED_FAKE_NVML_CONFIG)."""
    from gpusched.agent.fakenvml import write_flat_config

    write_flat_config(fake, out)


@agent_app.command("compare-smi")
@reports_errors
def compare_cmd(
    discover_json: Annotated[Path, typer.Argument(help="Output of `gpusched agent discover --json`.")],
    smi_xml: Annotated[Path, typer.Argument(help="Output of `nvidia-smi -q -x`.")],
) -> None:
    """Compare the agent's inventory with nvidia-smi's; exit 1 on a difference."""
    from gpusched.agent.smi import compare
    from gpusched.cli import render

    diffs = compare(render.read_json(discover_json), smi_xml.read_text())
    render.agent_smi_differences(diffs)
    raise typer.Exit(1 if diffs else 0)


@agent_app.command("mig-reshape")
@reports_errors
def mig_reshape_cmd(
    profiles: Annotated[list[str], typer.Argument(help="Pending MIG requests, one profile name each.")],
    fake: FakeOpt = None,
    way: Annotated[
        str,
        typer.Option(
            help="nvml or mig-manager (the agent's flag; the node label gpusched.io/mig-reshape-way wins)."
        ),
    ] = "nvml",
    in_use: Annotated[
        list[str] | None, typer.Option("--in-use", help="INDEX:PROFILE@START, an instance a pod holds.")
    ] = None,
    apply: Annotated[bool, typer.Option("--apply", help="Apply the plan (default: print it).")] = False,
    node: Annotated[str | None, typer.Option(help="This node's name (default: $NODE_NAME).")] = None,
    kubeconfig: Annotated[
        str | None, typer.Option(help="Reach the Node (its label; mig-manager's way needs it).")
    ] = None,
    namespace: Annotated[str, typer.Option(help="mig-manager's ConfigMap namespace.")] = "gpu-operator",
    configmap: Annotated[str, typer.Option(help="mig-manager's ConfigMap.")] = "gpusched-mig-parted-config",
    timeout_s: Annotated[float, typer.Option(help="How long to wait for mig-manager.")] = 600.0,
) -> None:
    """Plan (and with --apply, apply) a MIG reshape of this node for pending requests; prints JSON, records
    each result as an event on the Node (with --kubeconfig); exits 1 when a reshape did not succeed."""
    from gpusched.agent.reshape import node as mig_node
    from gpusched.agent.reshape.manager import KubeConfigMaps, ManagerSettings, MigManagerWay
    from gpusched.agent.reshape.way import ReshapeWay, reshape_way
    from gpusched.cli import render

    b = backend_from(fake)
    try:
        inv = b.inventory()
        name = node or os.environ.get("NODE_NAME") or inv.hostname
        chosen = ReshapeWay.parse(way, "--way")
        manager, events = None, None
        if kubeconfig is not None:
            from gpusched.agent.pods import KubePods
            from gpusched.agent.reshape.events import NodeEvents
            from gpusched.k8s.client import api_client

            kube = KubePods(kubeconfig)
            chosen = reshape_way(
                name, (kube.get_node(name).get("metadata") or {}).get("labels") or {}, chosen
            )
            settings = ManagerSettings(namespace=namespace, configmap=configmap, timeout_s=timeout_s)
            api = api_client(kubeconfig)
            manager, events = MigManagerWay(kube, KubeConfigMaps(api), settings), NodeEvents(api)
        used = [mig_node.parse_in_use(t) for t in in_use or []]
        plan = mig_node.plan_node(name, inv, profiles, used, chosen)
        results = mig_node.apply_plan(name, plan, chosen, b, manager) if apply else []  # type: ignore[arg-type]
        for r in results:
            if events is not None:
                events.record(name, r)
        render.agent_mig_reshape(mig_node.report(name, chosen, plan, results))
    finally:
        b.close()
    raise typer.Exit(0 if all(r.ok for r in results) else 1)
