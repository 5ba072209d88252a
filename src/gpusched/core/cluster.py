"""The cluster model: integer resource arrays over nodes and GPUs, with assume/forget.

``ClusterState`` is the scheduler cache and the snapshot a scheduling cycle reads. Every
resource is an integer numpy array so that filters and scores run over all nodes at once:

- ``cpu_free[n]``, ``mem_free[n]``: milli-CPU and MiB left on node ``n``.
- ``gpu_free[n, i]``: milli-GPU left on GPU ``i`` of node ``n`` (0..1000); padding GPUs of
  nodes with fewer than ``max_gpus`` GPUs hold 0 and ``gpu_mem_free`` 0, so they never fit.
  A whole-GPU pod books 1000 milli and all of the GPU's memory (``gpu_mem_free`` 0), so no
  share, by milli or by memory, joins it; it takes only a GPU with all its milli and memory
  free (``gpu_room``).
- ``gen[n]``: a generation counter bumped on every change of node ``n``. Score caches keyed
  by pod shape (``caches.rows``) recompute only nodes whose generation moved (an
  equivalence-class cache).
- ``pod_free``, ``ext_free``: pods and extended resources left; ``by_label`` and
  ``anti_affinity`` index the booked pods for the pod-affinity and spread plugins.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from gpusched.core.caches import SnapshotCaches
from gpusched.core.mig import books as migbooks
from gpusched.core.mig.books import MigSlot
from gpusched.core.mig.geometry import MigGpu
from gpusched.core.mig.profiles import MigError
from gpusched.core.model import GPU_MILLI, Allocation, InvalidSpec, NodeSpec, PodSpec
from gpusched.core.selectors import LabelSelector
from gpusched.core.topology import GpuTopology

I64 = npt.NDArray[np.int64]
BoolArr = npt.NDArray[np.bool_]


class AccountingError(RuntimeError):
    """An assume or forget that would break the books (double booking, unknown pod)."""


NO_POD_LIMIT = 1 << 40
"""Pod capacity of a node without a limit (``NodeSpec.max_pods`` 0): more than any run holds."""


class ClusterState:
    def __init__(self, nodes: Sequence[NodeSpec], *, score_cache_capacity: int = 1024) -> None:
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise InvalidSpec(f"duplicate node name {dup!r}")
        self.nodes: tuple[NodeSpec, ...] = tuple(nodes)
        self.names: tuple[str, ...] = tuple(names)
        self.index: dict[str, int] = {n: i for i, n in enumerate(names)}
        n = len(nodes)
        self.max_gpus = max((nd.gpu_count for nd in nodes), default=0) or 1
        self.models: tuple[str, ...] = tuple(sorted({nd.gpu_model for nd in nodes if nd.gpu_model}))
        self.model_index = {m: i for i, m in enumerate(self.models)}
        self.cpu_cap: I64 = np.array([nd.cpu_milli for nd in nodes], dtype=np.int64)
        self.mem_cap: I64 = np.array([nd.memory_mib for nd in nodes], dtype=np.int64)
        self.gpu_count: I64 = np.array([nd.gpu_count for nd in nodes], dtype=np.int64)
        self.model_id: I64 = np.array(
            [self.model_index.get(nd.gpu_model, -1) for nd in nodes], dtype=np.int64
        )
        present: BoolArr = np.arange(self.max_gpus)[None, :] < self.gpu_count[:, None]
        self.gpu_cap: I64 = np.where(present, GPU_MILLI, 0).astype(np.int64)
        gmem = np.array([nd.gpu_memory_mib for nd in nodes], dtype=np.int64)
        self.gpu_mem_cap: I64 = np.where(present, gmem[:, None], 0).astype(np.int64)
        self.gpu_exists: BoolArr = present.copy()
        """GPUs that can take a pod: present, not unhealthy (``NodeSpec.unhealthy_gpus``) and not held
        by a DRA claim (``NodeSpec.claimed_gpus``). Such a GPU keeps its capacity, so the pods still on
        it are booked as usual."""
        for i, nd in enumerate(nodes):
            self.gpu_exists[i, list(nd.unhealthy_gpus | nd.claimed_gpus)] = False
        self.any_unhealthy = any(nd.unhealthy_gpus or nd.claimed_gpus for nd in nodes)
        by_topology: dict[GpuTopology, list[int]] = {}
        for i, nd in enumerate(nodes):
            if nd.gpu_topology is not None:
                by_topology.setdefault(nd.gpu_topology, []).append(i)
        self.topology_groups: tuple[tuple[GpuTopology, I64], ...] = tuple(
            (t, np.array(ix, dtype=np.int64)) for t, ix in by_topology.items()
        )
        """Nodes with a GPU topology, grouped by it (one group per node shape; none in most clusters)."""
        self.pod_cap: I64 = np.array([nd.max_pods or NO_POD_LIMIT for nd in nodes], dtype=np.int64)
        self.ext_names: tuple[str, ...] = tuple(sorted({k for nd in nodes for k in nd.extended}))
        self.ext_index: dict[str, int] = {k: i for i, k in enumerate(self.ext_names)}
        self.ext_cap: I64 = np.array(
            [[nd.extended.get(k, 0) for k in self.ext_names] for nd in nodes], dtype=np.int64
        ).reshape(n, len(self.ext_names))
        self.cpu_free: I64 = self.cpu_cap.copy()
        self.mem_free: I64 = self.mem_cap.copy()
        self.pod_free: I64 = self.pod_cap.copy()
        self.pod_limits = bool((self.pod_cap < NO_POD_LIMIT).any())
        self.everywhere: BoolArr = np.ones(n, dtype=bool)
        """All True, read-only: what a filter returns for a pod it does not constrain."""
        self.everywhere.flags.writeable = False
        self.ext_free: I64 = self.ext_cap.copy()
        self.gpu_free: I64 = self.gpu_cap.copy()
        self.gpu_mem_free: I64 = self.gpu_mem_cap.copy()
        self.gen: I64 = np.zeros(n, dtype=np.int64)
        self.allocations: dict[str, Allocation] = {}
        self.anti_affinity: set[str] = set()
        self.by_label: dict[tuple[str, str, str], set[str]] = {}
        """(namespace, label key, value) -> keys of the booked pods with that label."""
        """Keys of booked pods with required pod anti-affinity (every placement must respect them)."""
        self.node_pods: list[set[str]] = [set() for _ in range(n)]
        self.caches = SnapshotCaches(score_cache_capacity)
        """Per-snapshot typed caches of plugins (``core.caches``); a copy starts empty."""
        self.total_gpu_milli = int(self.gpu_cap.sum())
        self.memory_shares = 0
        self.mig_books: list[dict[int, MigGpu]] = [nd.mig.empty_books() if nd.mig else {} for nd in nodes]
        """Per node with a MIG geometry, per GPU index: the instances booked by pods (``core.mig.books``)."""
        self.mig_free: list[Counter[str]] = [
            migbooks.free_counts(nd.mig) if nd.mig else Counter() for nd in nodes
        ]
        """Per node with a MIG geometry: free instances per profile (present, takes pods, held by none).
        Present instances never overlap, so a request fits exactly when these counts cover it."""
        self.mig_demand: Counter[str] = Counter()
        """MIG slices booked now, per profile: the demand mix that weighs the MIG fragmentation measure."""
        """Booked pods with GPUs but no milli (shares by memory alone): only they leave a GPU
        with all its milli free and some memory taken, which a whole GPU must then avoid."""

    # ----------------------------------------------------------------- views
    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def version(self) -> int:
        """Moves forward with every booking and release (the sum of node generations), so a
        value computed from the whole snapshot can be cached against it."""
        return int(self.gen.sum())

    def selected(
        self, selector: LabelSelector | None, namespaces: Collection[str] | None
    ) -> list[Allocation]:
        """The booked pods in ``namespaces`` (None: every namespace) that ``selector`` selects
        (None selects none). With ``match_labels`` only the pods carrying those labels are read."""
        if selector is None:
            return []
        if selector.match_labels and namespaces is not None:
            k, v = selector.match_labels[0]
            keys: Iterable[str] = [key for ns in namespaces for key in self.by_label.get((ns, k, v), ())]
        else:
            keys = self.allocations
        out = []
        for key in keys:
            a = self.allocations[key]
            if (namespaces is None or a.pod.namespace in namespaces) and selector.matches(a.pod.labels):
                out.append(a)
        return out

    def selected_nodes(self, selector: LabelSelector | None, namespaces: Collection[str] | None) -> I64:
        """The node of each pod ``selected`` returns (the index answers one-label selectors alone)."""
        one_label = (
            selector is not None and len(selector.match_labels) == 1 and not selector.match_expressions
        )
        if one_label and selector is not None and namespaces is not None:
            k, v = selector.match_labels[0]
            allocs = self.allocations
            keys = [key for ns in namespaces for key in self.by_label.get((ns, k, v), ())]
            return np.fromiter((allocs[key].node for key in keys), dtype=np.int64, count=len(keys))
        chosen = self.selected(selector, namespaces)
        return np.fromiter((a.node for a in chosen), dtype=np.int64, count=len(chosen))

    def domains(self, key: str) -> tuple[I64, tuple[str, ...]]:
        """Per node, the index of its value of label ``key`` in the returned values (-1 where
        the node lacks the label); node labels never change, so it is computed once."""
        cached = self.caches.domains.get(key)
        if cached is None:
            values = tuple(sorted({v for nd in self.nodes if (v := nd.labels.get(key)) is not None}))
            at = {v: i for i, v in enumerate(values)}
            codes = np.array(
                [at.get(nd.labels[key], -1) if key in nd.labels else -1 for nd in self.nodes], dtype=np.int64
            )
            cached = (codes, values)
            self.caches.domains.put(key, cached)
        return cached

    def node_gpu_free(self, node: int) -> list[int]:
        return [int(v) for v in self.gpu_free[node, : int(self.gpu_count[node])]]

    def gpu_room(self, pod: PodSpec, nodes: I64 | slice) -> BoolArr:
        """(k, G): GPU j of each of ``nodes`` can take one of ``pod``'s GPUs now. A share needs
        its milli and memory free there; a whole GPU needs the GPU entirely free (1000 milli and
        all its memory: nothing, not even a share by memory alone, on it) and at least
        ``gpu_memory_mib`` of memory. Unhealthy GPUs never qualify; padding GPUs never qualify for
        a pod that asks for GPU memory or milli (they have neither)."""
        ok: BoolArr = self.gpu_free[nodes] >= pod.gpu_milli
        if pod.gpu_memory_mib:
            ok &= self.gpu_mem_free[nodes] >= pod.gpu_memory_mib
        if self.memory_shares and pod.gpu_milli >= GPU_MILLI:
            ok &= self.gpu_mem_free[nodes] >= self.gpu_mem_cap[nodes]
        if self.any_unhealthy:
            ok &= self.gpu_exists[nodes]
        return ok

    def allocated_gpu_milli(self) -> int:
        return self.total_gpu_milli - int(self.gpu_free.sum())

    def gpu_allocation_ratio(self) -> float:
        return self.allocated_gpu_milli() / self.total_gpu_milli if self.total_gpu_milli else 0.0

    # ------------------------------------------------------------ accounting
    def check_indices(self, pod: PodSpec, node: int, gpus: Sequence[int]) -> str | None:
        """Why ``gpus`` on ``node`` do not exist (or repeat), or None when they do."""
        if not 0 <= node < len(self.nodes):
            return f"node index {node} out of range"
        if len(set(gpus)) != len(gpus):
            return f"pod {pod.key}: GPU indices repeat in {list(gpus)}"
        for g in gpus:
            if not 0 <= g < self.gpu_count[node]:
                return f"node {self.names[node]} has no GPU {g}"
        return None

    def check_fits(self, pod: PodSpec, node: int, gpus: Sequence[int]) -> str | None:
        """Why ``pod`` cannot take ``gpus`` on ``node`` now, or None when it can."""
        why = self.check_indices(pod, node, gpus)
        if why is not None:
            return why
        name = self.names[node]
        if len(gpus) != pod.num_gpu:
            return f"pod {pod.key} asks for {pod.num_gpu} GPUs, assignment has {len(gpus)}"
        if self.cpu_free[node] < pod.cpu_milli:
            return f"node {name}: cpu {self.cpu_free[node]} free < {pod.cpu_milli}"
        if self.mem_free[node] < pod.memory_mib:
            return f"node {name}: memory {self.mem_free[node]} MiB free < {pod.memory_mib}"
        if self.pod_free[node] < 1:
            return f"node {name}: too many pods (it takes {self.pod_cap[node]})"
        for res, amount in pod.extended.items():
            i = self.ext_index.get(res)
            free = int(self.ext_free[node, i]) if i is not None else 0
            if free < amount:
                return f"node {name}: {res} {free} free < {amount}"
        if pod.num_gpu and pod.gpu_models and self.nodes[node].gpu_model not in pod.gpu_models:
            return f"node {name}: GPU model {self.nodes[node].gpu_model} not in {sorted(pod.gpu_models)}"
        for g in gpus:
            if self.gpu_free[node, g] < pod.gpu_milli:
                return f"node {name} GPU {g}: {self.gpu_free[node, g]} milli free < {pod.gpu_milli}"
            if self.gpu_mem_free[node, g] < pod.gpu_memory_mib:
                return f"node {name} GPU {g}: {self.gpu_mem_free[node, g]} MiB free < {pod.gpu_memory_mib}"
            held = int(self.gpu_mem_cap[node, g] - self.gpu_mem_free[node, g])
            if pod.is_whole and held > 0:
                return f"node {name} GPU {g}: a share holds {held} MiB of it; pod {pod.key} takes it whole"
        return None

    def mig_fits(self, pod: PodSpec, node: int) -> bool:
        """Whether ``pod``'s MIG slices fit on ``node`` now (always, where the node has no MIG geometry:
        the slices are then counted only, in ``extended``)."""
        nm = self.nodes[node].mig
        if not pod.mig or nm is None:
            return True
        free = self.mig_free[node]
        return all(free[p] >= n for p, n in Counter(pod.mig).items())

    def mig_why_not(self, pod: PodSpec, node: int) -> tuple[str, bool]:
        """Why ``pod``'s MIG slices do not fit on ``node`` (a node with a MIG geometry), and whether they
        never could there."""
        nm = self.nodes[node].mig
        if nm is None:
            return "no MIG geometry", False
        return migbooks.why_not(nm, self.mig_books[node], pod.mig)

    def _mig_slots(
        self, pod: PodSpec, node: int, mig: Sequence[MigSlot] | None, check: bool
    ) -> tuple[MigSlot, ...]:
        """The MIG slices ``pod`` books on ``node``: ``mig`` as given (checked to be its profiles, present
        and free when ``check``), else placed by the MIG fragmentation measure. Raises AccountingError for a
        decision (``check``); a fact books what it can and never raises."""
        nm = self.nodes[node].mig
        if not pod.mig or nm is None:
            return ()
        books = self.mig_books[node]
        if mig is None:
            placed = migbooks.place(nm, books, pod.mig, self.mig_demand)
            if placed is None and check:
                raise AccountingError(f"node {self.names[node]}: {migbooks.why_not(nm, books, pod.mig)[0]}")
            return placed or ()  # a fact with no free instance left: counted only
        slots = tuple(mig)
        if check:
            if sorted(s.profile for s in slots) != list(pod.mig):
                raise AccountingError(
                    f"pod {pod.key} asks for MIG {list(pod.mig)}, its slices are {list(slots)}"
                )
            why = migbooks.check_present(nm, books, slots)
            if why is not None:
                raise AccountingError(f"node {self.names[node]}: {why}")
            return slots
        work, kept = dict(books), []  # a fact (a running pod): book what does not overlap, skip the rest
        for sl in slots:
            try:
                migbooks.book(work, sl)
                kept.append(sl)
            except MigError:
                pass
        return tuple(kept)

    def assume(
        self,
        pod: PodSpec,
        node: int,
        gpus: Sequence[int],
        *,
        check: bool = True,
        mig: Sequence[MigSlot] | None = None,
    ) -> Allocation:
        """Book ``pod`` onto ``node`` and ``gpus``. Raises AccountingError if it does not fit.
        ``mig``: the MIG slices it holds (as recorded in its assignment); None places them
        (``core.mig.books.place``) on a node with a MIG geometry.

        ``check=False`` books a fact rather than a decision (a pod the API shows running): only
        the node and GPU indices must exist; free amounts may go below zero, so the books show
        the overcommit and nothing more lands there, and resources the node lacks are skipped."""
        if pod.key in self.allocations:
            raise AccountingError(
                f"pod {pod.key} is already assumed on {self.names[self.allocations[pod.key].node]}"
            )
        why = self.check_fits(pod, node, gpus) if check else self.check_indices(pod, node, gpus)
        if why is not None:
            raise AccountingError(why)
        slots = self._mig_slots(pod, node, mig, check)
        alloc = Allocation(pod, node, tuple(int(g) for g in gpus), slots)
        self._apply(alloc, -1)
        self.allocations[pod.key] = alloc
        self.node_pods[node].add(pod.key)
        return alloc

    def forget(self, pod_key: str) -> Allocation:
        """Release what ``pod_key`` holds; the exact inverse of ``assume``."""
        alloc = self.allocations.pop(pod_key, None)
        if alloc is None:
            raise AccountingError(f"pod {pod_key} is not assumed")
        self._apply(alloc, +1)
        self.node_pods[alloc.node].discard(pod_key)
        return alloc

    def _apply(self, a: Allocation, sign: int) -> None:
        p, n = a.pod, a.node
        self.cpu_free[n] += sign * p.cpu_milli
        self.mem_free[n] += sign * p.memory_mib
        self.pod_free[n] += sign
        if p.pod_anti_affinity:
            if sign < 0:
                self.anti_affinity.add(p.key)
            else:
                self.anti_affinity.discard(p.key)
        for k, v in p.labels.items():
            idx = (p.namespace, k, v)
            if sign < 0:
                self.by_label.setdefault(idx, set()).add(p.key)
            else:
                bucket = self.by_label.get(idx)
                if bucket is not None:
                    bucket.discard(p.key)
                    if not bucket:
                        del self.by_label[idx]
        for res, amount in p.extended.items():
            i = self.ext_index.get(res)  # None only when booked unchecked: skipped both ways
            if amount and i is not None:
                self.ext_free[n, i] += sign * amount
        if a.gpus:  # scalar updates: a fancy-indexed update costs several times more for 1-8 GPUs
            milli = sign * p.gpu_milli
            mem = sign * p.gpu_memory_booked(self.nodes[n].gpu_memory_mib)
            if not p.gpu_milli:
                self.memory_shares -= sign
            free, mem_free = self.gpu_free[n], self.gpu_mem_free[n]
            for g in a.gpus:
                free[g] += milli
                if mem:
                    mem_free[g] += mem
        if a.mig:
            books = self.mig_books[n] = dict(self.mig_books[n])  # copies share the old dict and Counter
            free = self.mig_free[n] = Counter(self.mig_free[n])
            open_ = migbooks.open_gpus(nm) if (nm := self.nodes[n].mig) is not None else frozenset()
            for sl in a.mig:
                (migbooks.book if sign < 0 else migbooks.unbook)(books, sl)
                self.mig_demand[sl.profile] -= sign
                if sl.gpu in open_:  # a slice on a GPU being re-cut is no free instance of the others
                    free[sl.profile] += sign
        self.gen[n] += 1

    def relabel_node(self, node: int, spec: NodeSpec) -> bool:
        """Put ``spec`` in place of node ``node``'s spec when the two differ only in labels and
        taints (a taint added or lifted, a label changed): its bookings stay, its generation
        moves, the cached node masks recompute its entry and the other per-snapshot caches that
        read labels or taints are dropped (``SnapshotCaches.labels_changed``). Returns False,
        changing nothing, when any capacity, the GPU model or a GPU's health differs (rebuild)."""
        old = self.nodes[node]
        if old.name != spec.name or replace(spec, labels=old.labels, taints=old.taints) != old:
            return False
        self.nodes = (*self.nodes[:node], spec, *self.nodes[node + 1 :])
        self.gen[node] += 1
        self.caches.labels_changed(node, len(self.nodes))
        return True

    # --------------------------------------------------------------- copying
    def copy(self) -> ClusterState:
        """An independent snapshot sharing the immutable node specs."""
        c = object.__new__(ClusterState)
        c.__dict__.update(self.__dict__)
        for f in ("cpu_free", "mem_free", "pod_free", "ext_free", "gpu_free", "gpu_mem_free", "gen"):
            setattr(c, f, getattr(self, f).copy())
        c.allocations = dict(self.allocations)
        c.mig_books = list(self.mig_books)  # each node's dict is replaced, never changed in place
        c.mig_free = list(self.mig_free)  # so is each node's Counter
        c.mig_demand = Counter(self.mig_demand)
        c.node_pods = [set(s) for s in self.node_pods]
        c.anti_affinity = set(self.anti_affinity)
        c.by_label = {k: set(v) for k, v in self.by_label.items()}
        c.caches = self.caches.fresh()
        return c

    def verify(self) -> list[str]:
        """Recompute every free amount from the allocations; list any disagreement (should be none)."""
        cpu = self.cpu_cap.copy()
        mem = self.mem_cap.copy()
        gpu = self.gpu_cap.copy()
        gmem = self.gpu_mem_cap.copy()
        pods = self.pod_cap.copy()
        ext = self.ext_cap.copy()
        for a in self.allocations.values():
            cpu[a.node] -= a.pod.cpu_milli
            mem[a.node] -= a.pod.memory_mib
            pods[a.node] -= 1
            for res, amount in a.pod.extended.items():
                i = self.ext_index.get(res)
                if amount and i is not None:
                    ext[a.node, i] -= amount
            mem_booked = a.pod.gpu_memory_booked(self.nodes[a.node].gpu_memory_mib)
            for g in a.gpus:
                gpu[a.node, g] -= a.pod.gpu_milli
                gmem[a.node, g] -= mem_booked
        errs = []
        mig = [nd.mig.empty_books() if nd.mig else {} for nd in self.nodes]
        demand: Counter[str] = Counter()
        for a in self.allocations.values():
            for sl in a.mig:
                try:
                    migbooks.book(mig[a.node], sl)
                except MigError as e:
                    errs.append(f"MIG slices overlap on node {self.names[a.node]}: {e}")
                demand[sl.profile] += 1
        if [_instances(b) for b in mig] != [_instances(b) for b in self.mig_books]:
            errs.append("MIG books disagree with allocations")
        free = [migbooks.free_counts(nd.mig) if nd.mig else Counter() for nd in self.nodes]
        for a in self.allocations.values():
            nm = self.nodes[a.node].mig
            for sl in a.mig:
                if nm is not None and sl.gpu in migbooks.open_gpus(nm):
                    free[a.node][sl.profile] -= 1
        if [+f for f in free] != [+f for f in self.mig_free]:
            errs.append("MIG free instance counts disagree with allocations")
        if +demand != +self.mig_demand:
            errs.append("MIG demand disagrees with allocations")
        shares = sum(1 for a in self.allocations.values() if a.gpus and not a.pod.gpu_milli)
        if shares != self.memory_shares:
            errs.append(f"{self.memory_shares} shares by memory alone counted, {shares} booked")
        for name, want, have in (
            ("cpu", cpu, self.cpu_free),
            ("memory", mem, self.mem_free),
            ("gpu milli", gpu, self.gpu_free),
            ("gpu memory", gmem, self.gpu_mem_free),
            ("pod count", pods, self.pod_free),
            ("extended resources", ext, self.ext_free),
        ):
            if not np.array_equal(want, have):
                errs.append(f"{name} books disagree with allocations")
            if (have < 0).any():
                errs.append(f"{name} overcommitted")
        return errs


def _instances(books: dict[int, MigGpu]) -> dict[int, frozenset[object]]:
    return {i: frozenset(g.instances) for i, g in books.items()}
