"""Shared test helpers."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest

# Every scheduler the tests start checks its resource accounting after each batch;
# client.check_invariants() reports any violation seen since it started.
os.environ.setdefault("APPORTION_SCHEDULER__VALIDATE", "true")


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
