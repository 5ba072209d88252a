"""Tenant queues on Kubernetes: the ``Queue`` CRD (``gpusched.io/v1alpha1``, cluster-scoped) → the
core's ``QueueSpec``/``QueueTree``, which queue a pod belongs to, and the queues' status.

The CRD is ``deploy/helm/gpusched/crds/queues.gpusched.io.yaml`` (its schema refuses negative
quotas and a queue that is its own parent). ``QueueDirectory`` lists and watches the Queues and
the Namespaces and answers:

- ``tree()``: the valid queues as a ``QueueTree``, and the invalid ones with why. A queue whose
  parent is unknown, or that is in a cycle of parents (or under such a queue), is invalid: it
  gets ``status.conditions`` ``Valid=False`` with a message naming ``spec.parent`` and a Warning
  event, and its pods wait;
- ``queue_of(pod)``: the queue of a pod — its annotation ``gpusched.io/queue``, else its
  namespace's label ``gpusched.io/queue``, else a Queue listing the namespace in
  ``spec.namespaces`` ("" when none: the pod is under no queue).

When the CRD is not installed (the list answers 404) the directory is ``installed() == False``
and the scheduler ignores queues; it looks again every ``probe_s``.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpusched.core.cluster import ClusterState
from gpusched.core.model import PodSpec
from gpusched.core.names import LABEL_QUEUE as LABEL_QUEUE
from gpusched.core.queues.quota import QueueBook
from gpusched.core.queues.spec import InvalidQueue, QueueSpec, QueueTree, Quota
from gpusched.core.queues.usage import Usage, charge_of, gpu_charge
from gpusched.k8s.convert import ANN_QUEUE
from gpusched.k8s.informer import Handlers, Reflector

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "gpusched.io", "v1alpha1", "queues"
_FIELDS = (("gpus", "gpus"), ("gpuMilli", "gpu_milli"), ("gpuMemoryMiB", "gpu_memory_mib"))


def _quota(obj: object, where: str) -> Quota:
    if obj is None:
        return Quota()
    if not isinstance(obj, Mapping):
        raise InvalidQueue(f"{where}: must be an object")
    unknown = sorted(set(obj) - {f for f, _ in _FIELDS} - {"dra"})
    if unknown:
        raise InvalidQueue(f"{where}: unknown field(s) {', '.join(unknown)}")
    dra = obj.get("dra") or {}
    if not isinstance(dra, Mapping):
        raise InvalidQueue(f"{where}.dra: must be an object of devices/<class> or capacity/<class>/<name>")
    q = Quota(**{attr: obj.get(f) for f, attr in _FIELDS}, devices=dict(dra))
    q.check(where)
    return q


def _limit(spec: Mapping[str, Any], field: str, where: str) -> Quota | None:
    return None if spec.get(field) is None else _quota(spec[field], f"{where}.{field}")


def queue_from_k8s(obj: Mapping[str, Any]) -> QueueSpec:
    """One Queue object → ``QueueSpec``; ``InvalidQueue`` names the queue and the field."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    spec = obj.get("spec") or {}
    where = f"Queue {name}: spec"
    if not isinstance(spec, Mapping):
        raise InvalidQueue(f"{where}: must be an object")
    per_model: dict[str, Quota] = {}
    for i, item in enumerate(spec.get("perModel") or []):
        model = item.get("model") if isinstance(item, Mapping) else None
        if not isinstance(model, str) or not model:
            raise InvalidQueue(f"{where}.perModel[{i}].model: must be a GPU model name")
        if model in per_model:
            raise InvalidQueue(f"{where}.perModel[{i}].model: {model} is named twice")
        per_model[model] = _quota(item.get("nominalQuota"), f"{where}.perModel[{i}].nominalQuota")
    weight = spec.get("weight", 1)
    return QueueSpec(
        name,
        parent=str(spec.get("parent") or ""),
        nominal=_quota(spec.get("nominalQuota"), f"{where}.nominalQuota"),
        borrowing_limit=_limit(spec, "borrowingLimit", where),
        lending_limit=_limit(spec, "lendingLimit", where),
        per_model=per_model,
        weight=weight,
    )  # fmt: skip


