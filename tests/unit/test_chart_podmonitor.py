"""The chart's PodMonitor for the schedulers' /metrics: off by default, and when on,
selecting exactly the scheduler pods the operator creates, on their HTTP port."""

from __future__ import annotations

import yaml
from apportion.operator.manifests import LABEL_TLS, labels, scheduler_deployment
from apportion.operator.spec import parse

from tests.unit.test_chart_and_crd import helm

OWNER = {"metadata": {"name": "pipeline", "namespace": "default", "uid": "0"}}


def render(*extra: str) -> list[dict]:
    result = helm("template", "apportion", "charts/apportion", "-n", "ops", *extra)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_no_pod_monitor_and_no_operator_metrics_by_default() -> None:
    docs = render()
    assert not [d for d in docs if d["kind"] == "PodMonitor"]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    assert "metrics" not in str(deployment["spec"]["template"]["spec"]["containers"])


def test_pod_monitors_select_the_schedulers_and_the_operator() -> None:
    docs = render(
        "--set",
        "metrics.podMonitor.enabled=true",
        "--set",
        "metrics.podMonitor.labels.release=prometheus",
        "--set",
        "metrics.operatorPort=9090",
        "--set",
        "metrics.podMonitor.tokenSecret=pipeline-token",
    )
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PodMonitor"}
    assert set(monitors) == {
        "apportion-schedulers",
        "apportion-schedulers-tls",
        "apportion-operator",
    }
    schedulers = monitors["apportion-schedulers"]
    assert schedulers["metadata"]["labels"]["release"] == "prometheus"
    spec = schedulers["spec"]
    assert spec["namespaceSelector"] == {"any": True}
    assert spec["podMetricsEndpoints"][0]["port"] == "http-status"
    assert spec["podMetricsEndpoints"][0]["path"] == "/metrics"
    assert spec["podMetricsEndpoints"][0]["authorization"]["credentials"] == {
        "name": "pipeline-token",
        "key": "token",
    }
    cluster = parse(
        "pipeline",
        "default",
        {"workerGroups": [{"name": "gpu", "replicas": 1, "resources": {"GPU": 1}}]},
    )
    scheduler_labels = labels(cluster, "scheduler")
    assert spec["selector"]["matchLabels"].items() <= scheduler_labels.items()
    assert not spec["selector"]["matchLabels"].items() <= labels(cluster, "worker", "gpu").items()

    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert "--metrics-port=9090" in container["args"]
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
    operator = monitors["apportion-operator"]["spec"]
    assert operator["podMetricsEndpoints"][0]["port"] == "metrics"
    assert operator["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()


def test_tls_clusters_are_scraped_over_https_and_plain_ones_over_http() -> None:
    docs = render("--set", "metrics.podMonitor.enabled=true")
    monitors = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "PodMonitor"}
    plain, secure = monitors["apportion-schedulers"], monitors["apportion-schedulers-tls"]
    groups = {"workerGroups": [{"name": "gpu", "replicas": 1}]}
    for tls, monitor in ((False, plain), (True, secure)):
        spec = parse("pipeline", "default", {**groups, "tls": {"enabled": tls}})
        pod_labels = scheduler_deployment(spec, OWNER)["spec"]["template"]["metadata"]["labels"]
        assert monitor["selector"]["matchLabels"].items() <= pod_labels.items()
        # Exactly one monitor scrapes each scheduler.
        assert (LABEL_TLS in pod_labels) == tls
    assert plain["selector"]["matchExpressions"] == [{"key": LABEL_TLS, "operator": "DoesNotExist"}]
    (endpoint,) = secure["podMetricsEndpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    assert "scheme" not in plain["podMetricsEndpoints"][0]
