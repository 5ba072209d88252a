"""A snapshot turned into the scheduler's books, as the standalone scheduler builds them
(``gpusched.k8s.state.LiveCluster``: bound pods booked where their assignment says), with the
pending pods, the objects by name and what could not be read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gpusched.core.cluster import ClusterState
from gpusched.core.dra.celexpr import CelCompiler
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.framework import Profile
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.policies import PolicyContext, make_profile
from gpusched.doctor.checks import mixed_findings, node_findings
from gpusched.doctor.findings import Finding
from gpusched.doctor.queues import QueueBooks
from gpusched.doctor.snapshot import Snapshot
from gpusched.k8s.convert import InvalidRequest, node_from_k8s
from gpusched.k8s.dra.books import DraBooks
from gpusched.k8s.dra.mixed import MixedNodes, SharedGpu, UnmappedNode
from gpusched.k8s.dra.podclaims import Invalid, Waiting, has_claims, resolve
from gpusched.k8s.podevents import parse_pod_event
from gpusched.k8s.state import LiveCluster, pod_key


def dra_books(snap: Snapshot) -> DraBooks | None:
    """The snapshot's DRA objects in the scheduler's DRA books (None when it has none)."""
    if not any(snap.dra.values()):
        return None
    books = DraBooks(CelCompiler())
    for o in snap.dra.get("deviceClasses", ()):
        books.upsert_class(o)
    for o in snap.dra.get("resourceSlices", ()):
        books.upsert_slice(o)
    for o in snap.dra.get("deviceTaintRules", ()):
        books.upsert_rule(o)
    for o in snap.dra.get("resourceClaims", ()):
        books.upsert_claim(o)
    return books


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
    dra: DraBooks | None = None
    """The snapshot's DRA objects as the scheduler books them (None: the snapshot has none)."""
    mixed: dict[str, tuple[SharedGpu, ...]] = field(default_factory=dict)
    """Nodes whose GPUs a DRA driver and gpusched's agent both serve (``k8s/dra/mixed.py``)."""
    unmapped: dict[str, UnmappedNode] = field(default_factory=dict)
    """Nodes serving GPUs without the agent's UUIDs beside a GPU DRA driver (refused: GPUs withheld)."""
    claim_waits: dict[str, str] = field(default_factory=dict)
    """Pending claim pods whose claims cannot be allocated yet (not created, being deleted...): why."""
    _profile: Profile | None = None
    _workload: TargetWorkload | None = None
    _findings: dict[str, list[Finding]] = field(default_factory=dict)

    @classmethod
    def of(cls, snap: Snapshot, policy: str = "default") -> Books:
        invalid: dict[str, str] = {}
        live = LiveCluster(on_invalid=lambda o, why: invalid.__setitem__(f"pod/{pod_key(o)}", why))
        dra = dra_books(snap)
        mixed = MixedNodes(dra, live) if dra is not None else None  # claimed GPUs withheld, as scheduled
        claim_waits: dict[str, str] = {}
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
                    spec = ev.spec()
                except InvalidRequest as e:
                    invalid[f"pod/{ev.key}"] = str(e)
                    continue
                if has_claims(p):  # its claims resolved and attached, as the scheduler does
                    r = resolve(p, dra) if dra is not None else Waiting("the snapshot has no DRA objects")
                    if isinstance(r, Invalid):
                        invalid[f"pod/{ev.key}"] = r.reason
                        continue
                    if isinstance(r, Waiting):
                        claim_waits[ev.key] = r.reason
                    else:
                        spec = replace(spec, claims=r.claims)
                pending[ev.key] = spec
                continue
            live.on_pod_event(ev)
        with live.live_books() as st:
            state = st  # these books are doctor's own: no scheduler shares them
        queues = None
        if snap.queues is not None:
            queues = QueueBooks.of(snap.queues, snap.namespaces, state, pending.values())
        shared = mixed.shared() if mixed is not None else {}
        unmapped = mixed.unmapped() if mixed is not None else {}
        return cls(
            snap,
            state,
            node_objs,
            pod_objs,
            pending,
            invalid,
            list(live.conflicts),
            policy,
            queues,
            dra,
            shared,
            unmapped,
            claim_waits,
        )

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
            out = node_findings(self.node_objs[name], self.node_spec(name))
            out += mixed_findings(
                {name: self.mixed[name]} if name in self.mixed else {},
                {name: self.unmapped[name]} if name in self.unmapped else {},
            )
            self._findings[name] = out
        return out