def valid_tree(specs: Mapping[str, QueueSpec]) -> tuple[QueueTree, dict[str, str]]:
    """The tree of the queues whose parent chain ends at a root, and the others with why (an
    unknown parent, a cycle of parents, or an invalid ancestor), each naming ``spec.parent``."""
    bad: dict[str, str] = {}
    for name in sorted(specs):
        path, cur = [name], specs[name].parent
        while cur:
            if cur not in specs:
                bad[name] = f"Queue {path[-1]}: spec.parent {cur!r} is not a known Queue"
                if len(path) > 1:
                    bad[name] = f"Queue {name}: spec.parent: its ancestor {bad[name]}"
                break
            if cur in path:
                cycle = " -> ".join([*path[path.index(cur) :], cur])
                bad[name] = f"Queue {name}: spec.parent forms a cycle of parents ({cycle})"
                break
            path.append(cur)
            cur = specs[cur].parent
    return QueueTree(s for n, s in specs.items() if n not in bad), bad


@dataclass(frozen=True, slots=True)
class Directory:
    """The queues at one moment: the valid tree, the invalid queues (name → why), the Queue
    objects' ``spec.namespaces`` and the Namespaces' labels (namespace → queue)."""

    tree: QueueTree
    invalid: Mapping[str, str]
    by_namespace: Mapping[str, str]

    def queue_of(self, pod: PodSpec) -> tuple[str, str]:
        """(queue, where it came from) of ``pod``; ("", "") when it is under no queue."""
        if pod.queue:
            return pod.queue, f"annotation {ANN_QUEUE} of pod {pod.key}"
        q = self.by_namespace.get(pod.namespace, "")
        return (q, f"namespace {pod.namespace}") if q else ("", "")

    def problem(self, queue: str, source: str) -> str:
        """Why pods of ``queue`` cannot be admitted ("" when they can)."""
        if queue in self.invalid:
            return f"{self.invalid[queue]} (the queue of {source})"
        if queue not in self.tree:
            return f"queue {queue!r} ({source}) is not a known Queue"
        if not self.tree.is_leaf(queue):
            return f"queue {queue!r} ({source}) has child queues; pods go to leaf queues"
        return ""


def build_directory(
    objs: Mapping[str, Mapping[str, Any]], ns_labels: Mapping[str, str]
) -> tuple[Directory, dict[str, str]]:
    """The directory of Queue objects (name → object) and Namespaces' queue labels (namespace →
    queue, "" for none): the valid tree, the invalid queues with why, namespace → queue
    (``spec.namespaces``, overridden by a Namespace's label); and the Queues that could not be read
    (name → why). Used by ``QueueDirectory`` on its informers' objects and by doctor on a list."""
    specs: dict[str, QueueSpec] = {}
    errors: dict[str, str] = {}
    by_ns: dict[str, str] = {}
    for name in sorted(objs):
        obj = objs[name]
        try:
            specs[name] = queue_from_k8s(obj)
        except (InvalidQueue, TypeError, ValueError, AttributeError) as e:  # wrong JSON types too
            errors[name] = str(e) if isinstance(e, InvalidQueue) else f"Queue {name}: spec: {e}"
            continue
        for ns in (obj.get("spec") or {}).get("namespaces") or []:
            by_ns.setdefault(str(ns), name)
    tree, invalid = valid_tree(specs)
    by_ns.update({ns: q for ns, q in ns_labels.items() if q})
    return Directory(tree, {**errors, **invalid}, by_ns), errors


class ClaimCharges(Protocol):
    """What booked pods' DRA claims are charged (``DraBooks.claim_charges``)."""

    def claim_charges(self) -> Mapping[str, Usage]: ...


def charge_booked(snap: ClusterState, d: Directory, claims: ClaimCharges | None = None) -> QueueBook:
    """A queue book charged with every booked pod under a valid leaf queue: what it asks, with its
    node's GPU model, and what its DRA claims ask per DeviceClass (``claims``; the scheduler's
    kept book starts so; doctor's books are built so)."""
    book = QueueBook(d.tree)
    dra = claims.claim_charges() if claims is not None else {}
    for key, a in snap.allocations.items():
        q, _ = d.queue_of(a.pod)
        if q and not d.problem(q, ""):
            model = snap.nodes[a.node].gpu_model
            # what its claims took (allocated, or decided and not yet written), else what they ask
            charge = gpu_charge(a.pod, model) + dra[key] if key in dra else charge_of(a.pod, model)
            book.charge(key, q, charge)
    return book


