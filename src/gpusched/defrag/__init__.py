"""Defragmentation on Kubernetes: the core's planner (``gpusched.core.defrag``) against a live
cluster. ``live``: the cluster as the standalone scheduler books it, and its PodDisruptionBudgets;
``dryrun``: ``gpusched defrag plan`` (plan, report, change nothing); ``controller``: ``gpusched
defrag run`` (plan for GPU pods that waited too long, carry the plan out through the Eviction API,
keep the freed room for the pod it was made for).
"""
