"""A snapshot turned into the scheduler's books, as the standalone scheduler builds them
(``gpusched.k8s.state.LiveCluster``: bound pods booked where their assignment says), with the
pending pods, the objects by name and what could not be read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpusched.core.cluster import ClusterState
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.framework import Profile
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.policies import PolicyContext, make_profile
from gpusched.doctor.checks import node_findings
from gpusched.doctor.findings import Finding
from gpusched.doctor.queues import QueueBooks
from gpusched.doctor.snapshot import Snapshot
from gpusched.k8s.convert import InvalidRequest, node_from_k8s
from gpusched.k8s.podevents import parse_pod_event
from gpusched.k8s.state import LiveCluster, pod_key


@dataclass
class Books:
    snapshot: Snapshot
    state: ClusterState
    node_objs: dict[str, Mapping[str, Any]]
    pod_objs: dict[str, Mapping[str, Any]]
    pending: dict[str, PodSpec]
    invalid: dict[str, str] = field(default_factory=dict)
    """Objects that cannot be read (``node/NAME`` or ``pod/NS/NAME`` -> why)."""
    conflicts: list[str] = field(default_factory=list)
    """Bound pods whose recorded assignment did not fit the books (overcommit: drift)."""
    policy: str = "default"
    queues: QueueBooks | None = None
    """The tenant queues and their book (None: the snapshot has no Queues; queues are ignored)."""
    _profile: Profile | None = None
    _workload: TargetWorkload | None = None
    _findings: dict[str, list[Finding]] = field(default_factory=dict)

    @classmethod
    def of(cls, snap: Snapshot, policy: str = "default") -> Books:
        invalid: dict[str, str] = {}
        live = LiveCluster(on_invalid=lambda o, why: invalid.__setitem__(f"pod/{pod_key(o)}", why))
        node_objs: dict[str, Mapping[str, Any]] = {}
        for n in snap.nodes:
            node_objs[str((n.get("metadata") or {}).get("name"))] = n
            live.upsert_node(n)  # each node converted once: the unreadable ones it leaves out
        booked = set(live.node_names())
        for name, n in node_objs.items():
            if name not in booked:
                try:
                    node_from_k8s(n)
                except InvalidRequest as e:
                    invalid[f"node/{name}"] = str(e)
        pod_objs: dict[str, Mapping[str, Any]] = {}
        pending: dict[str, PodSpec] = {}
        for p in snap.pods:
            ev = parse_pod_event(p)  # as the scheduler reads it (k8s/podevents.py)
            pod_objs[ev.key] = p
            if ev.pending:
                try:
                    pending[ev.key] = ev.spec()
                except InvalidRequest as e:
                    invalid[f"pod/{ev.key}"] = str(e)
                continue
            live.on_pod_event(ev)
        with live.live_books() as st:
            state = st  # these books are doctor's own: no scheduler shares them
        queues = None
        if snap.queues is not None:
            queues = QueueBooks.of(snap.queues, snap.namespaces, state, pending.values())
        return cls(snap, state, node_objs, pod_objs, pending, invalid, list(live.conflicts), policy, queues)

    @property
    def profile(self) -> Profile:
        """The profile the standalone scheduler runs (``policy``, the workload of every pod seen)."""
        if self._profile is None:
            self._profile = make_profile(self.policy, PolicyContext(self.workload, np.random.default_rng(0)))
        return self._profile

    @property
    def workload(self) -> TargetWorkload:
        """The target workload: every pod seen, booked or pending (computed once)."""
        if self._workload is None:
            pods = [a.pod for a in self.state.allocations.values()] + list(self.pending.values())
            self._workload = TargetWorkload.from_pods(pods or [PodSpec("w", 1, 1)])
        return self._workload

    def node_spec(self, name: str) -> NodeSpec | None:
        """The node as booked (None: not in the books, e.g. unreadable)."""
        i = self.state.index.get(name)
        return None if i is None else self.state.nodes[i]

    def node_findings(self, name: str) -> list[Finding]:
        """``checks.node_findings`` of node ``name``, on the spec already booked (computed once)."""
        out = self._findings.get(name)
        if out is None:
            out = self._findings[name] = node_findings(self.node_objs[name], self.node_spec(name))
        return out
