"""Every operation a worker may send the scheduler, in one registry: ``WORKER_OPS`` maps an
``op`` to a ``WorkerOp``, a check of the message (raising ProtocolError: the connection
closes with the reason, and nothing is changed) and a handler carrying it out on the
network shell. As ``client_ops.py`` does for clients.

Two messages are the connection's own and stay in the shell's read loop: ``heartbeat``
(the worker is alive) and ``goodbye`` (it closes the connection).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from apportion.scheduler.state import SchedulerState
from apportion.scheduler.validation import check_id, check_key, check_run_id

from apportion.protocol import Message, ProtocolError

if TYPE_CHECKING:
    from apportion.scheduler.shell import SchedulerShell

Check = Callable[[Message], object]
Handler = Callable[["SchedulerShell", str, Message], None]


class WorkerOp(NamedTuple):
    check: Check  # raises ProtocolError for a malformed message; its result is unused
    handle: Handler  # (the shell, the worker's address, the message)


# ------------------------------------------------------------- a run's end
def _ending_a_run(report: Callable[[SchedulerState, str, Message], None]) -> Handler:
    """A report that ends a run: a seceded or rejoined run ends with it, before the state
    hears of the report."""

    def handle(server: SchedulerShell, address: str, message: Message) -> None:
        secession = server.secession
        if secession.runs or secession.rejoined:
            secession.run_ended(address, message["run_id"])
        report(server.state, address, message)

    return handle


def on_task_output(server: SchedulerShell, address: str, message: Message) -> None:
    server.state.handle_task_output(address, message)


# ------------------------------------------------------ copies (retirement)
def on_data_acquired(server: SchedulerShell, address: str, message: Message) -> None:
    server.state.handle_data_acquired(address, message)


def on_acquire_failed(server: SchedulerShell, address: str, message: Message) -> None:
    server.state.handle_acquire_failed(address, message)


# --------------------------------------------------------------- secession
def on_secede(server: SchedulerShell, address: str, message: Message) -> None:
    server.secession.secede(address, message["run_id"], bool(message.get("release")))


def on_rejoin(server: SchedulerShell, address: str, message: Message) -> None:
    server.secession.rejoin(address, message["run_id"])


def on_reacquire(server: SchedulerShell, address: str, message: Message) -> None:
    server.secession.reacquire(address, message["run_id"])


# ------------------------------------------------------------------ memory
WORKER_STATUSES = ("running", "paused", "closing")


def check_worker_status(message: Message) -> None:
    if message.get("status") not in WORKER_STATUSES:
        raise ProtocolError(
            f"'worker-status' needs 'status', one of {', '.join(WORKER_STATUSES)}, "
            f"not {message.get('status')!r}"
        )
    memory = message.get("memory", {})
    if not isinstance(memory, dict) or not all(
        isinstance(memory.get(name, 0), int) for name in ("rss", "limit")
    ):
        raise ProtocolError(
            f"'worker-status' 'memory' must map 'rss' and 'limit' to bytes, not {memory!r}"
        )


def on_worker_status(server: SchedulerShell, address: str, message: Message) -> None:
    server.state.handle_worker_status(address, message)


# --------------------------------------------------------------- client.run
def on_run_result(server: SchedulerShell, address: str, message: Message) -> None:
    server.on_run_result(address, message)


WORKER_OPS: dict[str, WorkerOp] = {
    "task-finished": WorkerOp(check_run_id, _ending_a_run(SchedulerState.handle_task_finished)),
    "task-erred": WorkerOp(check_run_id, _ending_a_run(SchedulerState.handle_task_erred)),
    "task-released": WorkerOp(check_run_id, _ending_a_run(SchedulerState.handle_task_released)),
    "missing-deps": WorkerOp(check_run_id, _ending_a_run(SchedulerState.handle_missing_deps)),
    "task-output": WorkerOp(check_run_id, on_task_output),
    "data-acquired": WorkerOp(check_key, on_data_acquired),
    "acquire-failed": WorkerOp(check_key, on_acquire_failed),
    "secede": WorkerOp(check_run_id, on_secede),
    "rejoin": WorkerOp(check_run_id, on_rejoin),
    "reacquire": WorkerOp(check_run_id, on_reacquire),
    "run-result": WorkerOp(check_id, on_run_result),
    "worker-status": WorkerOp(check_worker_status, on_worker_status),
}

__all__ = ["WORKER_OPS", "WorkerOp"]
