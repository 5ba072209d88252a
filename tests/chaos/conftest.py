"""Fixtures of the chaos suite (marker ``chaos``): a control plane per test module, seeded runs.

Each scenario runs once per seed of ``$GPUSCHED_CHAOS_SEEDS`` (``"1"`` by default; ``"1-5"``, ``"1,3,7"``).
``$GPUSCHED_CHAOS_REPORT``: a file that every run appends its numbers to (JSON lines). Without the control
plane binaries the tests skip locally and fail under CI (``$CI`` set), as the e2e tests do.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from chaoslib import ENV_SEEDS, FrontEnd, Run, RunFactory, Workload, parse_seeds

from gpusched.testenv import ControlPlane


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "seed" in metafunc.fixturenames:
        seeds = parse_seeds(os.environ.get(ENV_SEEDS))
        metafunc.parametrize("seed", seeds, ids=[f"seed{s}" for s in seeds])


@pytest.fixture
def chaos_run(request: pytest.FixtureRequest) -> Iterator[RunFactory]:
    """Make a ``Run`` (namespace and kwok nodes created); on teardown its threads and front end are
    stopped and its namespace and nodes deleted, whether the test passed or not. Each finished run's
    numbers go to the test report (the terminal summary prints them)."""
    runs: list[Run] = []

    def make(cp: ControlPlane, scenario: str, seed: int, front: FrontEnd) -> Run:
        run = Run(cp, scenario, seed, front, Workload())
        run.on_report = lambda r: request.node.user_properties.append(("chaos", json.dumps(r)))
        runs.append(run)
        run.setup()
        return run

    try:
        yield make
    finally:
        for run in runs:
            run.cleanup()
