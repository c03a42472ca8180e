"""What a peer that has not authenticated can cost: little memory, no stuck connection,
and no information; legitimate peers are served throughout."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import msgpack
import pytest

from apportion import Client, LocalCluster
from apportion.protocol import PROTOCOL_VERSION
from apportion.protocol.comm import parse_address
from tests.conftest import wait_until
from tests.integration.tasks import inc


def _frame(payload: bytes) -> bytes:
    return struct.pack("<I", len(payload)) + payload


def _hello(token: str, **extra: object) -> bytes:
    hello = {"op": "hello", "role": "client", "protocol": PROTOCOL_VERSION, "token": token, **extra}
    return _frame(msgpack.packb([hello]))


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def _read_until_closed(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except (TimeoutError, ConnectionResetError):
        pass
    return b"".join(chunks)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(workers=[{"name": "w", "nthreads": 1}], http_port=0) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster) as client:
        yield client


# An empty first frame passes the handshake limit; the header after it announces 1 GiB.
ANNOUNCE_1_GIB = struct.pack("<I", 0) + struct.pack("<I", (1 << 30) - 16) + b"x" * 64


@pytest.mark.parametrize("target", ["scheduler", "worker"])
def test_announced_lengths_cost_an_unauthenticated_peer_no_memory(
    cluster: LocalCluster, client: Client, target: str
) -> None:
    if target == "scheduler":
        pid, address = cluster._scheduler_process.pid, cluster.scheduler_address
    else:
        worker = cluster.workers["w"]
        pid, address = worker.pid, worker.address
    host, port = parse_address(address)
    start = _rss_bytes(pid)
    for i in range(300):
        with socket.create_connection((host, port), timeout=15) as sock:
            sock.sendall(ANNOUNCE_1_GIB)
            _read_until_closed(sock)  # the peer closes the connection
        # Checked as we go: a leak of 1 GiB per connection must fail here, not the machine.
        grown = _rss_bytes(pid) - start
        assert grown < 32 << 20, f"RSS grew by {grown >> 20} MiB after {i + 1} connections"
    assert client.submit(inc, 1, pure=False).result(timeout=30) == 2


@pytest.mark.parametrize("token", ["tökén", "\u2603" * 40])
def test_a_non_ascii_token_is_refused_like_any_wrong_token(
    cluster: LocalCluster, token: str
) -> None:
    with pytest.raises(ConnectionRefusedError, match="authentication failed: a wrong token"):
        Client(cluster.scheduler_address, token=token)
    host, port = parse_address(cluster.scheduler_address)
    with socket.create_connection((host, port), timeout=15) as sock:
        sock.sendall(_hello(token))
        reply = _read_until_closed(sock)  # closed at once, not left open
    assert b"authentication failed" in reply
    request = urllib.request.Request(
        f"http://127.0.0.1:{cluster.http_port}/api/v1/retire",
        b'{"names": []}',
        method="POST",
        headers={"Authorization": "Bearer t\u00f6ken".encode().decode("latin-1")},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401


def test_a_bad_message_in_the_handshake_packet_gets_its_own_error_and_closes(
    cluster: LocalCluster, client: Client
) -> None:
    host, port = parse_address(cluster.scheduler_address)
    with socket.create_connection((host, port), timeout=15) as sock:
        sock.sendall(_hello(cluster.token) + _frame(msgpack.packb([{"op": "no-such-op"}])))
        started = time.monotonic()
        reply = _read_until_closed(sock)
        assert time.monotonic() - started < 10, "the connection was left open"
    messages = []
    while reply:
        (length,) = struct.unpack("<I", reply[:4])
        messages += msgpack.unpackb(reply[4 : 4 + length])
        reply = reply[4 + length :]
    errors = [m["reason"] for m in messages if m["op"] == "error"]
    assert len(errors) == 1 and "unknown client operation 'no-such-op'" in errors[0], messages
    assert "await" not in errors[0]
    assert client.submit(inc, 3, pure=False).result(timeout=30) == 4


def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_only_health_answers_without_the_token_over_http(cluster: LocalCluster) -> None:
    base = f"http://127.0.0.1:{cluster.http_port}"
    assert _get(f"{base}/health") == (200, b"ok")
    for token in (None, "wrong", ""):
        status, body = _get(f"{base}/api/v1/info", token)
        assert status == 401, body
        assert b"pid" not in body and b"workers" not in body
        assert b"Authorization: Bearer" in body
    status, body = _get(f"{base}/api/v1/info", cluster.token)
    assert status == 200
    (worker,) = json.loads(body)["workers"].values()
    assert worker["name"] == "w"


def test_a_flood_of_connections_is_queued_by_the_kernel_and_peers_still_get_through(
    cluster: LocalCluster, client: Client
) -> None:
    """While the scheduler cannot accept (stopped here), the kernel completes as many
    connections as the listen backlog allows; a backlog of 100 left most of 1,000 in SYN
    retries for tens of seconds."""
    host, port = parse_address(cluster.scheduler_address)
    scheduler = cluster._scheduler_process.pid
    sockets: list[socket.socket] = []
    os.kill(scheduler, signal.SIGSTOP)
    try:
        for _ in range(1000):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex((host, port))
            sockets.append(sock)
        by_fd = {sock.fileno(): sock for sock in sockets}
        poller = select.poll()
        for fd in by_fd:
            poller.register(fd, select.POLLOUT)
        connected: set[int] = set()
        deadline = time.monotonic() + 5
        while len(connected) < len(sockets) and time.monotonic() < deadline:
            for fd, _ in poller.poll(200):
                poller.unregister(fd)
                if by_fd[fd].getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    connected.add(fd)
        assert len(connected) == 1000, f"only {len(connected)} of 1000 connections completed"
    finally:
        os.kill(scheduler, signal.SIGCONT)
    try:
        assert client.submit(inc, 4, pure=False).result(timeout=30) == 5
        with Client(cluster) as another:
            assert another.submit(inc, 5, pure=False).result(timeout=30) == 6
    finally:
        for sock in sockets:
            sock.close()
    wait_until(lambda: client.submit(inc, 6, pure=False).result(timeout=30) == 7)
