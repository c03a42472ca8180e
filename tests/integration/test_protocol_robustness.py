"""Bad bytes on the wire close only the offending connection; everyone else is served."""

from __future__ import annotations

import socket
import struct

import msgpack
import pytest

from apportion import Client
from apportion.protocol import PROTOCOL_VERSION
from apportion.protocol.comm import parse_address
from tests.integration.tasks import inc


def _frame(payload: bytes) -> bytes:
    return struct.pack("<I", len(payload)) + payload


def _hello(token: str) -> bytes:
    return _frame(
        msgpack.packb(
            [{"op": "hello", "role": "client", "protocol": PROTOCOL_VERSION, "token": token}]
        )
    )


BAD_INPUTS = {
    "not msgpack": _frame(b"\xc1\xc1\xc1garbage"),
    "huge length prefix": struct.pack("<I", 0xFFFFFFF0) + b"x" * 16,
    "truncated frame": struct.pack("<I", 100) + b"short",
    "not a list": _frame(msgpack.packb({"op": "hello"})),
    "message without op": _frame(msgpack.packb([{"role": "client"}])),
    "no handshake first": _frame(msgpack.packb([{"op": "submit", "tasks": []}])),
    "wrong protocol version": _frame(
        msgpack.packb([{"op": "hello", "role": "client", "protocol": 999}])
    ),
}


def _read_reply(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    except (TimeoutError, ConnectionResetError):
        pass
    return b"".join(chunks)


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_malformed_input_closes_only_that_connection(
    client: Client, seed_cluster, name: str
) -> None:
    host, port = parse_address(seed_cluster.scheduler_address)
    with socket.create_connection((host, port), timeout=15) as sock:
        sock.sendall(BAD_INPUTS[name])
        if name == "truncated frame":
            sock.shutdown(socket.SHUT_WR)
        reply = _read_reply(sock)  # returns once the scheduler closes the connection
    if name == "wrong protocol version":
        assert b"protocol version 999 is not supported" in reply
    assert client.submit(inc, 41).result(timeout=30) == 42


@pytest.mark.parametrize(
    "bad",
    [
        [{"op": "no-such-op"}],
        [{"op": "submit"}],
        [{"op": "submit", "tasks": [{"key": "k"}]}],
    ],
)
def test_bad_messages_after_handshake_close_that_client_only(
    client: Client, seed_cluster, bad: list
) -> None:
    host, port = parse_address(seed_cluster.scheduler_address)
    with socket.create_connection((host, port), timeout=15) as sock:
        sock.sendall(_hello(seed_cluster.token))
        sock.sendall(_frame(msgpack.packb(bad)))
        reply = _read_reply(sock)
    assert b"protocol error" in reply
    assert client.submit(inc, 1).result(timeout=30) == 2
    assert client.check_invariants() == []


def test_wrong_or_missing_token_is_refused_clearly(seed_cluster) -> None:
    with pytest.raises(ConnectionRefusedError, match="authentication failed: a wrong token"):
        Client(seed_cluster.scheduler_address, token="not-the-token")
    with pytest.raises(ConnectionRefusedError, match="authentication failed: no token"):
        Client(seed_cluster.scheduler_address, token="")


def test_a_refused_client_is_closed_so_its_finalizer_has_nothing_to_wait_for(seed_cluster) -> None:
    # Its __del__ may later run on another client's I/O thread; it must not block that one.
    refused = Client.__new__(Client)
    with pytest.raises(ConnectionRefusedError):
        refused.__init__(seed_cluster.scheduler_address, token="not-the-token")
    assert refused.session.closed
    assert not refused.session.thread.is_alive()
    refused.__del__()  # returns at once: nothing to shut down
