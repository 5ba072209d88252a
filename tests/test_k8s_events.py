"""The event recorder's PodScheduled=False write against a fake API: it carries the pod's
resourceVersion, and a conflict is settled by reading the pod again (``k8s/events.py``). The same
against the real apiserver is ``tests/e2e/test_standalone.py``."""

from __future__ import annotations

from typing import Any
from unittest import mock

import orjson
import pytest
from kubernetes.client.exceptions import ApiException

from gpusched.k8s.events import EventRecorder

POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7"}, "spec": {}}


def _read(obj: dict[str, Any] | None) -> Any:
    if obj is None:
        return mock.Mock(side_effect=ApiException(status=404))
    return mock.Mock(return_value=mock.Mock(data=orjson.dumps(obj)))


def _send(core: mock.Mock) -> EventRecorder:
    rec = EventRecorder(core, workers=1)
    rec.failed(POD, "0/3 nodes are available.")
    rec.flush()
    rec.stop()
    return rec


def _versions(core: mock.Mock) -> list[str]:
    return [c.args[2]["metadata"]["resourceVersion"] for c in core.patch_namespaced_pod_status.call_args_list]


def test_the_condition_carries_the_version_the_scheduler_saw() -> None:
    core = mock.Mock()
    rec = _send(core)
    assert _versions(core) == ["7"]
    (cond,) = core.patch_namespaced_pod_status.call_args.args[2]["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("PodScheduled", "False", "Unschedulable")
    assert (rec.counts()["stale"], rec.counts()["failed"]) == (0, 0)


@pytest.mark.parametrize(
    "now",
    [
        {"metadata": {"uid": "u1", "resourceVersion": "9"}, "spec": {"nodeName": "n1"}},  # bound meanwhile
        {"metadata": {"uid": "u2", "resourceVersion": "9"}, "spec": {}},  # a new pod under the name
        None,  # deleted
    ],
    ids=["bound", "replaced", "deleted"],
)
def test_a_conflict_with_a_pod_that_no_longer_waits_drops_the_write(now: dict[str, Any] | None) -> None:
    core = mock.Mock()
    core.patch_namespaced_pod_status.side_effect = ApiException(status=409)
    core.read_namespaced_pod = _read(now)
    rec = _send(core)
    assert _versions(core) == ["7"]
    assert (rec.counts()["stale"], rec.counts()["failed"]) == (1, 0)


def test_a_conflict_with_a_pod_still_waiting_is_sent_once_more_at_its_new_version() -> None:
    core = mock.Mock()
    core.patch_namespaced_pod_status.side_effect = [ApiException(status=409), mock.Mock()]
    core.read_namespaced_pod = _read({"metadata": {"uid": "u1", "resourceVersion": "9"}, "spec": {}})
    rec = _send(core)
    assert _versions(core) == ["7", "9"]
    assert (rec.counts()["stale"], rec.counts()["failed"]) == (0, 0)


def test_a_deleted_pod_or_a_second_conflict_is_not_retried() -> None:
    core = mock.Mock()
    core.patch_namespaced_pod_status.side_effect = ApiException(status=404)
    assert (_send(core).counts()["stale"], len(_versions(core))) == (1, 1)
    core = mock.Mock()
    core.patch_namespaced_pod_status.side_effect = ApiException(status=409)
    core.read_namespaced_pod = _read({"metadata": {"uid": "u1", "resourceVersion": "9"}, "spec": {}})
    rec = _send(core)
    assert _versions(core) == ["7", "9"]
    assert (rec.counts()["stale"], rec.counts()["failed"]) == (0, 1)


def test_events_are_sent_once_per_message_and_the_memory_of_them_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gpusched.k8s.events as events

    monkeypatch.setattr(events, "_DEDUP_MAX", 3)
    rec = EventRecorder(mock.Mock(), workers=1)
    try:
        groups = [{"kind": "PodGroup", "name": f"g{i}", "namespace": "ns", "uid": f"g{i}"} for i in range(5)]
        assert [rec.about(g, "Warning", "GangWaiting", "waits") for g in groups] == [True] * 5
        assert len(rec._seen) == 3  # the newest kept
        assert not rec.about(groups[4], "Warning", "GangWaiting", "waits")  # the same news: once
        assert rec.about(groups[4], "Warning", "GangWaiting", "waits longer")
        assert rec.about(groups[0], "Warning", "GangWaiting", "waits")  # forgotten: news again
        assert rec.failed(POD, "0/3 nodes are available.", condition=False)
        assert not rec.failed(POD, "0/3 nodes are available.", condition=False)
        assert len(rec._seen) == 3  # pods and groups together
    finally:
        rec.stop()


def test_a_new_message_keeps_the_time_the_pod_became_unschedulable() -> None:
    waiting = {
        **POD,
        "status": {
            "conditions": [
                {"type": "Ready", "status": "False", "lastTransitionTime": "2026-12-06T00:00:00Z"},
                {"type": "PodScheduled", "status": "False", "lastTransitionTime": "2026-12-06T00:00:05Z"},
            ]
        },
    }
    fresh = {**POD, "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}
    core = mock.Mock()
    rec = EventRecorder(core, workers=1)
    try:
        rec.failed(waiting, "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
        rec.failed(fresh, "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.")
        rec.flush()
    finally:
        rec.stop()
    times = [
        c.args[2]["status"]["conditions"][0]["lastTransitionTime"]
        for c in core.patch_namespaced_pod_status.call_args_list
    ]
    assert times[0] == "2026-12-06T00:00:05Z" and times[1] > "2026-12-06T00:00:05Z"
