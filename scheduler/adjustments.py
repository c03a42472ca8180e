"""What the scheduler's hot path must know of seceded runs and of resources changed at
runtime (scheduler/secession.py, scheduler/worker_resources.py), kept in one object that
``SchedulerState.adjusted`` holds only once either happens: until then the class default
``None`` costs the hot path a single check and the instance no attribute (it has 29; at
30 CPython's fast instance-attribute access stops: ~6% more instructions per placement)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from apportion.scheduler.adoption import AdoptionMixin
    from apportion.scheduler.model import WorkerState
    from apportion.scheduler.state import SchedulerState


class Adjustments:
    __slots__ = ("reacquire", "shrunk", "unheld_runs")

    def __init__(self) -> None:
        # Runs that gave their resources back while seceded: not released again at their end.
        self.unheld_runs: set[int] = set()
        # Called first when a worker's resources come free while seceded runs want theirs.
        self.reacquire: Callable[[WorkerState], None] | None = None
        # Workers set below what their runs hold: over their totals until those end.
        self.shrunk: set[WorkerState] = set()


def adjustments(state: SchedulerState | AdoptionMixin) -> Adjustments:
    if state.adjusted is None:
        state.adjusted = Adjustments()
    return state.adjusted
