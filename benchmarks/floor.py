"""What the machine itself allows: a round trip between two processes, and a CPU loop.

Every system's latency is bounded below by the operating system's round trip between
processes, and every system's throughput scales with the CPU; both vary between
machines by several times (virtual machines especially). Recording them beside the
results makes runs on different machines comparable.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import shutil
import socket
import ssl
import statistics
import tempfile
import time
import traceback
from collections import deque
from pathlib import Path
from typing import cast

from benchmarks import tls

ROUND_TRIPS = 2_000
# Where the receiver of loopback_tcp_mb_per_s puts the bytes.
RECEIVERS = ("cached", "made", "new")
# Loopback TCP samples taken each time (before each repetition of a run): on a virtual
# machine one sample swings by 2.5x within an hour (1,842-4,703 MB/s on the development
# machine), so the figure the data rows are read against is the median over the run.
LOOPBACK_SAMPLES = 3


def _echo(sock: socket.socket) -> None:
    while data := sock.recv(64):
        sock.send(data)


def round_trip_us(count: int = ROUND_TRIPS) -> dict[str, float]:
    """p50 and p99 of a one-byte ping-pong with a forked process, in microseconds."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the echoing child
        ours.close()
        try:
            _echo(theirs)
        finally:
            os._exit(0)
    theirs.close()
    times = []
    try:
        for _ in range(count):
            start = time.perf_counter()
            ours.send(b"x")
            ours.recv(64)
            times.append(time.perf_counter() - start)
    finally:
        ours.close()
        os.waitpid(pid, 0)
    times.sort()
    return {
        "p50": round(times[len(times) // 2] * 1e6, 1),
        "p99": round(times[int(len(times) * 0.99)] * 1e6, 1),
    }


def cpu_loop_s(n: int = 10_000_000) -> float:
    """Seconds for ``sum(range(n))`` in this interpreter: the CPU's speed for Python."""
    start = time.perf_counter()
    sum(range(n))
    return round(time.perf_counter() - start, 3)


def _drain(sock: socket.socket, nbytes: int) -> None:
    buffer = bytearray(1 << 20)
    left = nbytes
    while left:
        left -= sock.recv_into(buffer, min(left, len(buffer)))
    sock.sendall(b"x")


def receive_buffer(nbytes: int, made: bool) -> memoryview:
    """A buffer for ``nbytes`` received at once: its pages ``made`` (every one written)
    before the bytes come, or new memory, whose pages the system makes as the bytes are
    copied in, as for any receiver of a value that keeps no memory at hand."""
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if made:
        memory.write(bytes(nbytes))  # (a bytearray of the size would make them too)
    return memoryview(memory)


def _receive_whole(sock: socket.socket, nbytes: int, made: bool) -> None:
    buffer = receive_buffer(nbytes, made)
    sock.sendall(b"r")  # ready: the sender's clock starts after the buffer exists
    got = 0
    while got < nbytes:
        got += sock.recv_into(buffer[got:], nbytes - got)
    sock.sendall(b"x")


def loopback_tcp_mb_per_s(nbytes: int = 200_000_000, into: str = "cached") -> float:
    """One process sends ``nbytes`` to another over loopback TCP (the data plane's bound).

    ``into="cached"``: from a 4 MiB buffer sent again and again into a 1 MiB buffer read
    into again and again: both stay in the CPU's caches and the receiver's pages exist
    already, so this is the socket's own limit. Otherwise from one buffer of ``nbytes``
    (made before timing, as a worker's result is) into one buffer of ``nbytes`` in the
    receiver: ``"made"``, whose pages the receiver made before the clock started (memory
    kept at hand), or ``"new"``, new memory whose pages the system makes as the bytes
    arrive: what handing a value of that size to another process costs at least, the
    shape of every transfer in the data workload.
    """
    if into not in RECEIVERS:
        raise ValueError(f"into={into!r}: expected one of {RECEIVERS}")
    whole = into != "cached"
    listener = socket.create_server(("127.0.0.1", 0))
    pid = os.fork()
    if pid == 0:  # the receiver
        try:
            conn, _ = listener.accept()
            if whole:
                _receive_whole(conn, nbytes, made=into == "made")
            else:
                _drain(conn, nbytes)
        finally:
            os._exit(0)
    try:
        conn = socket.create_connection(listener.getsockname())
        chunk = memoryview(bytearray(b"\x01") * nbytes if whole else bytearray(1 << 22))
        if whole:
            conn.recv(1)  # the receiver's buffer exists
        start = time.perf_counter()
        sent = 0
        while sent < nbytes:
            sent += conn.send(chunk[sent:nbytes] if whole else chunk[: nbytes - sent])
        conn.recv(1)
        elapsed = time.perf_counter() - start
        conn.close()
    finally:
        listener.close()
        os.waitpid(pid, 0)
    return round(nbytes / 1e6 / elapsed, 1)


# What a connection moves before the timed transfers of warm_transfers_mb_per_s: enough for
# the kernel to have grown its windows and buffers, as a cluster's connections have.
WARM_UP_BYTES = 16_000_000


def warm_transfers_mb_per_s(nbytes: int, count: int) -> list[float]:
    """``count`` transfers of ``nbytes`` from one process to another over one loopback TCP
    connection that moved bytes before, each into new memory of that size in the receiver
    (its pages made as the bytes arrive): the shape of a data row's transfer, in the
    arrangement of a cluster's processes, whose connections are long-lived.

    A new connection (``loopback_tcp_mb_per_s``) starts with small windows and buffers
    that the kernel grows as bytes flow: a 1 MB transfer over one took about twice as long
    as over a connection used before on the development machine, and a row's connection
    is never new."""
    sizes = [min(nbytes, WARM_UP_BYTES)] + [nbytes] * count
    listener = socket.create_server(("127.0.0.1", 0))
    pid = os.fork()
    if pid == 0:  # the receiver
        try:
            conn, _ = listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for size in sizes:
                _receive_whole(conn, size, made=False)
        finally:
            os._exit(0)
    try:
        conn = socket.create_connection(listener.getsockname())
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        chunk = memoryview(bytearray(b"\x01") * nbytes)
        figures = []
        for index, size in enumerate(sizes):
            conn.recv(1)  # the receiver's buffer exists
            start = time.perf_counter()
            sent = 0
            while sent < size:
                sent += conn.send(chunk[sent:size])
            conn.recv(1)
            if index:
                figures.append(round(size / 1e6 / (time.perf_counter() - start), 1))
        conn.close()
    finally:
        listener.close()
        os.waitpid(pid, 0)
    return figures


# Over TLS: what the interpreter's own TLS allows, with no system around it.
TLS_RECEIVERS = ("made", "new")
# What the sender hands the transport at once: as apportion's comms do (see
# apportion/protocol/paced.py), so that encrypting one chunk overlaps decrypting the last.
TLS_CHUNK_BYTES = 1 << 20
TLS_TRANSFERS_TIMEOUT_S = 300  # all of them, even on a slow machine: else something broke


class _TLSReceiver(asyncio.BufferedProtocol):
    """Takes transfers of known sizes, each into a buffer of its own (receive_buffer,
    ``made`` or new), answering ``x`` once one is whole and ``r`` once the buffer for the
    next exists (so the sender's clock leaves out making it)."""

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
        self.buffer, self.got = receive_buffer(self.sizes.popleft(), self.made), 0
        self.transport.write(b"r")

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer[self.got :]

    def buffer_updated(self, nbytes: int) -> None:
        self.got += nbytes
        if self.got == self.buffer.nbytes:
            assert self.transport is not None
            self.transport.write(b"x")
            self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(exc or ConnectionError("sender closed early"))


class _TLSSender(asyncio.Protocol):
    """Writes a chunk at a time, the next once the transport passed the last on, and
    hears the receiver's answers."""

    def __init__(self) -> None:
        self._replies: asyncio.Queue[bool] = asyncio.Queue()
        self.drained: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).set_write_buffer_limits(high=1)

    def data_received(self, data: bytes) -> None:
        for _ in data:
            self._replies.put_nowait(True)

    def connection_lost(self, exc: Exception | None) -> None:
        self._replies.put_nowait(False)  # no answer will come

    async def reply(self) -> None:
        """The receiver's next answer (raises if it went instead)."""
        if not await self._replies.get():
            raise ConnectionError("the receiving process closed the connection")

    def pause_writing(self) -> None:
        self.drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        drained, self.drained = self.drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)


