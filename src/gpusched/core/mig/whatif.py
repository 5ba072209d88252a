"""What-ifs on a copy of the books for MIG: a node's GPUs re-cut, as its agent would publish them.

``recut`` turns a re-cut (``core.mig.reshape.GpuRecut``, the scheduler's own request) into the GPU it leaves
(every destroy and create checked as MIG would, ``reshape.apply_step``), and ``with_node_mig`` gives a copy of
``ClusterState`` where one node shows that geometry: its ``NodeSpec.mig``, the ``nvidia.com/mig-<profile>``
counts the device plugin would advertise, and the free instances per profile, with every pod's slices still
booked. The scheduler's own filter can then be asked whether a pod fits there (``doctor``'s counterfactual).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np

from gpusched.core.cluster import ClusterState
from gpusched.core.mig import books as migbooks
from gpusched.core.mig.books import NodeMig
from gpusched.core.mig.geometry import MigPlacementError
from gpusched.core.mig.reshape import GpuRecut, GpuReshape, apply_step

MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


def mig_resource(profile: str) -> str:
    """The device plugin's resource name of a profile (``1g.10gb+me`` -> ``nvidia.com/mig-1g.10gb.me``)."""
    return MIG_RESOURCE_PREFIX + profile.replace("+", ".")


def recut(node: NodeMig, change: GpuRecut) -> NodeMig:
    """``node`` after ``change`` (raises MigPlacementError for a change the GPU cannot take)."""
    g = node.gpu(change.gpu)
    if g is None:
        raise MigPlacementError(f"no MIG GPU {change.gpu} on this node")
    step = GpuReshape(g.name, False, change.destroy, change.create, change.serves, g.instances, ())
    after = apply_step(g, step)
    gpus = tuple(after if i == change.gpu else x for i, x in zip(node.indices, node.gpus, strict=True))
    return NodeMig(gpus, node.indices, node.reshaping - {change.gpu})


def with_node_mig(snap: ClusterState, node: int, mig: NodeMig) -> ClusterState:
    """A copy of ``snap`` where node ``node`` holds the MIG geometry ``mig`` (same GPU indices): the pods'
    slices stay booked (raises MigPlacementError when one is no longer present), the MIG resource counts
    follow the instances present, and ``snap`` is left as it was."""
    old = snap.nodes[node]
    if old.mig is None or old.mig.indices != mig.indices:
        raise MigPlacementError(f"node {snap.names[node]}: a re-cut must keep its MIG GPUs")
    books = snap.mig_books[node]
    for i, held in books.items():
        g = mig.gpu(i)
        assert g is not None
        gone = [x for x in held.instances if x not in g.instances]
        if gone:
            raise MigPlacementError(
                f"node {snap.names[node]} GPU {i}: a re-cut would destroy held {gone[0].profile} at "
                f"slice {gone[0].start}"
            )
    before, after = _present(old.mig), _present(mig)
    extended = dict(old.extended)
    for p in set(before) | set(after):
        res = mig_resource(p)
        extended[res] = max(0, extended.get(res, 0) + after[p] - before[p])
    out = snap.copy()
    out.nodes = (*snap.nodes[:node], replace(old, mig=mig, extended=extended), *snap.nodes[node + 1 :])
    new = [r for r in sorted(extended) if r not in out.ext_index]
    if new:  # a profile no node advertised before: one more column
        out.ext_names = (*out.ext_names, *new)
        out.ext_index = {k: i for i, k in enumerate(out.ext_names)}
        pad = np.zeros((len(out.nodes), len(new)), dtype=np.int64)
        out.ext_cap = np.hstack([out.ext_cap, pad])
        out.ext_free = np.hstack([out.ext_free, pad])
    else:
        out.ext_cap = out.ext_cap.copy()
    for res, n in extended.items():
        k = out.ext_index[res]
        out.ext_free[node, k] += n - int(out.ext_cap[node, k])
        out.ext_cap[node, k] = n
    free = migbooks.free_counts(mig)
    for g in books.values():
        for x in g.instances:
            free[x.profile] -= 1
    out.mig_free = list(out.mig_free)
    out.mig_free[node] = free
    out.gen[node] += 1
    return out


def _present(node: NodeMig) -> Counter[str]:
    return Counter(x.profile for g in node.gpus if g.mig_enabled for x in g.instances)
