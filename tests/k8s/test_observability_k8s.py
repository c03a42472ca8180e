"""Logs and the dashboard of a ResourceCluster, from outside, on the real control plane."""

from __future__ import annotations

import http.cookiejar
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator

import cloudpickle
import pytest
import yaml

from apportion import Client
from apportion.kubernetes import KubeCluster

from .controlplane import Cluster
from .deployment import Deployment, deploy_operator

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(600)]

cloudpickle.register_pickle_by_value(sys.modules[__name__])

WATCHED = {
    "apiVersion": "apportion.dev/v1alpha1",
    "kind": "ResourceCluster",
    "metadata": {"name": "watched"},
    "spec": {
        # Test pods share one network namespace: this cluster needs ports of its own.
        "scheduler": {"port": 9986, "httpPort": 9987},
        "workerGroups": [{"name": "gpu", "replicas": 1, "nthreads": 2, "resources": {"GPU": 2}}],
    },
}


def shout(text: str) -> str:
    print(f"task says {text}")
    return text


@pytest.fixture(scope="module")
def watched(k8s_cluster: Cluster) -> Iterator[Deployment]:
    with deploy_operator(k8s_cluster) as deployment:
        deployment.kubectl("apply", "-f", "-", input=yaml.safe_dump(WATCHED))
        deployment.wait_running("watched", {"gpu": 1})
        yield deployment


def test_logs_dashboard_and_metrics_of_a_resource_cluster(
    watched: Deployment, capfd: pytest.CaptureFixture[str]
) -> None:
    cluster = KubeCluster.from_name(
        "watched", watched.namespace, kubeconfig=str(watched.k8s.kubeconfig), timeout=120
    )
    logs = cluster.get_logs()
    (scheduler,) = [name for name in logs if "scheduler" in name]
    assert "scheduler listening" in logs[scheduler]
    workers = [name for name in logs if name != scheduler]
    assert len(workers) == 1 and "connected to" in logs[workers[0]]
    assert len(cluster.get_logs(tail_lines=1)[scheduler].strip().splitlines()) == 1

    with Client(cluster) as client:
        assert client.submit(shout, "hi", resources={"GPU": 1}).result() == "hi"
        assert client.dashboard_link == cluster.dashboard_link
        browser = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )
        page = browser.open(cluster.dashboard_link, timeout=10).read().decode()
        assert 'data-resource="GPU"' in page

        def groups_shown() -> bool:  # the operator tells the scheduler at each reconcile
            page = browser.open(cluster.dashboard_link.split("?")[0], timeout=10).read()
            return b"ResourceCluster" in page and b'data-group="gpu"' in page

        watched.wait(groups_shown, "the operator's view on the dashboard", timeout=60)
        base = cluster.dashboard_link.split("/dashboard")[0]
        token = urllib.parse.parse_qs(urllib.parse.urlsplit(cluster.dashboard_link).query)["token"]
        scrape = urllib.request.Request(
            f"{base}/metrics", headers={"Authorization": f"Bearer {token[0]}"}
        )
        metrics = urllib.request.urlopen(scrape, timeout=10).read().decode()
        assert 'apportion_worker_resource_total{resource="GPU"' in metrics
        assert any("scheduler listening" in line for line in client.get_scheduler_logs())

        def printed() -> bool:
            printed.seen += capfd.readouterr().out  # type: ignore[attr-defined]
            return "task says hi" in printed.seen  # type: ignore[attr-defined]

        printed.seen = ""  # type: ignore[attr-defined]
        watched.wait(printed, "the task's output on the client", timeout=30)
