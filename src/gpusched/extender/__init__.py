"""The kube-scheduler extender: gpusched's GPU filters, scores and device choice behind
kube-scheduler's HTTP extender protocol (filter, prioritize, bind, preempt).

- ``protocol`` — the wire format (Go field names), error answers, score normalisation.
- ``handlers`` — the verbs as pure request → answer logic over ``LiveCluster`` and the core.
- ``app`` — the aiohttp server (thread pool for binding API calls, health, metrics).
- ``serve`` — ``gpusched extender`` / ``python -m gpusched.cli extender``.
"""
