"""Seceding on the worker, the task thread's side: which run this thread runs, and
``secede()`` / ``rejoin()`` for it.

What seceding means for the worker's books (threads, resources, the scheduler's grant) is
decided by its state machine (``WorkerState.secede``, ``rejoin``, ``reacquired`` in
worker/state.py); the worker process carries it out (``Worker.secede_run``,
``Worker.rejoin_run`` in worker/server.py). This module only finds the run of the calling
thread.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

from apportion.core.task_host import set_task_host

if TYPE_CHECKING:
    from apportion.worker.state import WorkerTask


class Worker(Protocol):
    """What a task thread needs of the worker process running it (worker/server.py's
    Worker, which imports this module: typed here by what is used, not by import)."""

    scheduler_address: str
    token: str | None

    def secede_run(self, task: WorkerTask, release: bool) -> None: ...

    def rejoin_run(self, task: WorkerTask) -> None: ...


def secede(release_resources: bool = False) -> None:
    """Give this task's thread back to the worker (another task may start in its place);
    with ``release_resources`` its resources too, until ``rejoin()``."""
    worker, task = running()
    worker.secede_run(task, release_resources)


def rejoin() -> None:
    """Take a thread again (and released resources), waiting until they are free."""
    worker, task = running()
    worker.rejoin_run(task)


# ------------------------------------------------------------------ the task thread side
_here = threading.local()


def set_running(worker: Worker | None, task: WorkerTask | None) -> None:
    _here.worker = worker
    _here.task = task


def running() -> tuple[Worker, WorkerTask]:
    worker = getattr(_here, "worker", None)
    task = getattr(_here, "task", None)
    if worker is None or task is None:
        raise ValueError(
            "secede(), rejoin(), get_client() and worker_client() work only inside a task "
            "running on an apportion worker"
        )
    return worker, task


def current_key() -> str | None:
    """The key of the task this thread runs, or None outside tasks."""
    task = getattr(_here, "task", None)
    return None if task is None else task.key


def left_pool() -> bool:
    """Whether this task thread seceded (a replacement thread took its place in the pool)."""
    return bool(getattr(_here, "left_pool", False))


def mark_left_pool(value: bool) -> None:
    _here.left_pool = value


class _TaskHost:
    """The worker side of ``secede()``, ``rejoin()`` and ``get_client()`` for the task
    threads of this process (see apportion/core/task_host.py)."""

    def scheduler(self) -> tuple[str, str | None]:
        worker, _ = running()
        return worker.scheduler_address, worker.token

    def secede(self, release_resources: bool) -> None:
        secede(release_resources)

    def rejoin(self) -> None:
        rejoin()


set_task_host(_TaskHost())
