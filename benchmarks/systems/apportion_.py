"""apportion adapter: LocalCluster (one scheduler process, worker processes) on 127.0.0.1."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

os.environ.setdefault("APPORTION_LOG_LEVEL", "WARNING")

import apportion
from apportion import Client, LocalCluster
from benchmarks.systems.futures_session import FuturesSession
from benchmarks.workloads import N_WORKERS, SEED_WORKERS, Sizes

# Dask collections run through the client (benchmarks/dask_workloads.py).
COMPUTES_DASK_COLLECTIONS = True


def version() -> str:
    return getattr(apportion, "__version__", "dev")


ApportionSession = FuturesSession


def _cluster(seed: bool) -> LocalCluster:
    if seed:
        return LocalCluster(workers=SEED_WORKERS, host="127.0.0.1")
    return LocalCluster(n_workers=N_WORKERS, threads_per_worker=1, host="127.0.0.1")


@contextmanager
def session(seed: bool) -> Iterator[ApportionSession]:
    with _cluster(seed) as cluster, Client(cluster) as client:
        client.wait_for_workers(N_WORKERS, timeout=60)
        yield ApportionSession(client)


def scheduler_only(sizes: Sizes) -> dict[str, float]:
    from benchmarks.scheduler_only import run_apportion

    return run_apportion(sizes)
