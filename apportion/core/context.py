"""What a running task can learn about where it runs: ``get_worker()``."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TaskInfo:
    """The running task: its key, the resources granted and, for whole-number
    resources, the unit indices it holds (``{"GPU": [1]}``), and which run of the key
    this is: ``attempt`` is 1 for the first, and rises each time the scheduler places the
    key again (its worker lost, a retry). A run that knows its attempt can fence its side
    effects (write to a path named after it, say): a superseded run may still be running."""

    key: str
    resources: dict[str, float] = field(default_factory=dict)
    units: dict[str, list[int]] = field(default_factory=dict)
    attempt: int = 1


@dataclass(frozen=True)
class WorkerInfo:
    name: str
    address: str
    nthreads: int
    resources: dict[str, float]
    scheduler_address: str
    task: TaskInfo | None = None


_local = threading.local()


def get_worker() -> WorkerInfo:
    """The worker running the current task (only inside a task or ``client.run``)."""
    info = getattr(_local, "worker", None)
    if info is None:
        raise ValueError("get_worker() works only inside a task or a client.run function")
    return info


def set_current(info: WorkerInfo | None) -> None:
    _local.worker = info


def current_task_key() -> str | None:
    """The key of the task this thread runs (None outside tasks): the parent of what its
    client submits (see scheduler/secession.py)."""
    info = getattr(_local, "worker", None)
    return None if info is None or info.task is None else info.task.key
