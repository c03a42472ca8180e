"""dask.distributed adapter: a SpecCluster of Nannies (worker processes, one thread each).

Resources are dask's own abstract worker resources (``resources={"GPU": 2}``), which is
the closest match to apportion's model.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import distributed
from distributed import Client, Nanny, Scheduler, SpecCluster
from distributed.security import Security

from benchmarks.systems.futures_session import FuturesSession
from benchmarks.tls import Certificates
from benchmarks.workloads import N_WORKERS, SEED_WORKERS, Sizes

# Dask collections run through the client (benchmarks/dask_workloads.py).
COMPUTES_DASK_COLLECTIONS = True
SUPPORTS_TLS = True


def version() -> str:
    return distributed.__version__


DaskSession = FuturesSession


def _security(tls: Certificates | None) -> dict[str, Any]:
    """Options for mutual TLS on every connection (``tls://``), from the same files."""
    if tls is None:
        return {}
    files = {
        f"tls_{role}_{part}": path
        for role in ("scheduler", "worker", "client")
        for part, path in (("cert", tls.cert), ("key", tls.key))
    }
    security = Security(tls_ca_file=tls.ca, require_encryption=True, **files)
    return {"security": security, "protocol": "tls://"}


def _specs(seed: bool, tls: Certificates | None = None) -> dict[str, dict[str, Any]]:
    workers = SEED_WORKERS if seed else [{"name": f"w{i}"} for i in range(N_WORKERS)]
    return {
        w["name"]: {
            "cls": Nanny,
            "options": {
                "nthreads": 1,
                "host": "127.0.0.1",
                "resources": w.get("resources") or None,
                "dashboard": False,
                "silence_logs": logging.WARNING,
                **_security(tls),
            },
        }
        for w in workers
    }


@contextmanager
def session(seed: bool, tls: Certificates | None = None) -> Iterator[DaskSession]:
    secure = _security(tls)
    scheduler = {
        "cls": Scheduler,
        "options": {
            "host": "127.0.0.1",
            "dashboard_address": None,
            "dashboard": False,
            **secure,
        },
    }
    security = secure.get("security")
    with (
        SpecCluster(
            workers=_specs(seed, tls),
            scheduler=scheduler,
            silence_logs=logging.WARNING,
            security=security,
        ) as c,
        Client(c, security=security) as client,
    ):
        client.wait_for_workers(N_WORKERS, timeout=60)
        yield DaskSession(client)


def scheduler_only(sizes: Sizes) -> dict[str, float] | None:
    """dask's SchedulerState driven in-process (see benchmarks/scheduler_dask.py)."""
    from benchmarks.scheduler_dask import run_dask

    return run_dask(sizes)
