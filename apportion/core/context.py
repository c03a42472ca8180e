"""What a running task can learn about where it runs: ``get_worker()``."""

from __future__ import annotations

import os
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

    @property
    def cuda_visible_devices(self) -> str:
        """``CUDA_VISIBLE_DEVICES`` naming exactly the GPU units this run holds, for a
        process it starts (see ``visible_devices``). In this process, unit ``i`` is CUDA
        device ``i`` (``cupy.cuda.Device(i)``, ``torch.device(f"cuda:{i}")``)."""
        return visible_devices(self.units.get("GPU", []), os.environ.get("CUDA_VISIBLE_DEVICES"))


def visible_devices(units: list[int], inherited: str | None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value that shows a child process only GPU ``units`` of
    a worker whose own value is ``inherited``: unit ``i`` is the i-th device the worker
    sees, so a worker started with ``CUDA_VISIBLE_DEVICES=2,3`` gives unit 1 as ``3``.
    Empty for no units (a child then sees no GPU)."""
    if inherited is None or not inherited.strip():
        return ",".join(str(unit) for unit in units)
    devices = [device.strip() for device in inherited.split(",") if device.strip()]
    missing = [unit for unit in units if unit >= len(devices)]
    if missing:
        raise ValueError(
            f"GPU units {missing} were granted, but this worker's CUDA_VISIBLE_DEVICES="
            f"{inherited!r} shows only {len(devices)} device(s): declare no more GPU than "
            "the worker can see"
        )
    return ",".join(devices[unit] for unit in units)


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