async def _receive_tls(
    listener: socket.socket, sizes: list[int], made: bool, context: ssl.SSLContext
) -> None:
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    receiver = _TLSReceiver(sizes, made)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(lambda: receiver, conn, ssl=context)
    await receiver.done
    transport.close()


async def _send_tls(
    address: tuple[str, int], sizes: list[int], context: ssl.SSLContext
) -> list[float]:
    conn = socket.create_connection(address)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sender = _TLSSender()
    transport, _ = await asyncio.get_running_loop().create_connection(
        lambda: sender, sock=conn, ssl=context, server_hostname="127.0.0.1"
    )
    payload = memoryview(bytearray(b"\x01") * max(sizes))  # made before the clock starts
    seconds = []
    for size in sizes:
        await sender.reply()  # the receiver's buffer exists
        start = time.perf_counter()
        for offset in range(0, size, TLS_CHUNK_BYTES):
            transport.write(payload[offset : min(size, offset + TLS_CHUNK_BYTES)])
            while sender.drained is not None:
                await sender.drained
        await sender.reply()  # whole over there
        seconds.append(time.perf_counter() - start)
    transport.close()
    return seconds


def loopback_tls_mb_per_s(
    files: tls.Certificates, nbytes: int = 100_000_000, into: str = "new", count: int = 3
) -> float:
    """The median MB/s of ``count`` transfers of ``nbytes`` from this process to a forked
    one over one mutual-TLS loopback connection through the event loop's TLS transport
    (apportion's loop: uvloop's where installed), after a warm-up transfer
    (``WARM_UP_BYTES``), each into a buffer of its size over there whose pages are
    ``"made"`` before the clock starts or ``"new"`` (as loopback_tcp_mb_per_s's
    receivers). No scheduler, frames or pickling: what any system decrypting through
    Python's ``ssl`` on this machine can reach."""
    from apportion.aio import new_event_loop

    if into not in TLS_RECEIVERS:
        raise ValueError(f"into={into!r}: expected one of {TLS_RECEIVERS}")
    server, client = tls.mutual_tls_contexts(files)
    sizes = [min(nbytes, WARM_UP_BYTES)] + [nbytes] * count
    listener = socket.create_server(("127.0.0.1", 0))
    address = listener.getsockname()
    pid = os.fork()
    if pid == 0:  # the receiver
        status = 1
        try:
            loop = new_event_loop()
            loop.run_until_complete(_receive_tls(listener, sizes, into == "made", server))
            status = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(status)
    # Only the receiver holds the listener now: if it fails before accepting, connecting
    # is refused instead of waiting in a backlog nobody reads.
    listener.close()
    try:
        loop = new_event_loop()
        try:
            seconds = loop.run_until_complete(
                asyncio.wait_for(_send_tls(address, sizes, client), TLS_TRANSFERS_TIMEOUT_S)
            )
        finally:
            loop.close()
    finally:
        os.waitpid(pid, 0)
    return round(nbytes / 1e6 / statistics.median(seconds[1:]), 1)


