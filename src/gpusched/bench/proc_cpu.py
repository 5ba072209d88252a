"""Where a benchmark's CPU goes: each named process's CPU time over a window, from ``/proc``.

On a machine whose cores are all busy, a scheduler's throughput is set by the CPU every process
spends per pod (the scheduler, the apiserver serving it, etcd, kwok), not by the scheduler alone:
``CpuSampler`` reads ``utime + stime`` of each process (``/proc/<pid>/stat``, its threads
included, its children not) and the machine's busy time (``/proc/stat``) every ``interval_s``
in a thread, and ``used(t0, t1)`` gives the CPU seconds each used between two ``time.monotonic()``
instants (the first and last binding of a backlog), interpolated between the samples around them.
A process that exits keeps its last reading. Where there is no ``/proc`` nothing is sampled
(``used`` is empty).
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from gpusched.testenv.session import proc_stat

MACHINE = "machine"
"""The key of the whole machine's busy CPU (every core, every process) in ``used``."""
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (None: no such process)."""
    fields = proc_stat(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK  # stat fields 14 and 15: utime, stime


def machine_busy_seconds() -> float | None:
    """CPU seconds the machine's cores have been busy so far (all but idle and iowait)."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    ticks = [int(v) for v in first[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICK


class CpuSampler:
    """Samples the CPU time of ``pids`` (name → pid; processes sharing a name add up) and of the
    machine every ``interval_s`` until ``stop``."""

    def __init__(self, pids: Mapping[str, list[int]], interval_s: float = 0.25) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.pids = {name: list(p) for name, p in pids.items()}
        self.interval_s = interval_s
        self._times: list[float] = []
        self._samples: list[dict[str, float]] = []
        self._last: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        """Read every process once (the thread does this every ``interval_s``)."""
        now = time.monotonic()
        row: dict[str, float] = {}
        for name, pids in self.pids.items():
            total = 0.0
            for pid in pids:
                used = cpu_seconds(pid)
                if used is not None:
                    self._last[pid] = used
                total += self._last.get(pid, 0.0)
            row[name] = total
        busy = machine_busy_seconds()
        if busy is not None:
            row[MACHINE] = busy
        with self._lock:
            self._times.append(now)
            self._samples.append(row)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> CpuSampler:
        self.sample()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    def _at(self, t: float) -> dict[str, float]:
        """Each reading at ``t``, linear between the samples around it (held past either end)."""
        times, rows = self._times, self._samples
        i = bisect.bisect_left(times, t)
        if i == 0:
            return dict(rows[0])
        if i == len(times):
            return dict(rows[-1])
        t0, t1 = times[i - 1], times[i]
        w = (t - t0) / (t1 - t0) if t1 > t0 else 1.0
        a, b = rows[i - 1], rows[i]
        return {k: a.get(k, 0.0) + w * (b.get(k, 0.0) - a.get(k, 0.0)) for k in b}

    def used(self, t0: float, t1: float) -> dict[str, float]:
        """CPU seconds each process (and ``MACHINE``) used between monotonic ``t0`` and ``t1``."""
        if t1 < t0:
            raise ValueError("the window ends before it starts")
        with self._lock:
            if not self._samples:
                return {}
            start, end = self._at(t0), self._at(t1)
        return {k: max(0.0, end[k] - start.get(k, 0.0)) for k in end}
