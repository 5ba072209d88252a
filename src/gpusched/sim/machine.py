"""One simulator machine, in the spirit of SimPy's ``Environment``: the clock and the event heap,
the pending list, the retries (a kick right after a change, a periodic tick), the meters, and
``run(until)``. The replay (``sim.replay``), the churn protocol (``sim.churn``) and the tenants'
replay (``sim.tenants``) are uses of it: each registers one handler per event kind and says what a
retry pass is; the machine pops events in order and calls them.

- **Events.** ``schedule(kind, time, item)`` puts an item (a pod's or a job's index) on the heap of
  ``sim.engine`` under its kind. Events pop by time, then by their kind's ``Priority`` (departures,
  arrivals, retries, time-outs), then in the order they were scheduled. A kind's handler is
  registered once (``on``); an event of a kind without one is refused when scheduled.
- **The pending list** (``Pending``) holds the items waiting, in their retry order (a sort key
  ending with the item's index: ``core.pending.pending_order`` for pods).
- **Retries.** ``wake()`` says room was freed (or the pending list changed): the pending list is
  retried at this same instant, once for all the wakes of that instant (a ``KICK`` event, after
  the instant's departures and arrivals). With ``retry_interval_s``, a ``TICK`` retries it every
  interval while it is not empty. A retry with nothing freed since the last pass is skipped:
  every item waiting failed against at least as much room (feasibility has no random state).
- **Meters** are called with the next event's time before the clock moves there (``now`` is still
  the time of the last event): the state is constant in between, so they integrate and sample.
- **run(until)** pops events before ``until`` and then moves the meters to ``until``; with no
  ``until`` it runs until only the periodic tick is left: nothing can change any more, as long as
  all room freed woke the machine (a use that frees room quietly, as moves do, or that acts on
  ticks, ``after_tick``, runs with an ``until``).

The machine never reads a clock; time moves only when an event pops.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from gpusched.sim.engine import EventQueue, Priority

Handler = Callable[[int], None]
"""Called with the event's item when an event of its kind pops."""
Meter = Callable[[int], None]
"""Called with the time the clock is about to move to."""
SortKey = tuple[object, ...]


@dataclass(frozen=True, slots=True, eq=False)
class Kind:
    """An event kind: its name and its order at equal times. Kinds are compared by identity (each is
    one object, made once), which also makes a handler lookup a pointer hash."""

    name: str
    priority: Priority


ARRIVE = Kind("arrive", Priority.ARRIVAL)
DEPART = Kind("depart", Priority.DEPARTURE)
TIME_OUT = Kind("time out", Priority.TIMEOUT)
KICK = Kind("kick", Priority.RETRY)
"""The machine's: a retry right after a change, at the same instant."""
TICK = Kind("tick", Priority.RETRY)
"""The machine's: the periodic retry."""


@dataclass(frozen=True, slots=True)
class Occurrence:
    """An event's payload: its kind and the item it concerns."""

    kind: Kind
    item: int


class Pending:
    """Items waiting, in retry order: each item has a sort key whose last element is the item."""

    __slots__ = ("_key", "_keys", "_since")

    def __init__(self) -> None:
        self._keys: list[tuple[SortKey, int]] = []  # sorted by key
        self._key: dict[int, SortKey] = {}
        self._since: dict[int, int] = {}

    def add(self, item: int, key: SortKey, since: int) -> None:
        if item in self._key:
            raise ValueError(f"item {item} is already pending")
        if not key or key[-1] != item:
            raise ValueError(f"the sort key {key!r} of item {item} must end with the item")
        bisect.insort(self._keys, (key, item))
        self._key[item] = key
        self._since[item] = since

    def remove(self, item: int) -> int:
        """Take ``item`` off the list; returns the time it was added."""
        key = self._key.pop(item)
        del self._keys[bisect.bisect_left(self._keys, (key, item))]
        return self._since.pop(item)

    def since(self, item: int) -> int:
        return self._since[item]

    def order(self) -> list[int]:
        """The items in retry order (a copy: the list may change while the caller walks it)."""
        return [item for _, item in self._keys]

    def __contains__(self, item: object) -> bool:
        return item in self._key

    def __iter__(self) -> Iterator[int]:
        return iter(self.order())

    def __len__(self) -> int:
        return len(self._keys)

    def __bool__(self) -> bool:
        return bool(self._keys)


def retry_pass(
    order: Sequence[int],
    shapes: Sequence[tuple[object, ...]],
    try_place: Callable[[int], bool],
    unqueue: Callable[[int], object],
) -> None:
    """One pass over the pending items in ``order``: each item placed is taken off the list; once
    a shape fails, its other items are skipped (room only shrinks during a pass)."""
    failed: set[tuple[object, ...]] = set()
    for i in order:
        if shapes[i] in failed:
            continue
        if try_place(i):
            unqueue(i)
        else:
            failed.add(shapes[i])


