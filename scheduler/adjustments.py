"""What the scheduler's hot path must know of seceded runs and of resources changed at
runtime (scheduler/secession.py, scheduler/worker_resources.py), kept in one object that
``SchedulerState.adjusted`` holds only once either happens: until then the hot path pays
a single ``is None`` check for all of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from apportion.scheduler.model import WorkerState


class Adjustments:
    __slots__ = ("reacquire", "shrunk", "unheld_runs")

    def __init__(self) -> None:
        # Runs that gave their resources back while seceded: not released again at their end.
        self.unheld_runs: set[int] = set()
        # Called first when a worker's resources come free while seceded runs want theirs.
        self.reacquire: Callable[[WorkerState], None] | None = None
        # Workers set below what their runs hold: over their totals until those end.
        self.shrunk: set[WorkerState] = set()


class Adjustable(Protocol):
    adjusted: Adjustments | None


def adjustments(state: Adjustable) -> Adjustments:
    """The state's adjustments, made on first use."""
    if state.adjusted is None:
        state.adjusted = Adjustments()
    return state.adjusted
