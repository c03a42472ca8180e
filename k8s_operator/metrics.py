"""The operator's own Prometheus metrics: reconciles, their errors and time, scaling
decisions, clusters remembered. Served by ``apportion operator --metrics-port PORT`` at
``/metrics``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from apportion.operator import memo
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILES = Counter(
    "apportion_operator_reconciles",
    "Reconciles of a ResourceCluster, by outcome: ok, invalid (spec refused) or error",
    ["outcome"],
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "apportion_operator_reconcile_seconds",
    "How long one reconcile of a ResourceCluster took",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=REGISTRY,
)
SCALING_DECISIONS = Counter(
    "apportion_operator_scaling_decisions",
    "Autoscaler decisions that changed a worker group's size, by direction (up or down)",
    ["cluster", "group", "direction"],
    registry=REGISTRY,
)

CLUSTERS = Gauge(
    "apportion_operator_clusters",
    "ResourceClusters the operator keeps a record of (a deleted one is forgotten at once)",
    registry=REGISTRY,
)
CLUSTERS.set_function(memo.remembered)


@contextmanager
def reconciling() -> Iterator[None]:
    """Around one reconcile: counts it (an exception as an error) and times it."""
    start = time.perf_counter()
    try:
        yield
    except Exception:
        RECONCILES.labels("error").inc()
        raise
    else:
        RECONCILES.labels("ok").inc()
    finally:
        RECONCILE_SECONDS.observe(time.perf_counter() - start)


def invalid() -> None:
    """A reconcile that found the spec invalid (counted as ok by ``reconciling`` too)."""
    RECONCILES.labels("invalid").inc()


def scaled(cluster: str, group: str, before: int, after: int) -> None:
    SCALING_DECISIONS.labels(cluster, group, "up" if after > before else "down").inc()


def serve(port: int, host: str = "0.0.0.0") -> None:
    """Serve ``/metrics`` on ``port`` from a background thread."""
    start_http_server(port, addr=host, registry=REGISTRY)
