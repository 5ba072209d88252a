"""Short full passes of the cycle collector in the long-running processes.

CPython's full (generation-2) collection walks every object the collector tracks, and it runs
whenever the objects that survived earlier passes have grown by a quarter. In ``gpusched
extender`` the imported modules alone (the ``kubernetes`` client's models, aiohttp, numpy, scipy)
are about 160 000 such objects: one full pass took 80 ms on an idle machine and 170-400 ms on a
busy 2-core one (7-8 passes in a 3000-pod backlog), each one a stall of the event loop that
answers kube-scheduler's ``/filter`` inside its serial scheduling cycle, and of the standalone
scheduler's decision loop.

Objects alive after start-up (the modules) and after the informers' first sync (the books of
every node and bound pod) are moved to the permanent generation (``gc.freeze``): later passes walk
only what came after. Frozen objects are still freed by reference counting when their last
reference goes; only garbage in a reference cycle among them would never be collected, and the
books hold none (``tests/test_heap.py`` churns them and checks).
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

__all__ = ["freeze_heap", "freeze_when"]


def freeze_heap(why: str) -> int:
    """Collect the garbage there is, then freeze every object left (``gc.freeze``); returns the
    number of objects frozen, in all (``gc.get_freeze_count``). ``why`` names the moment, for the log."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("%d objects kept out of the cycle collector's passes (%s)", frozen, why)
    return frozen


def freeze_when(
    ready: Callable[[], bool], why: str, *, stop: threading.Event | None = None, poll_s: float = 0.5
) -> threading.Thread:
    """Freeze the heap (``freeze_heap``) once ``ready()`` first returns true (e.g. the informers'
    first sync), from a daemon thread polling every ``poll_s`` seconds; setting ``stop`` ends it
    without freezing. Returns the started thread."""
    halt = stop if stop is not None else threading.Event()

    def wait() -> None:
        while not halt.is_set():
            if ready():
                freeze_heap(why)
                return
            halt.wait(poll_s)

    t = threading.Thread(target=wait, name="gpusched-heap-freeze", daemon=True)
    t.start()
    return t
