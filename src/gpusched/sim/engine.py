"""A deterministic discrete-event engine, after SimPy's event heap.

Events sit in a heap of ``(time, priority, sequence, payload)``:

- ``time`` is an integer number of seconds, so no float drift can reorder events;
- ``priority`` orders events of equal time: departures (resources freed) before arrivals
  before scheduling retries before pending timeouts (see ``Priority``);
- ``sequence`` is a counter bumped on every push, so events of equal time and priority pop
  in the order they were pushed (FIFO).

The key ``(time, priority, sequence)`` is unique, so the payload is never compared and two
runs over the same pushes pop the same events in the same order: a deterministic replay.
The engine never reads a clock; time moves only when an event is popped, and it never
steps through the empty time between events.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from enum import IntEnum
from typing import Generic, TypeVar

P = TypeVar("P")


class Priority(IntEnum):
    """Order of events at equal times (lower first)."""

    DEPARTURE = 0
    ARRIVAL = 1
    RETRY = 2
    TIMEOUT = 3


@dataclass(frozen=True, slots=True)
class Event(Generic[P]):
    time: int
    priority: Priority
    seq: int
    payload: P


class EventQueue(Generic[P]):
    """A min-heap of events with a monotone clock: ``now`` is the time of the last pop."""

    __slots__ = ("_heap", "_now", "_seq")

    def __init__(self, start: int = 0) -> None:
        self._heap: list[tuple[int, int, int, Event[P]]] = []
        self._seq = 0
        self._now = start

    @property
    def now(self) -> int:
        """The time of the event popped last (``start`` before any pop)."""
        return self._now

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def push(self, time: int, priority: Priority, payload: P) -> Event[P]:
        """Schedule ``payload`` at ``time``; raises ValueError for a time in the past."""
        if not isinstance(time, int) or isinstance(time, bool):
            raise TypeError(f"event time must be an int (seconds), got {time!r}")
        if time < self._now:
            raise ValueError(f"event at t={time} is before the current time t={self._now}")
        ev = Event(time, priority, self._seq, payload)
        self._seq += 1
        heapq.heappush(self._heap, (time, int(priority), ev.seq, ev))
        return ev

    def peek(self) -> Event[P] | None:
        """The next event, without popping it (None when empty)."""
        return self._heap[0][3] if self._heap else None

    def pop(self) -> Event[P]:
        """Pop the next event and move the clock to its time. Raises IndexError when empty."""
        if not self._heap:
            raise IndexError("pop from an empty event queue")
        ev = heapq.heappop(self._heap)[3]
        self._now = ev.time
        return ev
