"""Ray adapter: one local Ray node with 4 CPUs (4 single-threaded worker processes).

Ray has one node here, so the seed pipeline's heterogeneous workers are emulated with
node-level custom resources: ``GPU`` becomes the custom resource ``bench_GPU`` (4 = 2+2,
so no real GPU devices are needed or claimed) and ``MEMORY`` stays ``MEMORY`` (100e9).
Every task also takes ``num_cpus=1``. Unlike apportion and dask, Ray pools the node's
resources, so a GPU task may run in any of the 4 worker processes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import ray

from benchmarks.workloads import N_WORKERS, SEED_WORKERS, Sizes

RENAME = {"GPU": "bench_GPU"}


def version() -> str:
    return ray.__version__


class RaySession:
    # Its object store is shared memory: workers of one host always read results there.
    SHARES_MEMORY = True

    def __init__(self) -> None:
        self._remotes: dict[tuple[Any, ...], Any] = {}

    def _remote(self, func: Callable[..., Any], resources: dict[str, float] | None) -> Any:
        key = (func, tuple(sorted((resources or {}).items())))
        remote = self._remotes.get(key)
        if remote is None:
            custom = {RENAME.get(k, k): v for k, v in (resources or {}).items()}
            remote = ray.remote(num_cpus=1, resources=custom or None)(func)
            self._remotes[key] = remote
        return remote

    def submit(
        self, func: Callable[..., Any], *args: Any, resources: dict[str, float] | None = None
    ) -> Any:
        return self._remote(func, resources).remote(*args)

    def map(
        self,
        func: Callable[..., Any],
        xs: Sequence[Any],
        resources: dict[str, float] | None = None,
    ) -> list[Any]:
        remote = self._remote(func, resources)
        return [remote.remote(x) for x in xs]

    def gather(self, futures: list[Any]) -> list[Any]:
        return ray.get(futures)

    def result(self, future: Any) -> Any:
        return ray.get(future)


def _node_resources(seed: bool) -> dict[str, float]:
    if not seed:
        return {}
    total: dict[str, float] = {}
    for worker in SEED_WORKERS:
        for name, amount in worker["resources"].items():
            key = RENAME.get(name, name)
            total[key] = total.get(key, 0) + amount
    return total


@contextmanager
def session(seed: bool) -> Iterator[RaySession]:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        num_cpus=N_WORKERS,
        resources=_node_resources(seed) or None,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        yield RaySession()
    finally:
        ray.shutdown()


def scheduler_only(sizes: Sizes) -> dict[str, float] | None:
    """Ray's scheduler lives in C++ (raylet/GCS); no in-process equivalent; n/a."""
    return None