def loopback_tls_figures(nbytes: int = 100_000_000) -> dict[str, float]:
    """loopback_tls_mb_per_s into each kind of buffer ({} without the ``openssl`` command
    to make certificates with)."""
    if shutil.which("openssl") is None:
        return {}
    with tempfile.TemporaryDirectory(prefix="apportion-floor-tls-") as keys:
        files = tls.make_certificates(Path(keys))
        return {into: loopback_tls_mb_per_s(files, nbytes, into) for into in TLS_RECEIVERS}


def memcpy_gb_per_s(nbytes: int = 200_000_000) -> float:
    source = bytearray(nbytes)
    target = bytearray(nbytes)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        target[:] = source
        best = min(best, time.perf_counter() - start)
    return round(nbytes / 1e9 / best, 2)


def loopback_samples(count: int = LOOPBACK_SAMPLES) -> list[float]:
    return [loopback_tcp_mb_per_s() for _ in range(count)]


def with_loopback_samples(floor: dict[str, object], samples: list[float]) -> dict[str, object]:
    """``floor`` with more loopback samples: its figure is the median of all of them."""
    before = floor.get("loopback_tcp_samples_mb_per_s")
    every = sorted([*(before if isinstance(before, list) else []), *samples])
    return {
        **floor,
        "loopback_tcp_mb_per_s": round(statistics.median(every), 1),
        "loopback_tcp_samples_mb_per_s": every,
    }


def shape_samples(sizes_mb: tuple[int, ...]) -> dict[str, list[float]]:
    """Loopback TCP into new memory of each size of the data workload (MB/s), over a
    connection used before (``warm_transfers_mb_per_s``): the floor each of its transfer
    rows is read against. Small transfers swing most from sample to sample, so they are
    sampled more."""
    return {
        str(mb): warm_transfers_mb_per_s(mb * 1_000_000, 5 if mb < 100 else 1) for mb in sizes_mb
    }


def with_shape_samples(
    floor: dict[str, object], samples: dict[str, list[float]]
) -> dict[str, object]:
    """``floor`` with more samples of each size's shape: each figure is the median of all
    the samples of its size taken in the run."""
    before = floor.get("shape_samples_mb_per_s")
    every: dict[str, list[float]] = dict(before) if isinstance(before, dict) else {}
    for size, taken in samples.items():
        every[size] = sorted([*every.get(size, []), *taken])
    return {
        **floor,
        "shape_samples_mb_per_s": every,
        "shape_new_mb_per_s": {
            size: round(statistics.median(values), 1) for size, values in every.items()
        },
    }


