"""What every test of real parts (the control plane, helm, later the kubelet) does when a part is
missing: skip on a developer's machine, fail under CI (``$CI`` set), where they must run."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def unavailable(reason: str) -> NoReturn:
    """Skip locally; fail under CI, so that CI can never pass by skipping the real parts."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (failing rather than skipping because $CI is set)", pytrace=False)
    pytest.skip(reason)
