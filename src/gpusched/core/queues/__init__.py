"""Tenant queues: quota, borrowing and lending in a tree, fair sharing, reclaim (pure, integer).

- ``spec``: ``QueueSpec``, ``Quota``, ``QueueTree`` (validated: ``InvalidQueue`` names the field);
- ``usage``: ``Usage`` vectors and ``charge_of(pod, model)``;
- ``quota``: ``QueueBook`` (admission ``check``, ``charge``/``release``, borrowed amounts);
- ``fairshare``: weighted dominant shares (DRF) and ``water_fill``;
- ``reclaim``: ``plan_reclaim`` (victims among borrowers' pods);
- ``status``: ``QueueStatus`` for the front ends to publish.

The cycle that uses them with gangs is ``gpusched.core.batch.run_cycle``.
"""

from gpusched.core.queues.quota import QueueBook, Verdict
from gpusched.core.queues.reclaim import ReclaimPlan, plan_reclaim
from gpusched.core.queues.spec import ANY_MODEL, InvalidQueue, QueueSpec, QueueTree, Quota, ResourceKey
from gpusched.core.queues.status import QueueStatus, queue_statuses
from gpusched.core.queues.usage import Usage, charge_of

__all__ = [
    "ANY_MODEL",
    "InvalidQueue",
    "QueueBook",
    "QueueSpec",
    "QueueStatus",
    "QueueTree",
    "Quota",
    "ReclaimPlan",
    "ResourceKey",
    "Usage",
    "Verdict",
    "charge_of",
    "plan_reclaim",
    "queue_statuses",
]
