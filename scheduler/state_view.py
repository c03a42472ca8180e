"""The narrow public face of ``SchedulerState`` that the modules extending it (secession,
worker resources, restart, stored arguments, replication) work through, as a protocol:
none of them calls the state's private methods, and none needs to import state.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from apportion.protocol import Message
from apportion.resources import Shape

if TYPE_CHECKING:
    from apportion.scheduler.adjustments import Adjustments
    from apportion.scheduler.model import TaskState, WorkerState


class StateView(Protocol):
    """Read the records; change them only through these methods."""

    tasks: dict[str, TaskState]
    workers: dict[str, WorkerState]
    fitting: dict[Shape, set[WorkerState]]
    with_slots: dict[WorkerState, None]
    # Seceded runs and resources set at runtime (see adjustments.py).
    adjusted: Adjustments | None

    def send(self, dest: str, message: Message) -> None: ...

    def offer_slots(self, ws: WorkerState) -> None: ...

    def fail(self, ts: TaskState, exc: BaseException) -> None: ...

    def release_if_unneeded(self, ts: TaskState) -> None: ...

    def redefine(self, ts: TaskState, func: bytes, args: bytes, shape: Shape, why: str) -> None: ...

    def refit(self, ws: WorkerState, why: str) -> None: ...

    def hold_without_run(self, ts: TaskState, ws: WorkerState, nbytes: int, why: str) -> None: ...