class QueueDirectory:
    """Queues and Namespaces, kept current by list + watch. ``custom``: a ``CustomObjectsApi``;
    ``core``: a ``CoreV1Api``."""

    def __init__(self, custom: Any, core: Any, *, probe_s: float = 30.0) -> None:
        self.custom = custom
        self.probe_s = probe_s
        self._lock = threading.Lock()
        self._objs: dict[str, Mapping[str, Any]] = {}
        self._ns_labels: dict[str, str] = {}
        self._frozen: Directory | None = None
        self.errors: dict[str, str] = {}
        """Queues whose object could not be read (name → why)."""
        self._installed = False
        self._absent = threading.Event()  # the API answered that Queues are not served (404)
        self._stop = threading.Event()
        list_queues = functools.partial(custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)
        self.queues = Reflector("queues", list_queues, Handlers(self._upsert, self._delete, self._sync))
        self.namespaces = Reflector(
            "namespaces", core.list_namespace, Handlers(self._ns_upsert, self._ns_delete, self._ns_sync)
        )
        self._started = False

    # -------------------------------------------------------------- informer
    def _upsert(self, obj: Mapping[str, Any]) -> None:
        with self._lock:
            self._objs[str(obj["metadata"]["name"])] = obj
            self._frozen = None

    def _delete(self, obj: Mapping[str, Any]) -> None:
        with self._lock:
            self._objs.pop(str(obj["metadata"]["name"]), None)
            self._frozen = None

    def _sync(self, items: list[Mapping[str, Any]]) -> None:
        names = {str(o["metadata"]["name"]) for o in items}
        with self._lock:
            for gone in [n for n in self._objs if n not in names]:
                del self._objs[gone]
            self._frozen = None

    def _ns_upsert(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        q = str((meta.get("labels") or {}).get(LABEL_QUEUE, ""))
        with self._lock:
            if self._ns_labels.get(meta.get("name", "")) != q:
                self._ns_labels[str(meta.get("name", ""))] = q
                self._frozen = None

    def _ns_delete(self, obj: Mapping[str, Any]) -> None:
        with self._lock:
            self._ns_labels.pop(str((obj.get("metadata") or {}).get("name", "")), None)
            self._frozen = None

    def _ns_sync(self, items: list[Mapping[str, Any]]) -> None:
        names = {str((o.get("metadata") or {}).get("name", "")) for o in items}
        with self._lock:
            for gone in [n for n in self._ns_labels if n not in names]:
                del self._ns_labels[gone]
            self._frozen = None

    # ----------------------------------------------------------------- reads
    def installed(self) -> bool:
        return self._installed

    def current(self) -> Directory:
        """The queues now (the same object until a Queue or a Namespace label changes)."""
        with self._lock:
            if self._frozen is None:
                self._frozen = self._build()
            return self._frozen

    def _build(self) -> Directory:
        d, self.errors = build_directory(self._objs, self._ns_labels)
        return d

    def objects(self) -> dict[str, Mapping[str, Any]]:
        with self._lock:
            return dict(self._objs)

    # ------------------------------------------------------------- lifecycle
    def start(self) -> QueueDirectory:
        """Start watching once the CRD answers; until then look again every ``probe_s``."""
        threading.Thread(target=self._probe, name="queues-probe", daemon=True).start()
        return self

    def _probe(self) -> None:
        while not self._stop.is_set():
            try:
                self.custom.list_cluster_custom_object(
                    GROUP, VERSION, PLURAL, limit=1, _preload_content=False
                )
            except Exception as e:
                code = getattr(e, "status", None)
                if code in (403, 404):  # not served, or not ours to read: decide without queues
                    self._absent.set()
                if code != 404:
                    log.warning("listing Queues: %s", e)
                self._stop.wait(self.probe_s)
                continue
            self.namespaces.start()
            self.queues.start()
            self._installed = True
            return

    def synced(self) -> bool:
        return self._installed and self.queues.synced.is_set() and self.namespaces.synced.is_set()

    def ready(self) -> bool:
        """Whether pods may be decided: the Queues and Namespaces are listed, or the API said Queues
        are not served. Until then a pod of a queue would be bound past its quota."""
        return self._absent.is_set() or self.synced()

    def stop(self) -> None:
        self._stop.set()
        self.queues.stop()
        self.namespaces.stop()
