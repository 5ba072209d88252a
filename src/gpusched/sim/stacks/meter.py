"""What a stack's run measures over the steady window, in the pods' own terms (their trace
request, whatever the stack books for them):

- **work carried**: GPU milli × seconds of the pods running, each pod counting the GPU it asked
  for (a share of 0.3 GPU counts 0.3 even where the stack books it a whole GPU). Under
  time-slicing the pods of one physical GPU count at most that GPU (1000 milli): co-located pods
  share its time, they do not add GPUs.
- **OOM risk** (time-slicing): NVIDIA's device plugin hands out replicas of a GPU with no memory
  check, spreading a pod's replicas over the GPUs with the fewest replicas given out (its
  ``distributed`` allocation; ties: lowest index). A GPU whose pods' summed memory (a share of
  u milli needs u/1000 of the GPU's memory; a whole GPU, all of it) exceeds the GPU's is over
  committed; every pod with a replica on it is at risk while it is. Counted as pod-seconds at
  risk and as the set of pods ever at risk.
- **backlog**: the work waiting (GPU milli × lifetime of the pending pods), sampled, for the
  stability test; **completions**: pods that ran to their end inside the window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpusched.core.model import GPU_MILLI


@dataclass
class _Slices:
    """Time-slicing books of one node: per physical GPU, the (pod, milli) replicas on it."""

    gpus: list[list[tuple[int, int]]]

    def place(self, pod: int, milli: int, count: int) -> None:
        for _ in range(count):
            g = min(range(len(self.gpus)), key=lambda k: (len(self.gpus[k]), k))
            self.gpus[g].append((pod, milli))

    def remove(self, pod: int) -> None:
        self.gpus = [[r for r in gpu if r[0] != pod] for gpu in self.gpus]

    def work(self) -> int:
        return sum(min(GPU_MILLI, sum(m for _, m in gpu)) for gpu in self.gpus)

    def at_risk(self) -> set[int]:
        return {p for gpu in self.gpus if sum(m for _, m in gpu) > GPU_MILLI for p, _ in gpu}


@dataclass
class StackMeter:
    """The tallies of one run (see the module doc); times in seconds, work in milli-seconds."""

    warmup_s: int
    horizon_s: int
    sample_every_s: int
    physical_gpus: dict[int, int] = field(default_factory=dict)
    """Time-slicing only: node index -> its physical GPUs (empty: no time-slicing)."""
    now: int = 0
    work: int = 0
    risk_pod_s: int = 0
    completed: int = 0
    ever_at_risk: set[int] = field(default_factory=set)
    started: set[int] = field(default_factory=set)
    """Pods that started inside the window (the denominator of the share of pods at risk)."""
    backlog_samples: list[tuple[int, int]] = field(default_factory=list)
    _rate: int = 0
    _backlog: int = 0
    _next_sample: int = 0
    _slices: dict[int, _Slices] = field(default_factory=dict)
    _node_work: dict[int, int] = field(default_factory=dict)
    _node_risk: dict[int, set[int]] = field(default_factory=dict)
    _on: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Running pod -> (node, its work rate where it is not time-sliced)."""

    at_risk: int = 0
    """Pods at risk now."""

    @property
    def share_at_risk(self) -> float:
        """The share of the pods started inside the window that were ever at risk."""
        return len(self.ever_at_risk & self.started) / len(self.started) if self.started else 0.0

    def advance(self, t: int) -> None:
        """Integrate from ``now`` to ``t`` (nothing changes in between), sampling the backlog."""
        while self._next_sample <= t and self._next_sample < self.horizon_s:
            self.backlog_samples.append((self._next_sample, self._backlog))
            self._next_sample += self.sample_every_s
        lo = max(self.now, self.warmup_s)
        hi = min(t, self.horizon_s)
        if hi > lo:
            self.work += self._rate * (hi - lo)
            self.risk_pod_s += self.at_risk * (hi - lo)
        self.now = max(self.now, t)

    def start(self, pod: int, node: int, num_gpu: int, milli: int) -> None:
        """``pod`` starts on ``node``, asking ``num_gpu`` GPUs of ``milli`` each (its trace request)."""
        if self.warmup_s <= self.now < self.horizon_s:
            self.started.add(pod)
        if not self.physical_gpus:
            self._on[pod] = (node, num_gpu * milli)
            self._rate += num_gpu * milli
            return
        self._on[pod] = (node, 0)
        sl = self._slices.setdefault(node, _Slices([[] for _ in range(self.physical_gpus[node])]))
        sl.place(pod, milli, num_gpu)
        self._refresh(node)

    def stop(self, pod: int, completed: bool) -> None:
        node, rate = self._on.pop(pod)
        self._rate -= rate
        if completed and self.warmup_s <= self.now < self.horizon_s:
            self.completed += 1
        if self.physical_gpus:
            self._slices[node].remove(pod)
            self._refresh(node)

    def queued(self, work: int) -> None:
        self._backlog += work

    def _refresh(self, node: int) -> None:
        sl = self._slices[node]
        self._rate += sl.work() - self._node_work.get(node, 0)
        self._node_work[node] = sl.work()
        risk = sl.at_risk()
        self.at_risk += len(risk) - len(self._node_risk.get(node, ()))
        self._node_risk[node] = risk
        if self.now >= self.warmup_s:
            self.ever_at_risk |= risk
