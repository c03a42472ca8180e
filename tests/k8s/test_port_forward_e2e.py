"""The dashboard and scheduler of a ResourceCluster reached from outside through the
Kubernetes API's port-forward (the kubernetes library's WebSocket, proxied by the real API
server to the test kubelet): ``KubeCluster(..., port_forward=True)`` and
``apportion dashboard NAME``."""

from __future__ import annotations

import http.cookiejar
import os
import signal
import socket
import subprocess
import sys
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

FORWARDED = {
    "apiVersion": "apportion.dev/v1alpha1",
    "kind": "ResourceCluster",
    "metadata": {"name": "forwarded"},
    "spec": {
        # Test pods share one network namespace: this cluster needs ports of its own.
        "scheduler": {"port": 9786, "httpPort": 9787},
        "workerGroups": [{"name": "gpu", "replicas": 1, "nthreads": 2, "resources": {"GPU": 1}}],
    },
}


def where_am_i() -> str:
    return os.environ.get("HOSTNAME", "?")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def dashboard_page(link: str) -> str:
    browser = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )  # the link signs in with a cookie, then shows the page
    return str(browser.open(link, timeout=30).read().decode())


@pytest.fixture(scope="module")
def forwarded(k8s_cluster: Cluster) -> Iterator[Deployment]:
    with deploy_operator(k8s_cluster) as deployment:
        deployment.kubectl("apply", "-f", "-", input=yaml.safe_dump(FORWARDED))
        deployment.wait_running("forwarded", {"gpu": 1})
        yield deployment


def test_kube_cluster_port_forward(
    forwarded: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = KubeCluster.from_name(
        "forwarded",
        forwarded.namespace,
        kubeconfig=str(forwarded.k8s.kubeconfig),
        timeout=120,
        port_forward=True,
    )
    assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
    link = cluster.dashboard_link
    assert link is not None and link.startswith("http://127.0.0.1:")
    assert link in capsys.readouterr().out  # printed for the user
    with Client(cluster) as client:
        assert client.submit(where_am_i, resources={"GPU": 1}, pure=False).result()
        assert 'data-resource="GPU"' in dashboard_page(link)


def test_apportion_dashboard_command(forwarded: Deployment) -> None:
    port, scheduler_port = free_port(), free_port()
    command = [
        sys.executable, "-m", "apportion.cli", "dashboard", "forwarded",
        "-n", forwarded.namespace, "--port", str(port), "--scheduler-port", str(scheduler_port),
        "--kubeconfig", str(forwarded.k8s.kubeconfig),
    ]  # fmt: skip
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()
            assert first.startswith(f"dashboard: http://127.0.0.1:{port}/"), first
            assert 'data-resource="GPU"' in dashboard_page(first.split(" ", 1)[1].strip())
            assert proc.stdout.readline().startswith(f"scheduler: tcp://127.0.0.1:{scheduler_port}")
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 0


def test_apportion_dashboard_of_a_cluster_that_does_not_exist(forwarded: Deployment) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "apportion.cli", "dashboard", "nosuch", "-n", forwarded.namespace,
         "--kubeconfig", str(forwarded.k8s.kubeconfig)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert "nosuch" in done.stderr and "not found" in done.stderr.lower(), done.stderr
