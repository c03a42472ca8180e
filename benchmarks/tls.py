"""TLS for the data workload's TLS rows: one CA and one certificate, made with the
``openssl`` command and used by every system alike, and OpenSSL's own AES-GCM speed as the
reference those rows are read against (what encrypting, or decrypting, alone allows).

TLS 1.3 between two Python processes negotiates TLS_AES_256_GCM_SHA384 (OpenSSL's first
choice; Python offers no way to reorder TLS 1.3 suites): AES-256-GCM is the cipher the
rows pay for, AES-128-GCM the usual headline figure; both are printed.

And what the interpreter's own TLS allows, with no system around it
(``loop_transport_mb_per_s``): the event loop's TLS transport (uvloop's where installed, as
the systems' processes use) moving a value from one process into new memory in another over
a connection used before. A TLS row can only approach that figure: every system here
encrypts and decrypts through the same ``ssl`` module, which copies each record through
memory buffers on both sides.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import shutil
import socket
import ssl
import statistics
import subprocess
import tempfile
import time
import traceback
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import cast

CIPHERS = ("aes-128-gcm", "aes-256-gcm")
BLOCK_BYTES = 16_384  # a full TLS record's plaintext


@dataclass(frozen=True)
class Certificates:
    """PEM files: the CA, and a certificate for 127.0.0.1 (server and client) with its key."""

    ca: str
    cert: str
    key: str


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_certificates(directory: Path | None = None) -> Certificates:
    """A CA and one certificate signed by it for 127.0.0.1 / localhost, usable by servers
    and clients (mutual TLS), valid for a day."""
    where = Path(directory or tempfile.mkdtemp(prefix="apportion-bench-tls-"))
    ca, ca_key = where / "ca.pem", where / "ca-key.pem"
    cert, key, request = where / "cert.pem", where / "key.pem", where / "cert.csr"
    extensions = where / "cert.ext"
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req", "-x509", *curve, "-keyout", str(ca_key), "-out", str(ca), "-days", "1",
        "-subj", "/CN=apportion benchmark CA", "-addext", "basicConstraints=critical,CA:TRUE",
    )  # fmt: skip
    _openssl("req", *curve, "-keyout", str(key), "-out", str(request), "-subj", "/CN=127.0.0.1")
    extensions.write_text(
        "subjectAltName = IP:127.0.0.1, DNS:localhost\nextendedKeyUsage = serverAuth, clientAuth\n"
    )
    _openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(extensions),
    )  # fmt: skip
    return Certificates(str(ca), str(cert), str(key))


def openssl_speed(seconds: int = 1) -> dict[str, float]:
    """MB/s of ``openssl speed -evp CIPHER`` on 16 KB blocks, per cipher ({} without the
    ``openssl`` command)."""
    if shutil.which("openssl") is None:
        return {}
    speeds: dict[str, float] = {}
    for cipher in CIPHERS:
        out = subprocess.run(
            ["openssl", "speed", "-mr", "-evp", cipher, "-seconds", str(seconds),
             "-bytes", str(BLOCK_BYTES)],
            capture_output=True, text=True,
        ).stdout  # fmt: skip
        for line in out.splitlines():  # +F:<n>:<name>:<bytes per second>
            if line.startswith("+F:"):
                speeds[cipher] = round(float(line.rsplit(":", 1)[1]) / 1e6, 1)
    return speeds


def describe(speeds: object) -> str:
    """The sentence under the table ('' for results recorded before it was measured)."""
    if not isinstance(speeds, dict) or not speeds:
        return ""
    figures = ", ".join(f"{name.upper()} {mb:,.0f} MB/s" for name, mb in speeds.items())
    return f" OpenSSL on 16 KB blocks (openssl speed -evp): {figures}."


# What the sending side hands the transport at once: as apportion's comms do (see
# apportion/protocol/paced.py), so that encrypting one chunk overlaps decrypting the last.
CHUNK_BYTES = 1 << 20
WARM_UP_BYTES = 16_000_000  # moved first: the kernel's windows grown, as a cluster's are
TRANSFERS_TIMEOUT_S = 300  # all of them, even on a slow machine: else something broke


def _event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _contexts(files: Certificates) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts for mutual TLS, as the systems make them."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=files.ca)
    server.load_cert_chain(files.cert, files.key)
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=files.ca)
    client.load_cert_chain(files.cert, files.key)
    return server, client


class _Receiver(asyncio.BufferedProtocol):
    """Takes transfers of known sizes, each into a map of its own (``made``: its pages
    written before the transfer starts; else new memory, whose pages the kernel makes as
    the bytes are written), answering one byte once each is whole and the buffer for the
    next exists."""

    def __init__(self, sizes: list[int], made: bool) -> None:
        self.sizes = deque(sizes)
        self.made = made
        self.buffer = memoryview(b"")
        self.got = 0
        self.done = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports do not derive from asyncio.Transport, but behave as one)
        self.transport = cast(asyncio.Transport, transport)
        self._next()

    def _next(self) -> None:
        assert self.transport is not None
        if not self.sizes:
            self.done.set_result(None)
            return
        size = self.sizes.popleft()
        # Private, as floor.receive_buffer's (a shared map costs more to make)
        memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if self.made:
            memory.write(bytes(size))
        self.buffer, self.got = memoryview(memory), 0
        self.transport.write(b"r")  # ready: the sender's clock starts

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer[self.got :]

    def buffer_updated(self, nbytes: int) -> None:
        self.got += nbytes
        if self.got == self.buffer.nbytes:
            assert self.transport is not None
            self.transport.write(b"x")  # whole: the sender's clock stops
            self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(exc or ConnectionError("sender closed early"))


class _Sender(asyncio.Protocol):
    """Writes a chunk at a time, the next once the transport passed the last on."""

    def __init__(self) -> None:
        self.replies: asyncio.Queue[int] = asyncio.Queue()
        self.drained: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).set_write_buffer_limits(high=1)

    def data_received(self, data: bytes) -> None:
        for byte in data:
            self.replies.put_nowait(byte)

    def connection_lost(self, exc: Exception | None) -> None:
        self.replies.put_nowait(-1)  # the receiver went: no reply will come

    def pause_writing(self) -> None:
        self.drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        drained, self.drained = self.drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)


async def _receive(
    listener: socket.socket, sizes: list[int], made: bool, context: ssl.SSLContext
) -> None:
    sock, _ = listener.accept()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    receiver = _Receiver(sizes, made)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(lambda: receiver, sock, ssl=context)
    await receiver.done
    transport.close()


async def _send(address: tuple[str, int], sizes: list[int], context: ssl.SSLContext) -> list[float]:
    sock = socket.create_connection(address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sender = _Sender()
    transport, _ = await asyncio.get_running_loop().create_connection(
        lambda: sender, sock=sock, ssl=context, server_hostname="127.0.0.1"
    )
    payload = memoryview(bytearray(b"\x01") * max(sizes))  # made before the clock starts
    seconds = []
    for size in sizes:
        if await sender.replies.get() < 0:  # its buffer exists over there, or the receiver went
            raise ConnectionError("the receiving process closed the connection")
        start = time.perf_counter()
        for offset in range(0, size, CHUNK_BYTES):
            transport.write(payload[offset : min(size, offset + CHUNK_BYTES)])
            while sender.drained is not None:
                await sender.drained
        if await sender.replies.get() < 0:  # whole over there, or gone
            raise ConnectionError("the receiving process closed the connection")
        seconds.append(time.perf_counter() - start)
    transport.close()
    return seconds


RECEIVERS = ("made", "new")


def loop_transport_mb_per_s(
    files: Certificates, nbytes: int = 100_000_000, into: str = "new", count: int = 3
) -> float:
    """The median MB/s of ``count`` transfers of ``nbytes`` from this process to a forked
    one over one mutual-TLS loopback connection through the event loop's TLS transport,
    after a warm-up transfer (see the module's text), each into memory of its size over
    there: ``"made"`` (its pages written before the clock starts) or ``"new"`` (made as
    the bytes arrive), as floor.loopback_tcp_mb_per_s's receivers."""
    if into not in RECEIVERS:
        raise ValueError(f"into={into!r}: expected one of {RECEIVERS}")
    server, client = _contexts(files)
    sizes = [min(nbytes, WARM_UP_BYTES)] + [nbytes] * count
    listener = socket.create_server(("127.0.0.1", 0))
    address = listener.getsockname()
    pid = os.fork()
    if pid == 0:  # the receiver
        status = 1
        try:
            loop = _event_loop()
            loop.run_until_complete(_receive(listener, sizes, into == "made", server))
            status = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(status)
    # Only the receiver holds the listener now: if it fails before accepting, connecting
    # is refused instead of waiting in a backlog nobody reads.
    listener.close()
    try:
        loop = _event_loop()
        try:
            seconds = loop.run_until_complete(
                asyncio.wait_for(_send(address, sizes, client), TRANSFERS_TIMEOUT_S)
            )
        finally:
            loop.close()
    finally:
        os.waitpid(pid, 0)
    return round(nbytes / 1e6 / statistics.median(seconds[1:]), 1)