class Machine:
    """The clock, the event heap, the pending list, kick and tick, the meters, ``run(until)``.

    ``retry`` is the use's pass over the pending list (called by kicks and ticks when room was
    freed); ``after_tick`` (optional) runs after each tick's pass, before the tick is re-armed."""

    def __init__(
        self,
        retry: Callable[[], None],
        *,
        retry_interval_s: int | None = None,
        after_tick: Callable[[], None] | None = None,
        start: int = 0,
    ) -> None:
        if retry_interval_s is not None and retry_interval_s <= 0:
            raise ValueError(f"retry_interval_s must be positive, got {retry_interval_s}")
        self.events: EventQueue[Occurrence] = EventQueue(start)
        self.pending = Pending()
        self.dirty = False
        """Room freed since the last retry pass (``wake`` sets it; a use may too)."""
        self.retry_interval_s = retry_interval_s
        self._retry = retry
        self._after_tick = after_tick
        self._handlers: dict[Kind, Handler] = {}
        self._meters: list[Meter] = []
        self._now = start
        self._kick_armed = False
        self._tick_armed = False
        self.on(KICK, self._kick)
        self.on(TICK, self._tick)

    @property
    def now(self) -> int:
        """The time of the event being handled (of the last one, between events)."""
        return self._now

    # ---------------------------------------------------------------- registration
    def on(self, kind: Kind, handler: Handler) -> None:
        """Register ``handler`` for the events of ``kind`` (once per kind)."""
        if kind in self._handlers:
            raise ValueError(f"a handler for {kind.name!r} events is registered already")
        self._handlers[kind] = handler

    def meter(self, meter: Meter) -> None:
        """Register ``meter``: called with each event's time before the clock moves to it."""
        self._meters.append(meter)

    # ---------------------------------------------------------------- events
    def schedule(self, kind: Kind, time: int, item: int = 0) -> None:
        """An event of ``kind`` about ``item`` at ``time`` (not before ``now``)."""
        if kind not in self._handlers:
            raise ValueError(f"no handler for {kind.name!r} events: register one with on()")
        self.events.push(time, kind.priority, Occurrence(kind, item))

    def enqueue(self, item: int, key: SortKey, give_up_at: int | None = None) -> None:
        """``item`` waits (in ``key``'s order); with ``give_up_at`` a ``TIME_OUT`` event for it is
        scheduled then. The periodic retry is armed if it is not."""
        self.pending.add(item, key, self._now)
        if give_up_at is not None:
            self.schedule(TIME_OUT, give_up_at, item)
        if self.retry_interval_s is not None and not self._tick_armed:
            self.schedule(TICK, self._now + self.retry_interval_s)
            self._tick_armed = True

    def wake(self) -> None:
        """Room was freed (or the pending list changed): retry at this instant, once for all."""
        self.dirty = True
        if self.pending and not self._kick_armed:
            self.schedule(KICK, self._now)
            self._kick_armed = True

    # ---------------------------------------------------------------- the run
    def run(self, until: int | None = None, *, after_event: Callable[[], None] | None = None) -> None:
        """Pop and handle events before ``until``, then move the meters to ``until``; without
        ``until``, until only the periodic tick is left. ``after_event`` (an audit) runs after
        each event."""
        if until is None and self._after_tick is not None:
            raise ValueError("a machine that acts on ticks (after_tick) needs an until: they never stop")
        while self.events:
            ev = self.events.peek()
            assert ev is not None
            if until is not None and ev.time >= until:
                break
            if until is None and ev.payload.kind is TICK and len(self.events) == 1:
                break  # only the tick is left: nothing can change any more
            for meter in self._meters:
                meter(ev.time)
            self.events.pop()
            self._now = ev.time
            self._handlers[ev.payload.kind](ev.payload.item)
            if after_event is not None:
                after_event()
        if until is not None:
            for meter in self._meters:
                meter(until)
            self._now = max(self._now, until)

    # ---------------------------------------------------------------- retries
    def _pass(self) -> None:
        if self.dirty and self.pending:
            self._retry()
        self.dirty = False

    def _kick(self, _item: int) -> None:
        self._pass()
        self._kick_armed = False

    def _tick(self, _item: int) -> None:
        self._pass()
        if self._after_tick is not None:
            self._after_tick()
        self._tick_armed = bool(self.pending)
        if self._tick_armed:
            assert self.retry_interval_s is not None
            self.schedule(TICK, self._now + self.retry_interval_s)
