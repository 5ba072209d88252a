"""gpusched's mutating admission webhook: every container of a GPU share gets the node agent's
``gpusched.io/gpu-share: 1`` slot, the ticket to the device plugin's ``Allocate`` (docs/agent-design.md).

``mutate`` is pure (an AdmissionReview in, an AdmissionReview out, with a JSONPatch); ``server`` serves
it over HTTPS (aiohttp) at ``/mutate``, with ``/healthz``; ``gpusched webhook`` (``gpusched.cli.serve``)
runs it.
"""
