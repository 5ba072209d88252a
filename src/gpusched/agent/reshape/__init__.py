"""Reshaping a node's MIG geometry from a plan of the core's planner (``gpusched.core.mig.reshape``).

- ``apply``: way (a), the agent creates and destroys GPU and compute instances itself (through NVML on the
  real backend, in memory on the fake one), rolling back to the previous layout when a call fails part-way.
- ``nvmlops``: the NVML calls behind way (a) on the real backend.
- ``fakeops``: the same operations on the fake backend's inventory, with the same failure injection.
- ``manager``: way (b), NVIDIA's mig-manager applies a mig-parted configuration named by the node label
  ``nvidia.com/mig.config``; the agent writes both and waits for ``nvidia.com/mig.config.state``.
- ``way``: which of the two a node uses (a node label, else the agent's flag).
"""
