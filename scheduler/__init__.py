"""Scheduler: task state machine, placement, resource accounting, network shell."""

from typing import Any


def __getattr__(name: str) -> Any:
    """``from apportion.scheduler import Scheduler``, the process's class (for ``isinstance`` and
    introspection, as Dask's): imported when asked for, not with every module here."""
    if name == "Scheduler":
        from apportion.scheduler.server import Scheduler

        return Scheduler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
