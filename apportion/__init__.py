"""apportion: resource-aware distributed task scheduling.

>>> from apportion import Client, LocalCluster
>>> with LocalCluster(workers=[{"resources": {"GPU": 2}}]) as cluster, Client(cluster) as client:
...     client.submit(pow, 2, 10, resources={"GPU": 1}).result()
1024
"""

from apportion import config
from apportion.actors import Actor, ActorFuture
from apportion.annotations import annotate
from apportion.client import Client, NoWorkerWarning, QuotaWarning, WorkerPausedWarning
from apportion.coordination import Event, Lock, Queue, Semaphore, Variable
from apportion.core.context import TaskInfo, WorkerInfo, get_worker
from apportion.data import fire_and_forget
from apportion.errors import (
    CancelledError,
    InputLoadError,
    KilledWorkerError,
    NoValidWorkerError,
    Reschedule,
    ResourceDeadlockError,
    SchedulerConnectionError,
    TaskTimeoutError,
)
from apportion.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, as_completed, futures_of, wait
from apportion.import_hooks import after_import
from apportion.local import LocalCluster
from apportion.performance_report import TaskStream as get_task_stream
from apportion.performance_report import performance_report
from apportion.placement_group import PlacementGroup
from apportion.progress import progress
from apportion.ssh import SSHCluster
from apportion.worker_client import get_client, rejoin, secede, worker_client

__version__ = "0.1.0"


def _register_joblib_backend() -> None:
    from apportion.joblib_backend import register

    register()


# joblib.parallel_backend("dask") runs on apportion, as with dask.distributed.
after_import("joblib", _register_joblib_backend)

__all__ = [
    "ALL_COMPLETED",
    "FIRST_COMPLETED",
    "Actor",
    "ActorFuture",
    "CancelledError",
    "Client",
    "Event",
    "Future",
    "InputLoadError",
    "KilledWorkerError",
    "LocalCluster",
    "Lock",
    "NoValidWorkerError",
    "NoWorkerWarning",
    "PlacementGroup",
    "Queue",
    "QuotaWarning",
    "Reschedule",
    "ResourceDeadlockError",
    "SSHCluster",
    "SchedulerConnectionError",
    "Semaphore",
    "TaskInfo",
    "TaskTimeoutError",
    "Variable",
    "WorkerInfo",
    "WorkerPausedWarning",
    "annotate",
    "as_completed",
    "config",
    "fire_and_forget",
    "futures_of",
    "get_client",
    "get_task_stream",
    "get_worker",
    "performance_report",
    "progress",
    "rejoin",
    "secede",
    "wait",
    "worker_client",
]
