"""NVIDIA's own gpu-feature-discovery (built from github.com/NVIDIA/k8s-device-plugin by
hack/build-nvidia-device-plugin.sh) run on hack/fakenvml's libnvidia-ml.so.1, and its labels compared with the
agent's on the same fake GPUs, key by key, per node shape and MIG strategy.

GFD also reads each GPU's PCI class (gpu.mode) from /sys/bus/pci/devices/<bus id>/: it runs in a private mount
namespace (``unshare --mount``, root) with a directory written from the fake GPUs bound over that path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpusched.agent import labels
from gpusched.agent.fake import FakeBackend
from gpusched.agent.fakenvml import flat_config
from gpusched.agent.inventory import Inventory
from realparts import unavailable
from test_agent_nvml_lib import SHAPES

ROOT = Path(__file__).resolve().parents[1]


def _built(script: str, env_var: str, needs: str) -> Path:
    if os.environ.get(env_var):
        return Path(os.environ[env_var])
    if not shutil.which(needs):
        unavailable(f"{script} needs {needs}, which is not installed")
    out = subprocess.run([str(ROOT / "hack" / script)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        pytest.fail(f"hack/{script} failed:\n{out.stderr[-3000:]}", pytrace=False)
    return Path(out.stdout.strip().splitlines()[-1])


def nvidia_parts() -> tuple[Path, Path]:
    """(the bin dir of NVIDIA's GFD and device plugin, the fake library's directory); skips (fails under CI)
    without root and unshare, which the private mounts over their fixed paths need."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        unavailable("NVIDIA's components on the fake library need root and unshare (private mounts)")
    bins = _built("build-nvidia-device-plugin.sh", "GPUSCHED_NVIDIA_DEVICE_PLUGIN_BIN", "go")
    lib = _built("build-fake-nvml.sh", "GPUSCHED_FAKE_NVML_LIB", os.environ.get("CC", "gcc"))
    return bins, lib


@pytest.fixture(scope="session")
def gfd() -> tuple[Path, Path]:
    """(GFD's binary, the fake library's directory)."""
    bins, lib = nvidia_parts()
    return bins / "gpu-feature-discovery", lib


def _fake_sysfs(inv: Inventory, root: Path) -> None:
    """What go-nvlib's nvpci reads for each GPU: vendor, class, device, numa_node, resource."""
    for d in inv.devices:
        dom, bus, rest = d.pci_bus_id.split(":")
        p = root / f"{int(dom, 16):04x}:{bus.lower()}:{rest.lower()}"
        p.mkdir(parents=True)
        (p / "vendor").write_text("0x10de\n")
        (p / "class").write_text(f"0x{d.pci_class:04x}00\n")
        (p / "device").write_text("0x0000\n")
        (p / "numa_node").write_text(f"{-1 if d.numa_node is None else d.numa_node}\n")
        (p / "resource").write_text("0x0000000000000000 0x0000000000000000 0x0000000000000000\n")


def run_gfd(gfd: tuple[Path, Path], doc: dict[str, object], strategy: str, tmp: Path) -> dict[str, str]:
    binary, lib = gfd
    spec = tmp / "gpus.yaml"
    spec.write_text(yaml.safe_dump(doc))
    fake = FakeBackend.from_file(spec)
    (tmp / "gpus.flat").write_text(flat_config(fake))
    _fake_sysfs(fake.inventory(), tmp / "sysfs")
    (tmp / "machine").write_text(fake.inventory().machine + "\n")
    out = tmp / f"gfd-{strategy}.txt"
    cmd = (
        f"mount --bind {tmp / 'sysfs'} /sys/bus/pci/devices && exec {binary} --oneshot --no-timestamp "
        f"--mig-strategy {strategy} --machine-type-file {tmp / 'machine'} --device-discovery-strategy nvml "
        f"--output-file {out}"
    )
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib), "GPUSCHED_FAKE_NVML_CONFIG": str(tmp / "gpus.flat")}
    res = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", cmd],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if res.returncode != 0:
        raise AssertionError(f"GFD failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)


CASES = [(shape, s) for shape in sorted(SHAPES) for s in ("none", "mixed")]


@pytest.mark.parametrize(("shape", "strategy"), CASES)
def test_gfd_and_the_agent_write_the_same_labels(
    gfd: tuple[Path, Path], tmp_path: Path, shape: str, strategy: str
) -> None:
    doc = SHAPES[shape]
    theirs = run_gfd(gfd, doc, strategy, tmp_path)
    inv = FakeBackend.from_file(tmp_path / "gpus.yaml").inventory()
    ours = labels.gfd_labels(inv, strategy)
    candidates = labels.label_candidates(inv)
    if len(candidates) > 1:
        # Several models in the group GFD labels last: it writes whichever model its Go map iteration reaches
        # last (it differs from run to run), so its per-model labels must be one of them, and the rest match.
        product = theirs["nvidia.com/gpu.product"]
        model = next(d for d in candidates if labels.sanitise(d.name) == product)
        count = sum(d.name == model.name for d in inv.devices)
        ours = {**ours, **labels.per_model_labels(model, count)}
    only_gfd = {k: theirs[k] for k in sorted(set(theirs) - set(ours))}
    only_agent = {k: ours[k] for k in sorted(set(ours) - set(theirs))}
    differ = {k: (theirs[k], ours[k]) for k in sorted(set(theirs) & set(ours)) if theirs[k] != ours[k]}
    assert (only_gfd, only_agent, differ) == ({}, {}, {})
    assert len(theirs) >= 20  # GFD labelled the node (not an empty pass)
