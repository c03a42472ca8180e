"""The operator's own metrics: reconciles by outcome, their time, scaling decisions,
served over HTTP as Prometheus reads them."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from apportion.operator import metrics
from prometheus_client.parser import text_string_to_metric_families


def sample(name: str, **labels: str) -> float:
    value = metrics.REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_reconciles_are_counted_by_outcome_and_timed() -> None:
    ok, error = (
        sample("apportion_operator_reconciles_total", outcome="ok"),
        sample("apportion_operator_reconciles_total", outcome="error"),
    )
    timed = sample("apportion_operator_reconcile_seconds_count")
    with metrics.reconciling():
        pass
    with pytest.raises(RuntimeError), metrics.reconciling():
        raise RuntimeError("the API server went away")
    assert sample("apportion_operator_reconciles_total", outcome="ok") == ok + 1
    assert sample("apportion_operator_reconciles_total", outcome="error") == error + 1
    assert sample("apportion_operator_reconcile_seconds_count") == timed + 2


def test_scaling_decisions_are_counted_per_group_and_direction() -> None:
    metrics.scaled("pipeline", "gpu", 1, 3)
    metrics.scaled("pipeline", "gpu", 3, 2)
    labels = {"cluster": "pipeline", "group": "gpu"}
    assert sample("apportion_operator_scaling_decisions_total", **labels, direction="up") >= 1
    assert sample("apportion_operator_scaling_decisions_total", **labels, direction="down") >= 1


def test_metrics_are_served_over_http() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    metrics.invalid()
    metrics.serve(port, host="127.0.0.1")
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    names = {family.name for family in text_string_to_metric_families(text.decode())}
    assert {
        "apportion_operator_reconciles",
        "apportion_operator_reconcile_seconds",
        "apportion_operator_scaling_decisions",
    } <= names


def test_the_cluster_summary_keeps_what_the_dashboard_shows() -> None:
    from apportion.operator.scheduler_feed import cluster_summary

    status = {"phase": "Running", "workerGroups": [{"name": "gpu"}], "conditions": [{}]}
    assert cluster_summary("pipeline", "ml", status) == {
        "name": "pipeline",
        "namespace": "ml",
        "phase": "Running",
        "workerGroups": [{"name": "gpu"}],
    }


def test_an_unreachable_scheduler_does_not_fail_the_reconcile() -> None:
    from apportion.operator.scheduler_feed import send_status
    from apportion.operator.scheduler_http import SchedulerHttp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once closed
    assert send_status(SchedulerHttp("127.0.0.1", port, "t"), {"name": "x"}, timeout=2) is False
