"""apportion adapter: LocalCluster (one scheduler process, worker processes) on 127.0.0.1."""

from __future__ import annotations

import http.cookiejar
import os
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

os.environ.setdefault("APPORTION_LOG_LEVEL", "WARNING")

import apportion
from apportion import Client, LocalCluster, config
from benchmarks.systems.futures_session import FuturesSession
from benchmarks.tls import Certificates
from benchmarks.workloads import (
    N_WORKERS,
    SEED_WORKERS,
    Sizes,
    fetch_seconds_here,
    share_memory_here,
)

# Dask collections run through the client (benchmarks/dask_workloads.py).
COMPUTES_DASK_COLLECTIONS = True
SUPPORTS_TLS = True


def version() -> str:
    return getattr(apportion, "__version__", "dev")


class ApportionSession(FuturesSession):
    def share_memory(self, on: bool) -> None:
        """Workers of this host hand each other large results through shared memory, or
        not (the data workload measures both paths on one cluster)."""
        self.client.run(share_memory_here, on)

    def fetch_seconds(self) -> float:
        """The seconds all workers spent on fetches over TCP so far, each from its request
        to its reply (the data workload's transfer alone, beside its whole row)."""
        return sum(self.client.run(fetch_seconds_here).values())


# APPORTION_BENCH_DASHBOARD=1: the scheduler serves HTTP and a dashboard page is open
# (reading its pushed updates) for the whole run, to measure what watching costs.
DASHBOARD = os.environ.get("APPORTION_BENCH_DASHBOARD") == "1"


def _cluster(seed: bool) -> LocalCluster:
    http_port = 0 if DASHBOARD else None
    if seed:
        return LocalCluster(workers=SEED_WORKERS, host="127.0.0.1", http_port=http_port)
    return LocalCluster(
        n_workers=N_WORKERS, threads_per_worker=1, host="127.0.0.1", http_port=http_port
    )


@contextmanager
def _dashboard_open(cluster: LocalCluster) -> Iterator[None]:
    """A browser's share of the work: sign in, then read the stream of updates."""
    browser = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    link = cluster.dashboard_link
    assert link is not None
    browser.open(link).read()
    stream = browser.open(link.split("?")[0] + "/events")
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set() and stream.readline():
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield
    finally:
        stop.set()
        stream.close()


def _tls_settings(tls: Certificates | None) -> dict[str, str]:
    """Mutual TLS on every connection (the scheduler's, the workers', the client's)."""
    if tls is None:
        return {}
    return {
        "comm.tls.ca-file": tls.ca,
        "comm.tls.cert-file": tls.cert,
        "comm.tls.key-file": tls.key,
    }


@contextmanager
def session(seed: bool, tls: Certificates | None = None) -> Iterator[ApportionSession]:
    with config.set(_tls_settings(tls)), _cluster(seed) as cluster, Client(cluster) as client:
        client.wait_for_workers(N_WORKERS, timeout=60)
        with _dashboard_open(cluster) if DASHBOARD else nullcontext():
            yield ApportionSession(client)


def scheduler_only(sizes: Sizes) -> dict[str, float]:
    from benchmarks.scheduler_only import run_apportion

    return run_apportion(sizes)
