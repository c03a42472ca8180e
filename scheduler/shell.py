"""What the client and worker operations, the HTTP routes and ``/metrics`` use of the
scheduler's network shell (``server.Scheduler``), as a protocol: they need not import
server.py, which imports them."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from apportion.protocol import Comm, Message

if TYPE_CHECKING:
    from apportion.scheduler.coordination import Coordination
    from apportion.scheduler.secession import Secession
    from apportion.scheduler.state import SchedulerState


class SchedulerShell(Protocol):
    """The network shell as its operations and HTTP routes see it."""

    state: SchedulerState
    secession: Secession
    coordination: Coordination
    address: str
    token: str | None
    http_port: int | None
    stopped: asyncio.Event
    comms: dict[str, Comm]
    # client.upload_file: a message per file, for workers that join later.
    uploads: dict[str, Message]
    # Invariant violations seen while validating every batch (scheduler.validate).
    violations: list[str]
    # Client retire requests (client, id) whose retired workers are then told to close.
    close_when_retired: set[tuple[str, Any]]
    # Names of workers about to be stopped on purpose: their end is logged as planned.
    planned_leaves: set[str]

    def flush(self) -> None: ...

    def broadcast(self, client: str, reply_id: Any, fields: Message, op: str = "run") -> None: ...

    def on_run_result(self, address: str, message: Message, run: Any = None) -> None: ...

    async def retire_workers(self, names: list[str], count: int | None) -> dict[str, Any]: ...
