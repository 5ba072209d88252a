"""The benchmarks' CPU accounting (``bench.proc_cpu``) against this very process and fixed samples."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.bench.k8s_compare import _cpu_per_pod
from gpusched.bench.k8s_watch import BindingRate
from gpusched.bench.proc_cpu import MACHINE, CpuSampler, cpu_seconds, machine_busy_seconds

needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="no /proc on this system")


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


@needs_proc
def test_cpu_seconds_follows_this_process_and_names_no_process_as_none() -> None:
    before = cpu_seconds(os.getpid())
    assert before is not None
    _spin(0.2)
    after = cpu_seconds(os.getpid())
    assert after is not None and after - before >= 0.15
    assert cpu_seconds(2**22 + 12345) is None  # above pid_max's default
    busy = machine_busy_seconds()
    assert busy is not None and busy > 0


@needs_proc
def test_the_sampler_counts_the_window_it_is_asked_for() -> None:
    s = CpuSampler({"me": [os.getpid()], "none": [2**22 + 12345]}, interval_s=0.02).start()
    try:
        t0 = time.monotonic()
        _spin(0.3)
        t1 = time.monotonic()
        time.sleep(0.2)  # idle: not in the window
    finally:
        s.stop()
    used = s.used(t0, t1)
    assert 0.2 <= used["me"] <= 0.45
    assert used["none"] == 0.0
    assert used[MACHINE] >= used["me"] * 0.8
    assert s.used(t1 + 0.05, time.monotonic())["me"] < 0.1


def _fixed(times: list[float], values: list[float]) -> CpuSampler:
    s = CpuSampler({"p": [1]})
    s._times = list(times)
    s._samples = [{"p": v} for v in values]
    return s


@given(
    st.lists(st.floats(0.01, 5.0), min_size=2, max_size=20),
    st.lists(st.floats(0.0, 2.0), min_size=20, max_size=20),
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
)
def test_used_is_monotone_additive_and_within_the_readings(
    gaps: list[float], rises: list[float], a: float, b: float
) -> None:
    times = [sum(gaps[:i]) for i in range(len(gaps))]
    values = [sum(rises[:i]) for i in range(len(gaps))]
    s = _fixed(times, values)
    lo, hi = sorted((a * times[-1], b * times[-1]))
    mid = (lo + hi) / 2
    whole = s.used(lo, hi)["p"]
    assert whole == pytest.approx(s.used(lo, mid)["p"] + s.used(mid, hi)["p"], abs=1e-9)
    assert 0.0 <= whole <= values[-1] - values[0] + 1e-9
    assert s.used(times[0], times[-1])["p"] == pytest.approx(values[-1] - values[0])
    with pytest.raises(ValueError):
        s.used(hi + 1, hi)


def test_cpu_per_pod_counts_the_bindings_after_the_first() -> None:
    s = CpuSampler({"gpusched": [1], "kube-apiserver": [2]})
    s._times = [0.0, 10.0]
    s._samples = [{"gpusched": 0.0, "kube-apiserver": 0.0, MACHINE: 0.0},
                  {"gpusched": 2.0, "kube-apiserver": 4.0, MACHINE: 19.0}]  # fmt: skip
    rate = BindingRate(bound=1001, seconds=10.0, pods_per_s=100.0, first=0.0, last=10.0)
    per_pod, cores = _cpu_per_pod(s, rate)
    assert per_pod == {"gpusched": 2.0, "kube-apiserver": 4.0, "all": 6.0}
    assert cores == 1.9
    assert _cpu_per_pod(s, BindingRate(1, 0.0, 0.0)) == (None, None)
