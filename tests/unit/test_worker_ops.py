"""The registry of worker operations (scheduler/worker_ops.py), on the real network shell's
state machine, without sockets: each message is checked before anything changes."""

from __future__ import annotations

from typing import Any

import pytest
from apportion.scheduler.server import Scheduler
from apportion.scheduler.worker_ops import WORKER_OPS

from apportion.protocol import Message, ProtocolError


def _deliver(server: Scheduler, address: str, message: Message) -> None:
    """As the shell's read loop does: look the op up, check, then handle."""
    op = WORKER_OPS[message["op"]]
    op.check(message)
    op.handle(server, address, message)


@pytest.fixture
def server() -> Scheduler:
    server = Scheduler()
    server.state.add_client("c")
    server.state.add_worker("tcp://w:1", "w", 1, {"GPU": 1})
    server.state.handle_submit("c", [{"key": "t", "func": b"f", "args": b"a", "deps": []}])
    return server


def _run_id(server: Scheduler) -> int:
    (message,) = [m for m in server.state.take_outbox()["tcp://w:1"] if m["op"] == "compute"]
    return int(message["run_id"])


def _books(server: Scheduler) -> tuple[dict[str, Any], dict[str, float]]:
    tasks = {key: (ts.state, ts.run_id) for key, ts in server.state.tasks.items()}
    return tasks, dict(server.state.workers["tcp://w:1"].used)


def test_a_finished_run_reaches_the_state_through_the_registry(server: Scheduler) -> None:
    run_id = _run_id(server)
    _deliver(server, "tcp://w:1", {"op": "task-finished", "run_id": run_id, "nbytes": 8})
    assert server.state.tasks["t"].state == "memory"
    assert server.state.check_invariants() == []


@pytest.mark.parametrize(
    "message",
    [
        {"op": "task-finished", "run_id": "1"},
        {"op": "task-erred", "exception": b""},
        {"op": "task-released", "run_id": None},
        {"op": "missing-deps", "run_id": True},
        {"op": "task-output", "output": "x"},
        {"op": "secede", "run_id": 1.5},
        {"op": "rejoin"},
        {"op": "reacquire", "run_id": "x"},
        {"op": "data-acquired", "key": 3},
        {"op": "acquire-failed"},
        {"op": "run-result", "result": b""},
        {"op": "worker-status", "status": "sleepy"},
        {"op": "worker-status", "status": "paused", "memory": {"rss": "lots"}},
    ],
    ids=lambda m: f"{m['op']}-{len(m)}",
)
def test_a_malformed_worker_message_is_refused_before_any_change(
    server: Scheduler, message: dict[str, Any]
) -> None:
    _run_id(server)
    before = _books(server)
    with pytest.raises(ProtocolError, match=repr(message["op"])):
        _deliver(server, "tcp://w:1", message)
    assert _books(server) == before
    assert server.state.take_outbox() == {}
