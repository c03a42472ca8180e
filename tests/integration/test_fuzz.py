"""Fuzzing the wire protocol against a running scheduler (hypothesis)."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apportion import Client, LocalCluster
from apportion.protocol import PROTOCOL_VERSION
from apportion.protocol.comm import parse_address
from tests.integration.tasks import inc

OPS = [
    "hello",
    "submit",
    "release",
    "cancel",
    "info",
    "run",
    "close",
    "task-finished",
    "heartbeat",
    "goodbye",
    "compute",
    "nonsense",
]

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
messages = st.dictionaries(
    st.sampled_from(
        [
            "op",
            "tasks",
            "keys",
            "key",
            "id",
            "func",
            "args",
            "deps",
            "resources",
            "run_id",
            "role",
            "protocol",
            "token",
        ]
    ),
    values,
    max_size=6,
).map(lambda m: m) | st.builds(
    lambda op, rest: {"op": op, **rest},
    st.sampled_from(OPS),
    st.dictionaries(st.text(max_size=8), values, max_size=4),
)


def _frame(payload: bytes) -> bytes:
    return struct.pack("<I", len(payload)) + payload


@pytest.fixture(scope="module")
def target() -> Iterator[tuple[LocalCluster, Client]]:
    with LocalCluster(n_workers=1) as cluster, Client(cluster) as client:
        yield cluster, client


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _send(address: str, data: bytes) -> None:
    host, port = parse_address(address)
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.settimeout(0.2)
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
        except OSError:
            pass  # closed on us, or nothing to say: both are fine


@settings(
    max_examples=150,
    derandomize=True,  # the same examples on every run
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    authenticate=st.booleans(),
    body=st.one_of(
        st.binary(max_size=300),
        st.lists(messages, max_size=4).map(lambda ms: _frame(msgpack.packb(ms))),
        values.map(lambda v: _frame(msgpack.packb(v))),
        st.integers(0, 2**32 - 1).map(lambda n: struct.pack("<I", n) + b"\x90"),
    ),
)
def test_random_bytes_never_hurt_the_scheduler(
    target: tuple[LocalCluster, Client], authenticate: bool, body: bytes
) -> None:
    cluster, client = target
    hello_message = {"op": "hello", "role": "client", "protocol": PROTOCOL_VERSION}
    hello = _frame(msgpack.packb([{**hello_message, "token": cluster.token}]))
    _send(cluster.scheduler_address, (hello if authenticate else b"") + body)
    assert client.submit(inc, 1, pure=False).result(timeout=30) == 2


def test_scheduler_memory_stays_bounded_under_fuzzing(target: tuple[LocalCluster, Client]) -> None:
    cluster, client = target
    pid = cluster._scheduler_process.pid
    before = _rss_kib(pid)
    junk = struct.pack("<I", 2**31) + b"x" * 1000  # announces 2 GiB, sends 1 KB
    for _ in range(200):
        _send(cluster.scheduler_address, junk)
    assert client.submit(inc, 2, pure=False).result(timeout=30) == 3
    assert _rss_kib(pid) - before < 50_000, "scheduler memory grew by more than 50 MB"
    assert client.check_invariants() == []
