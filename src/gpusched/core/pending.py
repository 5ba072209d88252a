"""The order in which pending pods are tried: kube-scheduler's activeQ order (``PrioritySort``).

Higher priority first, then earlier creation, then arrival order. Both pending queues use it:
the standalone scheduler's ``k8s.queue.SchedulingQueue`` (creation as the RFC 3339 timestamp
string, arrival as the informer's order) and the replay's (``sim.replay``: creation in trace
seconds, arrival as the pod's index in the trace).

The queues themselves stay two, because what they do with the order differs: the standalone
queue is a heap fed by threads, with per-pod backoff (1 s doubling to 10 s) and a periodic flush
of unschedulable pods on the wall clock; the replay's is a sorted list retried as a whole pass,
in trace time, after departures and every retry interval, with no backoff (a pass skips the
shapes that already failed in it). Only the order is shared, so both try pods alike.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def pending_order(priority: int, created: T, arrival: int) -> tuple[int, T, int]:
    """The sort key of a pending pod: smaller is tried first."""
    return (-priority, created, arrival)