def shape_floor(floor: dict[str, object] | None, mb: int) -> float | None:
    """The floor of a transfer of ``mb`` MB measured in the run (None if it was not)."""
    shapes = (floor or {}).get("shape_new_mb_per_s")
    value = shapes.get(str(mb)) if isinstance(shapes, dict) else None
    return float(value) if value else None


def measure(sizes_mb: tuple[int, ...] = ()) -> dict[str, object]:
    return {
        "round_trip_us": round_trip_us(),
        "cpu_loop_s": min(cpu_loop_s() for _ in range(3)),
        **with_loopback_samples({}, loopback_samples()),
        # The largest array of the data workload, as it travels: into a buffer of its size,
        # whose pages exist already, or new memory (what a receiver of a value gets).
        "loopback_tcp_400mb_made_mb_per_s": loopback_tcp_mb_per_s(400_000_000, into="made"),
        "loopback_tcp_400mb_new_mb_per_s": loopback_tcp_mb_per_s(400_000_000, into="new"),
        "memcpy_gb_per_s": memcpy_gb_per_s(),
        # What TLS rows are read against: encrypting (or decrypting) alone, per cipher, and
        # the interpreter's own TLS transport with no system around it.
        "aes_gcm_16kb_mb_per_s": tls.openssl_speed(),
        "loop_tls_100mb_mb_per_s": loopback_tls_figures(),
    } | with_shape_samples({}, shape_samples(sizes_mb))


def describe(floor: dict[str, object] | None) -> str:
    """One sentence for the reports ('' for results recorded before this was measured)."""
    if not floor:
        return ""
    trip = floor["round_trip_us"]
    assert isinstance(trip, dict)
    return (
        (
            f"Machine floor: a process-to-process round trip takes {trip['p50']:g} µs (p50) / "
            f"{trip['p99']:g} µs (p99); sum(range(10**7)) takes {floor['cpu_loop_s']:g} s."
        )
        + (
            f" Loopback TCP moves {floor['loopback_tcp_mb_per_s']:g} MB/s between two processes"
            f"{_spread(floor)}; memcpy {floor['memcpy_gb_per_s']:g} GB/s."
            if "loopback_tcp_mb_per_s" in floor
            else ""
        )
        + _whole_transfers(floor)
        + _shapes(floor)
        + tls.describe(floor.get("aes_gcm_16kb_mb_per_s"))
        + _tls_transport(floor)
    )


def _tls_transport(floor: dict[str, object]) -> str:
    figures = floor.get("loop_tls_100mb_mb_per_s")
    if not isinstance(figures, dict) or set(figures) != set(TLS_RECEIVERS):
        return ""  # (results from before it was measured, or no openssl command)
    return (
        f" The event loop's TLS transport alone (no system around it), 100 MB from one"
        f" process to another over a connection used before: {figures['made']:,.0f} MB/s into"
        f" memory made before, {figures['new']:,.0f} MB/s into new memory (apportion's TLS"
        f" rows go through this transport)."
    )


def _shapes(floor: dict[str, object]) -> str:
    shapes = floor.get("shape_new_mb_per_s")
    if not isinstance(shapes, dict) or not shapes:
        return ""
    each = ", ".join(f"{size} MB {value:,.0f}" for size, value in shapes.items())
    return (
        f" Loopback TCP into new memory of each data transfer's size, over a connection "
        f"used before (the floor of its rows, medians over the run): {each} MB/s."
    )


def _spread(floor: dict[str, object]) -> str:
    samples = floor.get("loopback_tcp_samples_mb_per_s")
    if not isinstance(samples, list) or len(samples) < 2:
        return ""  # (results from before: one sample)
    return f" (median of {len(samples)} samples over the run, {min(samples):g}-{max(samples):g})"


def _whole_transfers(floor: dict[str, object]) -> str:
    said = " 400 MB from one buffer into another in the other process:"
    if "loopback_tcp_400mb_new_mb_per_s" in floor:
        return (
            f"{said} {floor['loopback_tcp_400mb_made_mb_per_s']:g} MB/s into memory made before,"
            f" {floor['loopback_tcp_400mb_new_mb_per_s']:g} MB/s into new memory (pages made"
            " as the bytes arrive)."
        )
    if "loopback_tcp_whole_400mb_mb_per_s" in floor:  # results from before: pages made before
        return f"{said} {floor['loopback_tcp_whole_400mb_mb_per_s']:g} MB/s."
    return ""
