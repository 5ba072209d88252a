"""``gpusched doctor``: why a pod is pending, what would make it fit, and where the GPUs went.

An adapter beside the front ends (it reads the Kubernetes objects through ``gpusched.k8s`` and
runs the core on copies of the books):

- ``snapshot``: the input, the API's Node and Pod objects, from a live cluster (``source``) or
  a file (``load_snapshot``; ``save_snapshot`` writes one from simulator books);
- ``books``: the objects turned into the scheduler's books, as the standalone scheduler builds them;
- ``checks``: node-level and device-plugin-level findings on the objects (inventory, health,
  registration, drift between the assignment and the device plugin's allocation);
- ``counterfactual``: the smallest change that makes a pending pod fit, each checked by running
  the core on a copy of the books (pure: core objects in, typed answers out);
- ``analysis``: ``doctor_pod``, ``doctor_node``, ``doctor_cluster`` and the GPU map's data;
- ``ui``: the GPU map in the browser (one static page and JSON endpoints);
- ``bench``: doctor's time for one pod on a large cluster.
"""

from __future__ import annotations

from gpusched.doctor.analysis import doctor_cluster, doctor_node, doctor_pod, gpu_map
from gpusched.doctor.books import Books
from gpusched.doctor.errors import ApiUnreachable, DoctorError, SnapshotError, UnknownObject
from gpusched.doctor.findings import ClusterReport, Counterfactual, Finding, NodeReport, PodReport
from gpusched.doctor.snapshot import Snapshot, load_snapshot, save_snapshot, snapshot_of_state

__all__ = [
    "ApiUnreachable",
    "Books",
    "ClusterReport",
    "Counterfactual",
    "DoctorError",
    "Finding",
    "NodeReport",
    "PodReport",
    "Snapshot",
    "SnapshotError",
    "UnknownObject",
    "doctor_cluster",
    "doctor_node",
    "doctor_pod",
    "gpu_map",
    "load_snapshot",
    "save_snapshot",
    "snapshot_of_state",
]
