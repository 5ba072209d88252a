"""Prometheus metrics of the scheduler front ends (one registry per component, no globals)."""

from gpusched.metrics.scheduling import SchedulerMetrics

__all__ = ["SchedulerMetrics"]
