"""The node agent (``gpusched agent``, a DaemonSet): discovery through NVML or a fake backend
(``inventory``, ``nvml``, ``fake``, ``migprofiles``), GFD-compatible node labels (``labels``), the kubelet
device
plugin that carries out the scheduler's ``gpusched.io/assignment`` (``plugin``, ``allocation``), GPU health on
the Node (``health``), dcgm-exporter-compatible metrics (``metrics``) and the commands (``cli``, ``run``).

An adapter at the edge like ``gpusched.k8s``: an import-linter contract keeps the core, the simulator and the
scheduler front ends from importing it. See docs/agent-design.md.
"""
