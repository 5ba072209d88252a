"""Kubernetes front ends of gpusched: the standalone scheduler, and the parts the extender shares with it.

The real control plane that the e2e tests and benchmarks run against is test infrastructure, and lives in
``gpusched.testenv``; nothing here imports it.
"""
