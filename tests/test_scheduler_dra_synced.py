"""The standalone scheduler decides nothing before its DRA informers have listed: a claim pod decided
earlier is refused "waiting for the DRA informers" and then waits for a retry (found by
``gpusched bench dra``: a whole stream of claim pods refused at start-up and left pending)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from kubernetes import client

from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler


def _listed(done: bool) -> SimpleNamespace:
    ev = threading.Event()
    if done:
        ev.set()
    return SimpleNamespace(synced=ev, stop=lambda *_a, **_k: None)


def test_the_scheduler_is_synced_only_once_the_dra_informers_have_listed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = StandaloneScheduler(client.ApiClient(), SchedulerConfig())
    try:
        monkeypatch.setattr(s, "_reflectors", [_listed(True)])
        monkeypatch.setattr(s.gangs.groups, "synced", lambda: True)
        monkeypatch.setattr(s.tenants.directory, "ready", lambda: True)
        dra = [_listed(True), _listed(False)]
        monkeypatch.setattr(s.claims, "_reflectors", dra)
        assert not s.synced() and not s.wait_synced(0.05)
        dra[1].synced.set()
        assert s.synced()
    finally:
        s.stop(0.1)
