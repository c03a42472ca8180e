"""One adapter per system. Each module offers the same four functions:

``version()``, ``session(seed: bool)`` (a context manager yielding a workloads.Session on a
freshly started 4-worker cluster, torn down on exit), ``cold_start()`` (start a 4-worker
cluster and a client, run one task, tear down) and ``scheduler_only(sizes)``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

SYSTEMS = ("apportion", "dask", "ray")


def adapter(system: str) -> ModuleType:
    if system not in SYSTEMS:
        raise ValueError(f"unknown system {system!r}; choose from {', '.join(SYSTEMS)}")
    return importlib.import_module(f"benchmarks.systems.{system}_")


def available(system: str) -> bool:
    """Whether the system's package is installed (peers are optional)."""
    module = {"apportion": "apportion", "dask": "distributed", "ray": "ray"}[system]
    return importlib.util.find_spec(module) is not None
