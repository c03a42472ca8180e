"""Records of what the scheduler saw happen that clients read too (the task stream)."""

from __future__ import annotations

from typing import NamedTuple

from apportion.core.keys import key_prefix


class TaskRun(NamedTuple):
    """One run that ended: ``state`` is ``memory`` (finished) or ``erred``; times are
    the worker's wall clock (seconds since the epoch)."""

    key: str
    worker: str
    state: str
    start: float
    stop: float
    units: dict[str, list[int]]

    @property
    def prefix(self) -> str:
        return key_prefix(self.key)
