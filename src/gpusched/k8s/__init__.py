"""Kubernetes front ends of gpusched, and the real control plane its e2e tests and benchmarks run against.

``gpusched.k8s.testenv`` is imported explicitly (``from gpusched.k8s.testenv import ControlPlane``): it is
test infrastructure, not needed to run the scheduler.
"""
