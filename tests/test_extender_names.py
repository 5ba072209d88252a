"""The extender's request name lists → snapshot indices (``Evaluator._by_name``): whatever the
lists, repeated or not, each maps exactly as a fresh lookup would; a list sent again is found
without a second lookup; the kept lists stay within their bounds; malformed lists are refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.extender import evaluate
from gpusched.extender.evaluate import KEPT_LISTS, Evaluator
from gpusched.extender.protocol import BadRequest, LimitExceeded
from gpusched.extender.serve import build_profile
from gpusched.k8s.state import LiveCluster
from test_extender_handlers import node

NAMES = [f"n{i}" for i in range(12)]


def evaluator() -> Evaluator:
    live = LiveCluster()
    for n in NAMES:
        live.upsert_node(node(n, gpus=1))
    return Evaluator(live, build_profile("bestfit"))


names = st.lists(st.sampled_from([*NAMES, "ghost", "n99"]), max_size=14)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(names, st.integers(min_value=0, max_value=30)), min_size=1, max_size=40))
def test_every_list_maps_as_a_fresh_lookup_and_repeats_are_found(steps: list[list[str] | int]) -> None:
    ev = evaluator()
    sent: list[list[str]] = []
    with ev.cluster.live_books() as snap:
        for step in steps:
            # an int sends again (as a new list, as a new request's JSON would) an earlier list
            lst = list(sent[step % len(sent)]) if isinstance(step, int) and sent else step
            if isinstance(lst, int):
                continue
            kept = {id(hit): sl for sl, hit in ev._lists}
            got = ev._by_name(snap, lst)
            want = [(p, snap.index[n]) for p, n in enumerate(lst) if n in snap.index]
            assert list(zip(got.pos.tolist(), got.idx.tolist(), strict=True)) == want
            if any(sl == lst for sl in kept.values()):
                assert id(got) in kept, "a list kept was looked up again"
            assert len(ev._lists) <= KEPT_LISTS and ev._cached == sum(len(sl) for sl, _ in ev._lists)
            sent.append(lst)


def test_the_kept_names_are_bounded_by_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evaluate, "CACHED_NAMES", 5)
    ev = evaluator()
    with ev.cluster.live_books() as snap:
        for k in range(1, 5):
            ev._by_name(snap, NAMES[:k])
        assert ev._cached <= 5 and [len(sl) for sl, _ in ev._lists] == [4]
        ev._by_name(snap, NAMES[:6])  # over the bound: looked up, not kept
        assert [len(sl) for sl, _ in ev._lists] == [4]


@pytest.mark.parametrize(
    ("sent", "error"),
    [
        (["n1", 7], BadRequest),
        (["n1", None], BadRequest),
        (["n1", ["n2"]], BadRequest),  # unhashable
        (["n1", {"a": 1}], BadRequest),
        (["n1", "x" * 300], LimitExceeded),
    ],
)
def test_malformed_lists_are_refused_even_after_a_good_one(
    sent: list[object], error: type[Exception]
) -> None:
    ev = evaluator()
    with ev.cluster.live_books() as snap:
        ev._by_name(snap, ["n1", "n2"])
        with pytest.raises(error):
            ev._by_name(snap, sent)  # type: ignore[arg-type]


def test_a_new_snapshot_drops_the_kept_lists() -> None:
    ev = evaluator()
    with ev.cluster.live_books() as snap:
        first = ev._by_name(snap, ["n3", "n1"])
    ev.cluster.upsert_node(node("n0b", gpus=1))  # a new node: the next snapshot is rebuilt
    with ev.cluster.live_books() as snap2:
        assert snap2 is not snap
        again = ev._by_name(snap2, ["n3", "n1"])
        assert again is not first
        assert again.idx.tolist() == [snap2.index["n3"], snap2.index["n1"]]
        assert np.array_equal(again.pos, [0, 1])


def test_the_latest_lists_are_kept_and_a_hit_moves_to_the_front() -> None:
    ev = evaluator()
    lists = [[NAMES[i % 12], NAMES[(i + 1) % 12], f"x{i}"] for i in range(KEPT_LISTS + 4)]
    with ev.cluster.live_books() as snap:
        hits = [ev._by_name(snap, lst) for lst in lists]
        assert [sl for sl, _ in ev._lists] == lists[::-1][:KEPT_LISTS]
        oldest_kept = lists[-KEPT_LISTS]
        assert ev._by_name(snap, list(oldest_kept)) is hits[-KEPT_LISTS]
        assert ev._lists[0][0] == oldest_kept
        assert ev._by_name(snap, list(lists[0])) is not hits[0]  # dropped: looked up again


def test_a_list_changed_by_its_sender_after_the_lookup_is_not_found_as_it_was() -> None:
    ev = evaluator()
    with ev.cluster.live_books() as snap:
        sent = ["n1", "n2"]
        first = ev._by_name(snap, sent)
        sent[1] = "n3"  # the same list object, changed
        again = ev._by_name(snap, sent)
        assert again is not first and again.idx.tolist() == [snap.index["n1"], snap.index["n3"]]
