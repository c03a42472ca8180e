"""The chart's PodMonitor for the schedulers' /metrics: off by default, and when on,
selecting exactly the scheduler pods the operator creates, on their HTTP port."""

from __future__ import annotations

import yaml
from apportion.operator.manifests import labels
from apportion.operator.spec import parse

from tests.unit.test_chart_and_crd import helm


def render(*extra: str) -> list[dict]:
    result = helm("template", "apportion", "charts/apportion", "-n", "ops", *extra)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_no_pod_monitor_by_default() -> None:
    assert not [d for d in render() if d["kind"] == "PodMonitor"]


def test_pod_monitor_selects_the_schedulers_http_port() -> None:
    (monitor,) = [
        d
        for d in render(
            "--set",
            "metrics.podMonitor.enabled=true",
            "--set",
            "metrics.podMonitor.labels.release=prometheus",
        )
        if d["kind"] == "PodMonitor"
    ]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"any": True}
    assert spec["podMetricsEndpoints"][0]["port"] == "http-status"
    assert spec["podMetricsEndpoints"][0]["path"] == "/metrics"
    cluster = parse(
        "pipeline",
        "default",
        {"workerGroups": [{"name": "gpu", "replicas": 1, "resources": {"GPU": 1}}]},
    )
    scheduler_labels = labels(cluster, "scheduler")
    assert spec["selector"]["matchLabels"].items() <= scheduler_labels.items()
    assert not spec["selector"]["matchLabels"].items() <= labels(cluster, "worker", "gpu").items()
