"""Large frames over TLS: whole and in order at every size around the TLS record, the read
and the write chunk; many at once between real processes; a peer dying in the middle of
one; and the sender holding no copy of what it sends."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import subprocess
import sys
import threading
import tracemalloc
import weakref
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

from apportion import Client, LocalCluster, config
from apportion.protocol import Comm, CommClosedError, Message, tls
from apportion.protocol import comm as comm_module
from apportion.protocol.frames import HEADER
from apportion.protocol.paced import TLS_CHUNK_BYTES
from apportion.protocol.reader import LARGE_FRAME_BYTES
from apportion.serialize import Pickled
from tests.integration.test_tls import tls_settings

# The functions below run on workers, which cannot import the test tree.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

BIG = 1 << 28
RECORD = 16_384  # the largest TLS record's plaintext
SSL_READ = 256 * 1024  # what the event loops' TLS transports decrypt at most per read
# Around each boundary, and past the size from which a frame's pages are made by a thread.
SIZES = [
    RECORD - 1,
    RECORD,
    RECORD + 1,
    SSL_READ - 1,
    SSL_READ,
    SSL_READ + 1,
    LARGE_FRAME_BYTES + 7,
    TLS_CHUNK_BYTES - 1,
    TLS_CHUNK_BYTES,
    TLS_CHUNK_BYTES + 1,
    3 * TLS_CHUNK_BYTES + 5,
    (64 << 20) + 3,
]


def random_bytes(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def digest(*arrays: np.ndarray) -> list[str]:
    return [hashlib.sha256(a).hexdigest() for a in arrays]


def _run(main: Coroutine[Any, Any, None], loop: str) -> None:
    if loop == "uvloop":
        import uvloop

        event_loop = uvloop.new_event_loop()
    else:
        event_loop = asyncio.new_event_loop()
    try:
        event_loop.run_until_complete(asyncio.wait_for(main, 120))
    finally:
        event_loop.close()


async def _until(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def _serve_one(settings: dict[str, str]) -> tuple[asyncio.Server, asyncio.Future[Comm]]:
    """A TLS server whose first connection's comm the future gives."""
    with config.set(settings):
        context = tls.server_context()
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[Comm] = loop.create_future()

    def new_comm() -> Comm:
        return Comm("server", BIG, on_connected=accepted.set_result)

    server = await loop.create_server(new_comm, "127.0.0.1", 0, ssl=context)
    return server, accepted


async def _tls_pair(settings: dict[str, str]) -> tuple[Comm, Comm, asyncio.Server]:
    """(client's comm, server's comm, server) over TLS on loopback."""
    server, accepted = await _serve_one(settings)
    with config.set(settings):
        context = tls.client_context()
    client = Comm("client", BIG)
    port = server.sockets[0].getsockname()[1]
    await asyncio.get_running_loop().create_connection(
        lambda: client, "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1"
    )
    return client, await asyncio.wait_for(accepted, 30), server


async def _read(comm: Comm, count: int) -> list[Message]:
    got: list[Message] = []
    while len(got) < count:
        got += await asyncio.wait_for(comm.read(), 60)
    return got


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_large_frames_arrive_whole_and_in_order_over_tls(tmp_path: Path, loop: str) -> None:
    settings = tls_settings(tmp_path)
    payloads = [random_bytes(size, seed).tobytes() for seed, size in enumerate(SIZES)]
    in_band = payloads[-2]  # a frame of one bytes object, larger than a write chunk

    async def main() -> None:
        sender, receiver, server = await _tls_pair(settings)
        for i, payload in enumerate(payloads):
            sender.send({"op": "small", "i": i})
            sender.send_now([{"op": "big", "data": Pickled(b"h", [memoryview(payload)])}])
        sender.send_now([{"op": "in-band", "data": in_band}])
        sender.send({"op": "last"})
        got = await _read(receiver, 2 * len(payloads) + 2)
        assert [m["op"] for m in got] == ["small", "big"] * len(payloads) + ["in-band", "last"]
        for message, payload in zip(got[1::2], payloads, strict=False):
            assert bytes(message["data"].buffers[0]) == payload
        assert got[-2]["data"] == in_band
        assert receiver.transport is not None and receiver.transport.get_protocol() is receiver
        sender.close()
        receiver.close()
        server.close()

    _run(main(), loop)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_write_over_tls_returns_once_the_transport_passed_everything_on(
    tmp_path: Path, loop: str
) -> None:
    """write() waits for the transport to drain; a TLS transport paused at a high-water
    mark of 0 after every write and resumed only when something else happened, so a
    write to a peer with nothing to say waited forever."""
    settings = tls_settings(tmp_path)

    async def main() -> None:
        sender, receiver, server = await _tls_pair(settings)
        await asyncio.wait_for(sender.write([{"op": "hello"}]), 10)
        await asyncio.wait_for(sender.write([{"op": "big", "data": bytes(3 << 20)}]), 30)
        assert [m["op"] for m in await _read(receiver, 2)] == ["hello", "big"]
        sender.close()
        receiver.close()
        server.close()

    _run(main(), loop)


def test_a_large_frame_sent_over_tls_is_not_copied_whole(tmp_path: Path) -> None:
    """The transport is given a chunk at a time: it never encrypts the whole frame into a
    buffer of its own and copies that out as one bytes object (two copies of the payload
    in the sending process)."""
    settings = tls_settings(tmp_path)
    payload = random_bytes(32 << 20, 1)

    async def main() -> None:
        sender, receiver, server = await _tls_pair(settings)
        tracemalloc.start()
        try:
            sender.send_now([{"op": "big", "data": Pickled(b"h", [memoryview(payload)])}])
            (got,) = await _read(receiver, 1)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert got["data"].buffers[0] == memoryview(payload)
        assert peak < 8 * TLS_CHUNK_BYTES, f"{peak} bytes allocated to send {payload.nbytes}"
        sender.close()
        receiver.close()
        server.close()

    _run(main(), "uvloop")


