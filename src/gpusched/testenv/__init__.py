"""A real, throw-away Kubernetes control plane for gpusched's e2e tests and benchmarks.

``ControlPlane`` runs, as local processes on loopback ports with a private temporary directory:

* ``etcd`` (plain HTTP, ``--unsafe-no-fsync``: fast, and the data is thrown away anyway),
* ``kube-apiserver`` (TLS, client-certificate authentication, RBAC),
* optionally ``kube-scheduler`` (with a given KubeSchedulerConfiguration), ``kube-controller-manager`` and
  ``kwok``, which plays the kubelet of every Node: Nodes become Ready and pods bound to them Running.

The binaries are the official ones, built from the Go modules by ``hack/build-control-plane.sh`` into a cache
outside the repository (or taken from ``$GPUSCHED_CONTROLPLANE_BIN``). Certificates are made with the
``cryptography`` package when it is installed, else with the ``openssl`` command.

    with ControlPlane() as cp:
        cp.kubectl("get", "nodes")
        v1 = kubernetes.client.CoreV1Api(cp.api_client())

``RealNode`` (``node.py``) adds a real node on this machine: containerd, runc, CNI, the kubelet with the
control plane's PKI, and gpusched's node agent on fake GPUs (tests/kubelet).

Nothing here is used by the scheduler itself: it is test infrastructure, kept inside the package so that the
benchmarks can use it too.
"""

from gpusched.testenv.binaries import (
    BINARIES,
    ENV_BIN_DIR,
    ENV_KEEP_WORKDIR,
    BinariesUnavailableError,
    ControlPlaneError,
    find_binaries,
    find_build_script,
)
from gpusched.testenv.controlplane import ControlPlane, free_port, wait_until
from gpusched.testenv.node import (
    NodeError,
    NodePartsMissingError,
    RealNode,
    find_node_images,
    missing_parts,
)
from gpusched.testenv.pki import Pki, generate_pki, issue_certificate

__all__ = [
    "BINARIES",
    "ENV_BIN_DIR",
    "ENV_KEEP_WORKDIR",
    "BinariesUnavailableError",
    "ControlPlane",
    "ControlPlaneError",
    "NodeError",
    "NodePartsMissingError",
    "Pki",
    "RealNode",
    "find_binaries",
    "find_build_script",
    "find_node_images",
    "free_port",
    "generate_pki",
    "issue_certificate",
    "missing_parts",
    "wait_until",
]
