"""Worker: runs tasks within its declared resources, serves results to peers."""

from typing import Any


def __getattr__(name: str) -> Any:
    """``from apportion.worker import Worker``, the process's class (for ``isinstance`` and
    introspection, as Dask's): imported when asked for, not with every module here."""
    if name == "Worker":
        from apportion.worker.server import Worker

        return Worker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
