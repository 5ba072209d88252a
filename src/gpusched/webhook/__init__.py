"""gpusched's admission webhook, three endpoints each registered as its own webhook (deploy/):

- ``/mutate`` (``mutate``): every container of a GPU share gets the node agent's ``gpusched.io/gpu-share: 1``
  slot, the ticket to the device plugin's ``Allocate`` (docs/agent-design.md);
- ``/guard`` (``guard``): only gpusched's own identities write ``gpusched.io/assignment`` and
  ``gpusched.io/allocated`` (issue 28 F3);
- ``/route`` (``route``): GPU pods go to gpusched's scheduler (the mixed-schedulers rule, deploy/README.md).

Each is pure (an AdmissionReview in, an AdmissionReview out; ``review`` holds the envelope); ``server``
serves them over HTTPS (aiohttp), with ``/healthz``; ``gpusched webhook`` (``gpusched.cli.serve``) runs it.
"""