# A peer in a process of its own, on the standard library's blocking TLS socket.
_PEER = """
import socket, ssl, sys
ca, cert, key, port, role, amount, header = sys.argv[1:8]
context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
context.load_cert_chain(cert, key)
sock = context.wrap_socket(
    socket.create_connection(("127.0.0.1", int(port))), server_hostname="127.0.0.1"
)
if role == "sender":  # announces a frame (the header given), sends a part of it
    sock.sendall(bytes.fromhex(header) + bytes(int(amount)))
else:  # reads a part of what comes, then nothing more
    got = 0
    while got < int(amount):
        got += len(sock.recv(1 << 20))
print("done", flush=True)
sys.stdin.read()  # until killed
"""


ANNOUNCED = HEADER.pack(64 << 20)  # a frame of 64 MiB: its pages are made by a thread


def _start_peer(settings: dict[str, str], port: int, role: str, amount: int) -> subprocess.Popen:
    files = [settings[f"comm.tls.{name}-file"] for name in ("ca", "cert", "key")]
    return subprocess.Popen(
        [sys.executable, "-c", _PEER, *files, str(port), role, str(amount), ANNOUNCED.hex()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


async def _killed_after_done(peer: subprocess.Popen) -> None:
    assert peer.stdout is not None
    line = await asyncio.get_running_loop().run_in_executor(None, peer.stdout.readline)
    assert line.strip() == "done", f"the peer failed (exit {peer.poll()})"
    peer.kill()
    peer.wait()


def _page_threads() -> int:
    return sum(t.name == "apportion-pages" for t in threading.enumerate())


def test_a_peer_dying_in_the_middle_of_a_frame_it_sends_ends_the_read(tmp_path: Path) -> None:
    settings = tls_settings(tmp_path)

    async def main() -> None:
        server, accepted = await _serve_one(settings)
        port = server.sockets[0].getsockname()[1]
        peer = _start_peer(settings, port, "sender", 8 << 20)
        try:
            comm = await asyncio.wait_for(accepted, 30)
            await _until(
                lambda: (
                    comm.transport is not None
                    and isinstance(comm.transport.get_protocol(), comm_module._LargeFrameReads)
                ),
                "the frame to be read straight into its buffer",
            )
            await _killed_after_done(peer)
            with pytest.raises(CommClosedError):
                await asyncio.wait_for(comm.read(), 30)
            # The frame's buffer, and the thread making its pages, are let go.
            await _until(lambda: _page_threads() == 0, "the page thread to end")
        finally:
            peer.kill()
            peer.wait()
            server.close()

    _run(main(), "uvloop")


def test_a_peer_dying_while_a_large_frame_goes_to_it_ends_the_send(tmp_path: Path) -> None:
    settings = tls_settings(tmp_path)
    payload = random_bytes(64 << 20, 2)
    sent = weakref.ref(payload)

    async def main() -> None:
        nonlocal payload
        server, accepted = await _serve_one(settings)
        port = server.sockets[0].getsockname()[1]
        peer = _start_peer(settings, port, "receiver", 4 << 20)
        try:
            comm = await asyncio.wait_for(accepted, 30)
            comm.send_now([{"op": "big", "data": Pickled(b"h", [memoryview(payload)])}])
            del payload  # now only the comm holds it
            await _killed_after_done(peer)
            await _until(lambda: comm.closed, "the comm to see its peer gone")
            with pytest.raises(CommClosedError):
                await asyncio.wait_for(comm.write([{"op": "after"}]), 30)
            # What was still to be sent is let go with the connection.
            await _until(lambda: gc.collect() >= 0 and sent() is None, "the payload to be freed")
        finally:
            peer.kill()
            peer.wait()
            server.close()

    _run(main(), "uvloop")


TLS_WORKERS = [
    {"name": "a", "resources": {"A": 1}},
    {"name": "b", "resources": {"B": 1}},
    {"name": "c", "nthreads": 4, "resources": {"C": 1}},
]


def test_many_large_transfers_at_once_over_tls_between_processes(tmp_path: Path) -> None:
    settings = {**tls_settings(tmp_path), "worker.shared-memory": False}  # TLS, not memory
    sizes = [RECORD + 1, SSL_READ - 1, TLS_CHUNK_BYTES + 1, 3_000_017, 9_999_991, 20_000_003]
    with (
        config.set(settings),
        LocalCluster(workers=TLS_WORKERS) as cluster,
        Client(cluster) as client,
    ):
        assert cluster.scheduler_address.startswith("tls://")
        made = [
            client.submit(random_bytes, size, seed, resources={"A" if seed % 2 else "B": 1})
            for seed, size in enumerate(sizes)
        ]
        # Each task on c needs arrays from both a and b; the client gathers them all meanwhile.
        pairs = [
            client.submit(digest, made[i], made[(i + 1) % len(made)], resources={"C": 1})
            for i in range(len(made))
        ]
        gathered = client.gather(made)
        expected = [digest(random_bytes(size, seed))[0] for seed, size in enumerate(sizes)]
        assert [digest(array)[0] for array in gathered] == expected
        for i, pair in enumerate(pairs):
            assert pair.result(timeout=120) == [expected[i], expected[(i + 1) % len(made)]]
        assert client.check_invariants() == []
