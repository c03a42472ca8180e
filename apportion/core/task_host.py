"""What the worker process running a task offers the task's code, registered by the worker
(the client library calls it without importing the worker): ``secede()``, ``rejoin()``,
and the scheduler that ``get_client()`` connects to. And the other way round: the clients
that tasks made, closed by the worker before it stops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class TaskHost(Protocol):
    """The worker side of ``secede()``, ``rejoin()`` and ``get_client()``; each raises
    ValueError when the calling thread runs no task."""

    def scheduler(self) -> tuple[str, str | None]:
        """The address of the scheduler of the worker running this task, and its token."""
        ...

    def secede(self, release_resources: bool) -> None:
        """Give this task's thread (and with ``release_resources`` its resources) back."""
        ...

    def rejoin(self) -> None:
        """Take a thread (and released resources) again, waiting until they are free."""
        ...


_host: TaskHost | None = None
_closers: list[Callable[[], None]] = []
# Whether a worker runs in this process (importing the worker's code is not enough: a
# client's program may import it to look at its classes).
_worker_started = False


def worker_started() -> None:
    """Called by a worker as it starts."""
    global _worker_started
    _worker_started = True


def in_a_worker() -> bool:
    """Whether this process runs a worker: its own threads (event loop, spill) then see
    the values of tasks, which must not act on them as a client's program would."""
    return _worker_started


def set_task_host(host: TaskHost | None) -> None:
    """Called by the worker: the host of the tasks of this process."""
    global _host
    _host = host


def task_host() -> TaskHost:
    if _host is None:
        raise ValueError(
            "secede(), rejoin(), get_client() and worker_client() work only inside a task "
            "running on an apportion worker"
        )
    return _host


def on_close_clients(closer: Callable[[], None]) -> None:
    """Called by the client library: ``closer`` closes the clients tasks made here."""
    if closer not in _closers:
        _closers.append(closer)


def close_clients() -> None:
    """Called by a stopping worker: close the clients its tasks made (what they still
    wanted is released before the worker leaves)."""
    for closer in list(_closers):
        closer()
