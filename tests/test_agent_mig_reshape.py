"""Way (a) of MIG reshaping (agent/reshape/apply.py): the agent applies a plan of the core's planner
through its backend, on both backends: the fake one (in memory) and the real NVML one over hack/fakenvml's
fake libnvidia-ml. An injected failure part-way rolls the GPU back to its previous layout, and the result
says so.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.agent.fake import FakeBackend
from gpusched.agent.inventory import Inventory, MigInstance
from gpusched.agent.nvml import NvmlBackend
from gpusched.agent.reshape import fakeops
from gpusched.agent.reshape.apply import (
    MigOpError,
    ReshapeOutcome,
    apply_reshape,
    layout_of,
    mig_gpu,
)
from gpusched.core.errors import InvalidInput
from gpusched.core.mig.geometry import Instance, MigGpu
from gpusched.core.mig.profiles import MigError
from gpusched.core.mig.reshape import GpuNow, GpuReshape, ReshapeScope, plan_reshape
from test_agent_nvml_lib import FakeFiles, fake_nvml_lib, nvml_env  # noqa: F401 (fixtures)

NODE = "node-r"
BALANCED = [
    {"profile": "2g.20gb", "start": 0},
    {"profile": "1g.10gb", "start": 2},
    {"profile": "1g.10gb", "start": 3},
    {"profile": "3g.40gb", "start": 4},
]
DOC: dict[str, Any] = {
    "hostname": NODE,
    "gpus": [
        {"model": "NVIDIA A100-SXM4-80GB", "migMode": True, "mig": BALANCED},
        {"model": "NVIDIA A100-SXM4-80GB"},  # MIG off
        {"model": "NVIDIA A30", "migMode": True, "mig": [{"profile": "2g.12gb", "start": 2}]},
    ],
}
IN_USE = Instance("3g.40gb", 4)  # a pod runs on GPU 0's 3g


class Backends:
    """Starts the named backend over DOC, with an optional injected failure (the same spec for both)."""

    def __init__(self, kind: str, files: FakeFiles, mp: pytest.MonkeyPatch) -> None:
        self.kind, self.files, self.mp = kind, files, mp
        self.opened: list[NvmlBackend] = []

    def start(self, fail: str | None = None) -> FakeBackend | NvmlBackend | fakeops.Failing:
        fake = self.files.use(DOC)
        if self.kind == "fake":
            spec = fakeops.FailSpec.parse(fail)
            return fake if spec is None else fakeops.Failing(fake, spec)
        if fail:
            self.mp.setenv(fakeops.FAIL_ENV, fail)
        real = NvmlBackend(NODE)  # the first nvmlInit reads the file and the failure spec
        self.opened.append(real)
        return real


@pytest.fixture(params=["fake", "nvml"])
def backends(
    request: pytest.FixtureRequest,
    nvml_env: FakeFiles,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Backends]:
    monkeypatch.delenv(fakeops.FAIL_ENV, raising=False)
    b = Backends(request.param, nvml_env, monkeypatch)
    yield b
    for real in b.opened:
        real.close()


def plan_for(inv: Inventory, index: int, pending: list[str], in_use: set[Instance]) -> GpuReshape:
    dev = inv.by_index(index)
    assert dev is not None
    g = mig_gpu(NODE, dev)
    assert g is not None
    plan = plan_reshape([GpuNow(g, frozenset(in_use))], pending, scope=ReshapeScope.FREE_SLICES)
    (step,) = plan.steps
    return step


def uuid_at(inv: Inventory, index: int, inst: Instance) -> str:
    dev = inv.by_index(index)
    assert dev is not None
    (m,) = [m for m in dev.mig_instances if (m.profile, m.placement_start) == (inst.profile, inst.start)]
    return m.uuid


def test_a_plan_is_applied_and_the_instance_in_use_is_untouched(backends: Backends) -> None:
    be = backends.start()
    inv = be.inventory()
    kept_uuid = uuid_at(inv, 0, IN_USE)
    step = plan_for(inv, 0, ["4g.40gb"], {IN_USE})
    assert set(step.destroy) == {Instance("2g.20gb", 0), Instance("1g.10gb", 2), Instance("1g.10gb", 3)}
    res = apply_reshape(be, step)
    assert res.outcome is ReshapeOutcome.APPLIED and (res.reason, res.event_type) == ("MigReshaped", "Normal")
    after = be.inventory()
    assert set(layout_of(after.devices[0])) == {Instance("4g.40gb", 0), IN_USE} == set(res.after)
    assert uuid_at(after, 0, IN_USE) == kept_uuid  # the pod's MIG device is the same one
    assert uuid_at(after, 0, Instance("4g.40gb", 0)).startswith("MIG-")
    assert after.devices[1:] == inv.devices[1:]  # the other GPUs are untouched


def test_mig_mode_is_switched_on_for_a_gpu_that_has_it_off(backends: Backends) -> None:
    be = backends.start()
    step = plan_for(be.inventory(), 1, ["7g.80gb"], set())
    assert step.enable_mig and step.create == (Instance("7g.80gb", 0),)
    res = apply_reshape(be, step)
    assert res.ok, res.message
    dev = be.inventory().devices[1]
    assert dev.mig_enabled and layout_of(dev) == (Instance("7g.80gb", 0),)
    assert dev.mig_instances[0].memory_mib == 81920 and dev.mig_instances[0].slices_gi == 7


@pytest.mark.parametrize("index", [1, 2])  # an A100 80GB (after switching MIG on), an A30
def test_every_profile_of_the_model_is_created_and_destroyed(backends: Backends, index: int) -> None:
    be = backends.start()
    if index == 1:
        be.set_mig_mode(1, True)
    else:
        be.destroy_mig_instance(2, be.inventory().devices[2].mig_instances[0].uuid)
    dev = be.inventory().devices[index]
    g = mig_gpu(NODE, dev)
    assert g is not None and dev.mig_enabled and dev.mig_instances == ()
    for profile, kind in g.geometry.kinds.items():
        start = kind.starts[-1]
        made = be.create_mig_instance(index, profile, start)
        (m,) = be.inventory().devices[index].mig_instances
        assert m == made and (m.profile, m.placement_start, m.placement_size) == (
            profile,
            start,
            kind.mem_slices,
        )
        assert m.slices_gi == m.slices_ci == kind.sm_slices and m.uuid.startswith("MIG-")
        assert be.destroy_mig_instance(index, m.uuid) == m
        assert be.inventory().devices[index].mig_instances == ()


@pytest.mark.parametrize(
    "fail",
    [
        "nvmlDeviceCreateGpuInstanceWithPlacement:1",  # after the three destroys
        "nvmlGpuInstanceDestroy:2",  # after the first destroy
    ],
)
def test_a_failure_part_way_rolls_back_to_the_previous_layout(backends: Backends, fail: str) -> None:
    rolled_back(backends, fail)


@pytest.mark.parametrize("backends", ["nvml"], indirect=True)  # the fake makes a GI and its CI in one call
def test_a_compute_instance_that_fails_takes_its_gpu_instance_with_it(backends: Backends) -> None:
    rolled_back(backends, "nvmlGpuInstanceCreateComputeInstance:1:23")


def rolled_back(backends: Backends, fail: str) -> None:
    be = backends.start(fail)
    inv = be.inventory()
    kept_uuid = uuid_at(inv, 0, IN_USE)
    step = plan_for(inv, 0, ["4g.40gb"], {IN_USE})
    res = apply_reshape(be, step)
    assert res.outcome is ReshapeOutcome.ROLLED_BACK, res.message
    assert res.reason == "MigReshapeRolledBack" and res.event_type == "Warning"
    assert "injected failure" in res.error or "NVML" in res.error
    after = be.inventory()
    assert set(layout_of(after.devices[0])) == set(layout_of(inv.devices[0])) == set(res.after)
    assert uuid_at(after, 0, IN_USE) == kept_uuid
    assert any(d.startswith("undo:") for d in res.done)
    assert "rolled back to" in res.message and "2g.20gb at 0" in res.message


def test_a_gpu_that_changed_since_planning_is_left_alone(backends: Backends) -> None:
    be = backends.start()
    step = plan_for(be.inventory(), 2, ["4g.24gb"], set())  # A30: the 2g at 2 goes, a 4g comes
    be.create_mig_instance(2, "2g.12gb", 0)  # someone else cut the free half meanwhile
    before = be.inventory()
    res = apply_reshape(be, step)
    assert res.outcome is ReshapeOutcome.STALE and res.reason == "MigReshapeStale" and res.done == ()
    assert "the plan was made for [2g.12gb at 2]" in res.message
    assert be.inventory() == before


def test_an_instance_a_live_pod_holds_is_never_destroyed_whatever_the_plan(backends: Backends) -> None:
    be = backends.start()
    before = be.inventory()
    step = plan_for(before, 0, ["7g.80gb"], set())  # a plan that did not know the 3g is held
    assert IN_USE in step.destroy
    res = apply_reshape(be, step, held={uuid_at(before, 0, IN_USE)})
    assert res.outcome is ReshapeOutcome.STALE and res.done == ()
    assert f"MIG 3g.40gb at slice 4 ({uuid_at(before, 0, IN_USE)}) is held by a live pod" in res.message
    assert be.inventory() == before


def test_a_failing_undo_is_reported_not_hidden() -> None:
    fake = FakeBackend.from_dict(DOC, "doc")

    class Flaky:
        """Every create fails: the reshape's, and the undo's re-creation of what it destroyed."""

        def inventory(self) -> Inventory:
            return fake.inventory()

        def set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
            fake.set_mig_mode(gpu_index, enabled)

        def create_mig_instance(self, gpu_index: int, profile: str, start: int) -> MigInstance:
            raise MigOpError(f"GPU {gpu_index}: create {profile}: broken")

        def destroy_mig_instance(self, gpu_index: int, uuid: str) -> MigInstance:
            return fake.destroy_mig_instance(gpu_index, uuid)

    step = plan_for(fake.inventory(), 0, ["4g.40gb"], {IN_USE})
    res = apply_reshape(Flaky(), step)
    assert res.outcome is ReshapeOutcome.ROLLBACK_FAILED and res.reason == "MigReshapeFailed"
    assert "undoing failed" in res.error and "left at [3g.40gb at 4]" in res.message


def test_a_backend_that_says_yes_but_holds_another_layout_is_caught() -> None:
    fake = FakeBackend.from_dict(DOC, "doc")

    class Lying:
        """Creates report success and do nothing."""

        def inventory(self) -> Inventory:
            return fake.inventory()

        def set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
            fake.set_mig_mode(gpu_index, enabled)

        def create_mig_instance(self, gpu_index: int, profile: str, start: int) -> MigInstance:
            return MigInstance(profile, start, 0, "MIG-nothing")

        def destroy_mig_instance(self, gpu_index: int, uuid: str) -> MigInstance:
            return fake.destroy_mig_instance(gpu_index, uuid)

    step = plan_for(fake.inventory(), 0, ["4g.40gb"], {IN_USE})
    res = apply_reshape(Lying(), step)
    assert res.outcome is ReshapeOutcome.ROLLBACK_FAILED
    assert "after the reshape, not the target" in res.error


def test_the_fake_refuses_what_nvml_refuses_and_fails_as_the_spec_says() -> None:
    fake = FakeBackend.from_dict(DOC, "doc")
    spec = fakeops.FailSpec.parse("nvmlDeviceSetMigMode:2:19")
    assert spec == fakeops.FailSpec("nvmlDeviceSetMigMode", 2, 19)
    failing = fakeops.Failing(fake, spec)
    with pytest.raises(MigError, match="overlaps"):
        fake.create_mig_instance(0, "1g.10gb", 2)
    with pytest.raises(MigError, match="has no MIG device MIG-gone"):
        fake.destroy_mig_instance(0, "MIG-gone")
    with pytest.raises(MigError, match="not a GPU in MIG mode"):
        fake.create_mig_instance(1, "7g.80gb", 0)
    failing.set_mig_mode(1, True)
    with pytest.raises(MigOpError, match="injected failure"):
        failing.set_mig_mode(1, False)
    failing.set_mig_mode(1, False)  # only the 2nd call fails
    with pytest.raises(MigOpError, match="MIG instances are left"):
        fake.set_mig_mode(0, False)
    with pytest.raises(MigOpError, match="not a MIG-capable GPU"):
        fake.set_mig_mode(3, True)
    with pytest.raises(InvalidInput, match="GPUSCHED_FAKE_NVML_FAIL"):
        fakeops.FailSpec.parse("nvmlGpuInstanceDestroy:x")


def test_the_fake_library_fails_the_named_call_once_and_changes_nothing(
    nvml_env: FakeFiles,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ctypes

    import pynvml as n

    nvml_env.use(DOC)
    monkeypatch.setenv(fakeops.FAIL_ENV, "nvmlDeviceCreateGpuInstanceWithPlacement:1:23")
    n.nvmlInit()
    try:
        h = n.nvmlDeviceGetHandleByIndex(2)  # the A30: slices 0-1 free
        one = n.nvmlDeviceGetGpuInstanceProfileInfo(h, n.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
        where = n.c_nvmlGpuInstancePlacement_t(0, 1)
        before = n.nvmlDeviceGetGpuInstanceRemainingCapacity(h, one.id)
        with pytest.raises(n.NVMLError_InsufficientResources):
            n.nvmlDeviceCreateGpuInstanceWithPlacement(h, one.id, ctypes.byref(where))
        assert n.nvmlDeviceGetGpuInstanceRemainingCapacity(h, one.id) == before
        n.nvmlDeviceCreateGpuInstanceWithPlacement(h, one.id, ctypes.byref(where))  # the 2nd call works
        assert n.nvmlDeviceGetGpuInstanceRemainingCapacity(h, one.id) == before - 1
    finally:
        n.nvmlShutdown()


# ------------------------------------------------------------------------------- gpusched agent mig-reshape
def run_cli(args: list[str], env: dict[str, str] | None = None) -> tuple[int, Any]:
    import json

    from typer.testing import CliRunner

    from gpusched.cli import app

    r = CliRunner().invoke(app, ["agent", "mig-reshape", *args], env=env)
    try:
        return r.exit_code, json.loads(r.output)
    except ValueError:
        return r.exit_code, r.output


@pytest.mark.parametrize("backend", ["fake", "nvml"])
def test_the_command_plans_applies_and_says_how_it_went(
    backend: str,
    nvml_env: FakeFiles,  # noqa: F811
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import yaml

    f = tmp_path / "fake.yaml"
    f.write_text(yaml.safe_dump(DOC))
    monkeypatch.delenv("GPUSCHED_FAKE_GPUS", raising=False)
    monkeypatch.delenv(fakeops.FAIL_ENV, raising=False)
    nvml_env.use(DOC)
    fake = ["--fake", str(f)] if backend == "fake" else []  # else NVML over the fake libnvidia-ml
    rc, out = run_cli(["4g.40gb", *fake, "--in-use", "0:3g.40gb@4"])
    assert rc == 0 and out["way"] == "nvml" and out["results"] == []
    assert out["plan"]["steps"][0]["create"] == [{"profile": "4g.40gb", "start": 0}]
    rc, out = run_cli(["4g.40gb", *fake, "--in-use", "0:3g.40gb@4", "--apply"])
    assert rc == 0 and [r["outcome"] for r in out["results"]] == ["applied"]
    if backend == "fake":
        return  # the injected failure is the fake libnvidia-ml's
    fail = {fakeops.FAIL_ENV: "nvmlDeviceCreateGpuInstanceWithPlacement:1"}
    rc, out = run_cli(["4g.40gb", "--in-use", "0:3g.40gb@4", "--apply"], env=fail)
    assert rc == 1 and [r["outcome"] for r in out["results"]] == ["rolled-back"]
    assert (
        "failed (GPU 0: " in out["results"][0]["message"] and "rolled back to" in out["results"][0]["message"]
    )


def test_the_command_names_bad_input(tmp_path: Any) -> None:
    import yaml

    f = tmp_path / "fake.yaml"
    f.write_text(yaml.safe_dump(DOC))
    rc, out = run_cli(["4g.40gb", "--fake", str(f), "--in-use", "0:3g.40gb"])
    assert rc == 2 and "expected GPU INDEX:PROFILE@START" in out
    rc, out = run_cli(["4g.40gb", "--fake", str(f), "--in-use", "0:4g.40gb@0"])
    assert rc == 2 and "instances in use that it does not hold: 4g.40gb at 0" in out
    rc, out = run_cli(["3g.41gb", "--fake", str(f)])
    assert rc == 2 and "unknown MIG profile '3g.41gb'" in out
    rc, out = run_cli(["4g.40gb", "--fake", str(f), "--way", "off"])
    assert rc == 2 and "MIG reshaping is off" in out
    rc, out = run_cli(["4g.40gb", "--fake", str(f), "--way", "mig-manager", "--apply"])
    assert rc == 2 and "needs the Kubernetes API" in out


# ------------------------------------------------------------------------------------------------ property
@st.composite
def reshapes(draw: st.DrawFn) -> tuple[dict[str, Any], set[Instance], str, str | None]:
    """A fake A100 with a random legal layout, random instances in use, a pending profile, a failure spec."""
    g = mig_gpu(
        NODE, FakeBackend.from_dict({"hostname": NODE, "gpus": [DOC["gpus"][1]]}, "d").inventory().devices[0]
    )
    assert g is not None
    g = MigGpu(g.name, g.geometry, True)
    names = sorted(g.geometry.kinds)
    for p, s in draw(st.lists(st.tuples(st.sampled_from(names), st.integers(0, 7)), max_size=8)):
        if s in g.free_starts(p):
            g = g.place(p, s)
    used = {i for i in g.instances if draw(st.booleans())}
    doc = {
        "hostname": NODE,
        "gpus": [
            {
                **DOC["gpus"][1],
                "migMode": True,
                "mig": [{"profile": i.profile, "start": i.start} for i in g.instances],
            }
        ],
    }
    call = draw(st.sampled_from([None, fakeops.CREATE, fakeops.DESTROY]))
    fail = None if call is None else f"{call}:{draw(st.integers(1, 8))}"
    return doc, used, draw(st.sampled_from(names)), fail


@settings(max_examples=200, deadline=None)
@given(reshapes())
def test_a_reshape_ends_at_its_target_or_where_it_began_and_never_touches_what_is_in_use(
    case: tuple[dict[str, Any], set[Instance], str, str | None],
) -> None:
    doc, used, profile, fail = case
    fake = FakeBackend.from_dict(doc, "doc")
    before = fake.inventory().devices[0]
    g = mig_gpu(NODE, before)
    assert g is not None
    plan = plan_reshape([GpuNow(g, frozenset(used))], [profile], scope=ReshapeScope.FREE_SLICES)
    spec = fakeops.FailSpec.parse(fail)
    ops = fake if spec is None else fakeops.Failing(fake, spec)
    held = {(m.profile, m.placement_start): m.uuid for m in before.mig_instances}
    for step in plan.steps:
        res = apply_reshape(ops, step)
        after = fake.inventory().devices[0]
        assert res.outcome in (ReshapeOutcome.APPLIED, ReshapeOutcome.ROLLED_BACK), res.message
        want = step.target if res.ok else step.before
        assert set(layout_of(after)) == set(want)
        for i in used:  # the pods' MIG devices are the very same ones
            assert {
                m.uuid for m in after.mig_instances if (m.profile, m.placement_start) == (i.profile, i.start)
            } == {held[(i.profile, i.start)]}
