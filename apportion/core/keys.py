"""How task keys are named: ``name-token`` (``inc-5f3a...``), read the same way by the
client (progress bars, reports) and the scheduler (dashboard, metrics)."""

from __future__ import annotations


def key_prefix(key: str) -> str:
    """The task name a key starts with: ``inc`` for ``inc-5f3a...`` (keys are
    ``name-token``); the whole key when it has no ``-``."""
    return key.rpartition("-")[0] or key
