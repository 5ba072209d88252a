"""The simulator machine (sim/machine.py): events in time order, ties by kind then in the order
scheduled, run(until), one handler per kind, the pending list, and the kick/tick retries."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.sim.engine import Priority
from gpusched.sim.machine import ARRIVE, DEPART, KICK, TICK, TIME_OUT, Kind, Machine, Pending

KINDS = (ARRIVE, DEPART, TIME_OUT)


def _noop() -> None:
    pass


def recording(m: Machine, kinds: tuple[Kind, ...] = KINDS) -> list[tuple[int, str, int]]:
    """Register a handler per kind that logs (now, kind, item)."""
    log: list[tuple[int, str, int]] = []
    for k in kinds:
        m.on(k, lambda item, k=k: log.append((m.now, k.name, item)))
    return log


# ------------------------------------------------------------------------------- order and run
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.sampled_from(range(len(KINDS)))), max_size=40))
def test_events_pop_by_time_then_kind_priority_then_in_the_order_scheduled(
    plan: list[tuple[int, int]],
) -> None:
    m = Machine(_noop)
    log = recording(m)
    for item, (t, k) in enumerate(plan):
        m.schedule(KINDS[k], t, item)
    m.run()
    expected = sorted(range(len(plan)), key=lambda i: (plan[i][0], KINDS[plan[i][1]].priority, i))
    assert [item for _, _, item in log] == expected
    assert [t for t, _, _ in log] == sorted(t for t, _ in plan)  # the clock never goes back
    assert all(name == KINDS[plan[item][1]].name for _, name, item in log)  # each to its kind's handler


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=30), st.integers(0, 60))
def test_run_until_handles_the_events_before_it_and_moves_the_meters_to_it(
    times: list[int], until: int
) -> None:
    m = Machine(_noop)
    log = recording(m, (ARRIVE,))
    metered: list[int] = []
    m.meter(metered.append)
    for item, t in enumerate(times):
        m.schedule(ARRIVE, t, item)
    m.run(until)
    assert sorted(t for t, _, _ in log) == sorted(t for t in times if t < until)
    assert m.now == max([until, *(t for t in times if t < until)])
    assert metered[-1] == until and metered == sorted(metered)  # each event's time, then until
    assert len(m.events) == sum(1 for t in times if t >= until)  # the rest wait on the heap
    m.run()  # and a later run handles them
    assert len(log) == len(times)


def test_a_meter_sees_the_time_before_the_clock_moves() -> None:
    m = Machine(_noop)
    m.on(ARRIVE, lambda _i: None)
    seen: list[tuple[int, int]] = []
    m.meter(lambda t: seen.append((m.now, t)))
    for t in (5, 5, 9):
        m.schedule(ARRIVE, t)
    m.run()
    assert seen == [(0, 5), (5, 5), (5, 9)]


def test_one_handler_per_kind_and_no_event_without_one() -> None:
    m = Machine(_noop)
    m.on(ARRIVE, lambda _i: None)
    with pytest.raises(ValueError, match="registered already"):
        m.on(ARRIVE, lambda _i: None)
    with pytest.raises(ValueError, match="registered already"):
        m.on(KICK, lambda _i: None)  # the machine's own
    with pytest.raises(ValueError, match="no handler for 'depart'"):
        m.schedule(DEPART, 3, 1)
    mine = Kind("mine", Priority.DEPARTURE)
    got: list[int] = []
    m.on(mine, got.append)
    m.schedule(ARRIVE, 1, 7)
    m.schedule(mine, 1, 8)  # scheduled later, pops first: its kind's priority
    m.run()
    assert got == [8]


# -------------------------------------------------------------------------------- pending list
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 15), st.integers(0, 3)), max_size=60))
def test_the_pending_list_keeps_retry_order_through_adds_and_removes(
    ops: list[tuple[bool, int, int]],
) -> None:
    p = Pending()
    model: dict[int, tuple[int, int]] = {}  # item -> (priority key, since)
    for now, (add, item, prio) in enumerate(ops):
        if add and item not in model:
            p.add(item, (prio, item), now)
            model[item] = (prio, now)
        elif not add and item in model:
            assert p.remove(item) == model.pop(item)[1]
    assert p.order() == sorted(model, key=lambda i: (model[i][0], i))
    assert len(p) == len(model) and all(i in p for i in model) and bool(p) == bool(model)
    assert all(p.since(i) == model[i][1] for i in model)


def test_the_pending_list_refuses_a_second_add_and_a_key_not_ending_with_the_item() -> None:
    p = Pending()
    p.add(1, (0, 1), 0)
    with pytest.raises(ValueError, match="already pending"):
        p.add(1, (0, 1), 0)
    with pytest.raises(ValueError, match="must end with the item"):
        p.add(2, (0, 3), 0)


# ------------------------------------------------------------------------------------- retries
class Room:
    """A toy use: one resource of ``cap`` units; items of a size arrive, wait and leave."""

    def __init__(
        self,
        cap: int,
        sizes: list[int],
        interval: int | None = None,
        after_tick: Callable[[], None] | None = None,
        patience: int | None = None,
    ) -> None:
        self.cap, self.free, self.sizes, self.patience = cap, cap, sizes, patience
        self.gave_up: list[tuple[int, int]] = []  # (time, item)
        self.popped: list[tuple[int, str]] = []  # (time, kind) of every event
        self.running: set[int] = set()
        self.passes: list[int] = []  # the time of each retry pass
        self.m = Machine(self.retry, retry_interval_s=interval, after_tick=after_tick)
        self.m.on(ARRIVE, self.arrive)
        self.m.on(DEPART, self.depart)
        self.m.on(TIME_OUT, self.time_out)
        self.m.meter(self.log)

    def log(self, t: int) -> None:
        nxt = self.m.events.peek()
        self.popped.append((t, nxt.payload.kind.name if nxt is not None and nxt.time == t else "until"))

    def place(self, i: int) -> bool:
        if self.sizes[i] > self.free:
            return False
        self.free -= self.sizes[i]
        self.running.add(i)
        return True

    def arrive(self, i: int) -> None:
        if not self.place(i):
            self.m.enqueue(i, (i,), None if self.patience is None else self.m.now + self.patience)

    def time_out(self, i: int) -> None:
        if i in self.m.pending:
            self.m.pending.remove(i)
            self.gave_up.append((self.m.now, i))

    def depart(self, i: int) -> None:
        if i in self.running:
            self.running.discard(i)
            self.free += self.sizes[i]
            self.m.wake()
        elif i in self.m.pending:
            self.m.pending.remove(i)

    def retry(self) -> None:
        self.passes.append(self.m.now)
        for i in self.m.pending.order():
            if self.place(i):
                self.m.pending.remove(i)


def test_wakes_in_one_instant_make_one_pass_after_its_departures_and_arrivals() -> None:
    r = Room(2, [1, 1, 2, 1])
    for i, (t0, t1) in enumerate([(0, 10), (0, 10), (1, 50), (10, 30)]):
        r.m.schedule(ARRIVE, t0, i)
        r.m.schedule(DEPART, t1, i)
    r.m.run()
    # at 10 two departures wake the machine and item 3 arrives: one pass, after the arrival
    # (item 3 took a unit at once, so the waiting item 2 (size 2) cannot start before 30)
    assert r.passes == [10, 30]
    assert [k for t, k in r.popped if t == 10] == ["depart", "depart", "arrive", "kick"]  # one kick
    assert r.running == set() and r.free == 2


def test_an_item_enqueued_with_a_give_up_time_times_out_then_unless_placed() -> None:
    r = Room(1, [1, 1, 1], patience=15)
    for i, (t0, t1) in enumerate([(0, 20), (2, 40), (10, 60)]):
        r.m.schedule(ARRIVE, t0, i)
        r.m.schedule(DEPART, t1, i)
    r.m.run()
    # item 1 waits from 2 and gives up at 17; item 2 (from 10, limit 25) starts at 20: its time-out passes
    assert r.gave_up == [(17, 1)] and r.running == set()
    assert [t for t, k in r.popped if k == "time out"] == [17, 25]


def test_no_pass_without_anything_pending_nor_without_room_freed() -> None:
    r = Room(1, [1, 1], interval=5)
    r.m.schedule(ARRIVE, 0, 0)
    r.m.schedule(DEPART, 3, 0)  # nothing waits: no kick
    r.m.schedule(ARRIVE, 4, 1)
    r.m.schedule(DEPART, 100, 1)
    r.m.run()
    assert r.passes == []
    r = Room(1, [1, 2], interval=5)  # item 1 never fits: ticks find nothing freed and skip
    r.m.schedule(ARRIVE, 0, 0)
    r.m.schedule(ARRIVE, 0, 1)
    r.m.schedule(DEPART, 12, 0)
    r.m.schedule(DEPART, 40, 1)
    r.m.run()
    assert r.passes == [12]  # the kick at 12; the ticks at 5, 10, 15, ... pass nothing


def test_a_tick_passes_when_room_was_freed_without_a_kick_and_after_tick_follows_its_pass() -> None:
    seen: list[tuple[int, list[int]]] = []
    r = Room(1, [1, 1], interval=5, after_tick=lambda: seen.append((r.m.now, sorted(r.running))))
    free_quietly = Kind("free quietly", Priority.ARRIVAL)

    def move_out(i: int) -> None:  # room freed as a move frees it: no kick, the next tick retries
        r.running.discard(i)
        r.free += r.sizes[i]
        r.m.dirty = True

    r.m.on(free_quietly, move_out)
    r.m.schedule(ARRIVE, 0, 0)
    r.m.schedule(ARRIVE, 1, 1)  # waits; the tick is armed for 6
    r.m.schedule(free_quietly, 3, 0)
    with pytest.raises(ValueError, match="needs an until"):
        r.m.run()  # only the tick would be left at 3, yet it can change something
    r.m.run(20)
    assert r.passes == [6] and seen == [(6, [1])]  # placed by the tick's pass, then after_tick
    assert not r.m.events  # nothing waits: the tick is not re-armed


def test_the_tick_is_re_armed_while_items_wait_and_dropped_when_none_does() -> None:
    r = Room(1, [1, 1], interval=7)
    r.m.schedule(ARRIVE, 0, 0)
    r.m.schedule(ARRIVE, 1, 1)
    r.m.schedule(TIME_OUT, 30, 1)  # item 1 gives up at 30
    r.m.schedule(DEPART, 100, 0)
    tick_times: list[int] = []
    r.m.meter(lambda t: tick_times.append(t) if r.m.events.peek().payload.kind is TICK else None)  # type: ignore[union-attr]
    r.m.run()
    assert tick_times == [8, 15, 22, 29, 36]  # armed at 1; after 30 nothing waits: the tick at 36 is the last
    assert not r.m.events and r.m.now == 100


def test_run_without_until_stops_when_only_the_tick_is_left() -> None:
    r = Room(1, [1, 2], interval=10)  # item 1 never fits and never leaves
    r.m.schedule(ARRIVE, 0, 0)
    r.m.schedule(ARRIVE, 0, 1)
    r.m.schedule(DEPART, 35, 0)

    def guard(t: int) -> None:
        if t > 1000:
            raise AssertionError("the run goes on with only the tick left")

    r.m.meter(guard)
    r.m.run()
    assert r.m.now == 35 and len(r.m.events) == 1
    assert r.m.events.peek().payload.kind is TICK  # type: ignore[union-attr]
    assert list(r.m.pending) == [1]
    r.m.run(100)  # with an until, the ticks run on to it
    assert r.m.now == 100 and list(r.m.pending) == [1]


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 6),
    st.lists(st.tuples(st.integers(1, 4), st.integers(0, 30), st.integers(1, 30)), min_size=1, max_size=25),
)
def test_after_every_event_the_books_add_up_and_nothing_waiting_fits_once_the_instant_is_retried(
    cap: int, items: list[tuple[int, int, int]]
) -> None:
    """Room freed always leads to a pass at that instant: at the end of every instant nothing
    waiting fits in the room left (no tick here: a lost kick would leave one waiting)."""
    r = Room(cap, [s for s, _, _ in items])
    for i, (_, t, life) in enumerate(items):
        r.m.schedule(ARRIVE, t, i)
        r.m.schedule(DEPART, t + life, i)
    ends: list[tuple[int, int, list[int]]] = []

    def audit() -> None:
        assert r.free + sum(r.sizes[i] for i in r.running) == r.cap
        assert not (r.running & set(r.m.pending))
        nxt = r.m.events.peek()
        if nxt is None or nxt.time > r.m.now:  # the instant is over
            ends.append((r.m.now, r.free, r.m.pending.order()))

    r.m.run(after_event=audit)
    for now, free, waiting in ends:
        assert all(r.sizes[i] > free for i in waiting), (now, free, waiting)
    assert r.free == cap and not r.running and not r.m.pending
