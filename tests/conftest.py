"""Shared test helpers."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_until(predicate: Callable[[], object], timeout: float = 30.0, what: str = "") -> object:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(delay)  # polling a condition, not synchronising on time
        delay = min(delay * 2, 0.1)
