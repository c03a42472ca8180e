"""The scheduler's HTTP port bounds what a stranger can make it hold: a body larger than
any route takes is refused from its headers, before it is read; a connection that sends no
request is closed; every response carries the headers that keep the dashboard from being
framed, sniffed or running scripts other than its own."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest
from apportion.scheduler.http_security import IDLE_TIMEOUT, MAX_BODY_BYTES

from apportion import LocalCluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(workers=[], http_port=0) as cluster:
        yield cluster


def _connect(cluster: LocalCluster, timeout: float) -> socket.socket:
    assert cluster.http_port is not None
    return socket.create_connection(("127.0.0.1", cluster.http_port), timeout=timeout)


def _read_to_end(peer: socket.socket) -> bytes:
    """What the server sends until it closes (a timeout: it kept the connection)."""
    received = b""
    while chunk := peer.recv(65536):
        received += chunk
    return received


def test_a_body_larger_than_any_route_takes_is_refused_before_it_is_read(
    cluster: LocalCluster,
) -> None:
    with _connect(cluster, timeout=10) as peer:
        # Headers only: the 95 MB never follow; the scheduler must not wait for them.
        peer.sendall(
            b"POST /api/v1/retire HTTP/1.1\r\nHost: scheduler\r\n"
            b"Content-Type: application/json\r\nContent-Length: 95000000\r\n\r\n{"
        )
        answer = _read_to_end(peer)
    assert 95_000_000 > MAX_BODY_BYTES
    assert not answer.startswith(b"HTTP/1.1 200"), answer[:200]


def test_a_connection_that_sends_no_request_is_closed(cluster: LocalCluster) -> None:
    started = time.monotonic()
    with _connect(cluster, timeout=IDLE_TIMEOUT + 20) as peer:
        assert _read_to_end(peer) == b""
    assert time.monotonic() - started < IDLE_TIMEOUT + 10


def test_a_small_authenticated_body_is_still_served(cluster: LocalCluster) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{cluster.http_port}/api/v1/retire",
        data=b'{"names": []}',
        headers={"Authorization": f"Bearer {cluster.token}"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200


@pytest.mark.parametrize("path", ["/health", "/dashboard", "/api/v1/info"])
def test_every_response_forbids_framing_sniffing_and_foreign_scripts(
    cluster: LocalCluster, path: str
) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{cluster.http_port}{path}",
        headers={"Authorization": f"Bearer {cluster.token}"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        headers = answer.headers
    assert headers["X-Frame-Options"] == "DENY"
    assert headers["X-Content-Type-Options"] == "nosniff"
    policy = headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy
    if path == "/dashboard":  # its own script, by hash, and its event stream
        assert "script-src 'sha256-" in policy and "connect-src 'self'" in policy
    else:
        assert "script-src" not in policy
