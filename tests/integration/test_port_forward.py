"""The local end of port-forwarding, carrying a real client's and browser's traffic.

Only the stream to the pod is replaced: each accepted connection is dialled straight to
the scheduler's port on loopback instead of through the Kubernetes API (the same bytes
travel; tests/k8s/test_port_forward_e2e.py dials the real scheduler pod).
"""

from __future__ import annotations

import http.cookiejar
import socket
import urllib.request
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from apportion import Client, LocalCluster
from apportion.port_forward import (
    Forwarder,
    PortForwardError,
    cluster_ports,
    forward_cluster,
    scheduler_pod,
)
from apportion.protocol.comm import parse_address
from apportion.reprs import dashboard_link


def to(host: str, port: int):
    return lambda: socket.create_connection((host, port), timeout=10)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(
        workers=[{"name": "gpu", "nthreads": 2, "resources": {"GPU": 1}}], http_port=0
    ) as c:
        yield c


def test_a_client_and_the_dashboard_work_through_forwarded_ports(cluster: LocalCluster) -> None:
    host, port = parse_address(cluster.scheduler_address)
    http_port, token = cluster.http_port, cluster.token
    assert http_port
    with Forwarder(to(host, port)) as scheduler, Forwarder(to(host, http_port)) as web:
        with Client(f"tcp://{scheduler.address}", token=token) as client:
            assert client.submit(sum, [1, 2, 3], resources={"GPU": 1}).result() == 6
            link = dashboard_link(f"tcp://{scheduler.address}", web.port, token)
            assert link is not None and link.startswith(f"http://127.0.0.1:{web.port}/")
            browser = urllib.request.build_opener(
                urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
            )  # the link signs in with a cookie, then shows the page
            page = browser.open(link, timeout=10).read().decode()
            assert 'data-resource="GPU"' in page


def test_a_dial_that_fails_closes_only_that_connection() -> None:
    def unreachable():
        raise ConnectionRefusedError("no route to the pod")

    with Forwarder(unreachable) as forward:
        for _ in range(2):  # the listener keeps serving
            with socket.create_connection(("127.0.0.1", forward.port), timeout=10) as conn:
                conn.settimeout(10)
                assert conn.recv(1) == b""


def test_a_local_port_in_use_is_a_clear_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(PortForwardError, match=f"cannot listen on 127.0.0.1:{port}"):
            Forwarder(to("127.0.0.1", 1), local_port=port)


def pod(name: str, phase: str, deleting: bool = False) -> SimpleNamespace:
    return SimpleNamespace(
        metadata=SimpleNamespace(name=name, deletion_timestamp="now" if deleting else None),
        status=SimpleNamespace(phase=phase),
    )


def test_the_running_scheduler_pod_is_dialled() -> None:
    pods = [pod("old", "Running", deleting=True), pod("new", "Pending"), pod("live", "Running")]
    assert scheduler_pod(pods, "c") == "live"
    with pytest.raises(
        PortForwardError, match=r"no running scheduler pod for cluster .c.*new: Pending"
    ):
        scheduler_pod(pods[:2], "c")


def test_ports_come_from_the_resource_cluster() -> None:
    resource = {
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"scheduler": {"port": 9986, "httpPort": 9987}},
        "status": {"schedulerAddress": "tcp://c-scheduler.ns.svc:9986"},
    }
    assert cluster_ports(resource) == {"scheduler": 9986, "dashboard": 9987}
    assert cluster_ports({"metadata": {}}) == {"scheduler": 8786, "dashboard": 8787}
    dialled = []
    forwards = forward_cluster(
        None,
        resource,
        {"dashboard": 0},
        dial=lambda core, ns, name, port: dialled.append((ns, name, port)) or to("127.0.0.1", port),
    )
    try:
        assert sorted(dialled) == [("ns", "c", 9986), ("ns", "c", 9987)]
        assert set(forwards) == {"scheduler", "dashboard"}
    finally:
        for forward in forwards.values():
            forward.close()
