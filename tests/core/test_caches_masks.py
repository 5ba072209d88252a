"""``SnapshotCaches.node_mask``: a mask asks each node once per snapshot; after relabels, only
the nodes relabelled since it was last read, and the answer is always what asking every node
now would give (through a log that outgrows its bound too); masks handed out before stay."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.caches import SnapshotCaches

SIZE = 6


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, SIZE - 1), st.booleans(), st.booleans()), max_size=120))
def test_a_mask_always_answers_as_asking_every_node_would(steps: list[tuple[int, bool, bool]]) -> None:
    caches = SnapshotCaches()
    truth = [True] * SIZE
    asked: list[int] = []

    def passes(n: int) -> bool:
        asked.append(n)
        return truth[n]

    handed: list[tuple[object, list[bool]]] = []
    for node, value, read in steps:
        truth[node] = value
        caches.labels_changed(node, SIZE)
        if read:
            asked.clear()
            before = len(caches.relabelled)
            mask = caches.node_mask("k", SIZE, passes)
            assert (mask is None) == all(truth)
            if mask is not None:
                assert mask.tolist() == truth and not mask.flags.writeable
                handed.append((mask, list(truth)))
            assert len(asked) <= SIZE and (before == 0 or len(set(asked)) == len(asked))
    for mask, then in handed:
        assert mask.tolist() == then  # never changed under its holder


def test_only_the_relabelled_nodes_are_asked_again() -> None:
    caches = SnapshotCaches()
    asked: list[int] = []

    def passes(n: int) -> bool:
        asked.append(n)
        return n != 3

    caches.node_mask("k", 1000, passes)
    assert len(asked) == 1000
    asked.clear()
    caches.node_mask("k", 1000, passes)
    assert asked == []
    for n in (5, 7, 5):
        caches.labels_changed(n, 1000)
    caches.node_mask("k", 1000, passes)
    assert sorted(asked) == [5, 7]


def test_a_long_log_is_dropped_with_the_masks() -> None:
    caches = SnapshotCaches()
    caches.node_mask("k", 20, lambda n: True)
    for i in range(4 * 20 + 1):
        caches.labels_changed(i % 20, 20)
    assert len(caches.masks) == 0 and caches.relabelled == []
