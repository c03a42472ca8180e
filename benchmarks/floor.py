"""What the machine itself allows: a round trip between two processes, and a CPU loop.

Every system's latency is bounded below by the operating system's round trip between
processes, and every system's throughput scales with the CPU; both vary between
machines by several times (virtual machines especially). Recording them beside the
results makes runs on different machines comparable.
"""

from __future__ import annotations

import os
import socket
import time

ROUND_TRIPS = 2_000


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


def _receive_whole(sock: socket.socket, nbytes: int) -> None:
    """Into a new buffer of the whole size, as a receiver of a value must."""
    buffer = memoryview(bytearray(nbytes))
    got = 0
    while got < nbytes:
        got += sock.recv_into(buffer[got:], nbytes - got)
    sock.sendall(b"x")


def loopback_tcp_mb_per_s(nbytes: int = 200_000_000, whole: bool = False) -> float:
    """One process sends ``nbytes`` to another over loopback TCP (the data plane's bound).

    By default from a 4 MiB buffer sent again and again into a 1 MiB buffer read into
    again and again: both stay in the CPU's caches and the receiver's pages exist
    already, so this is the socket's own limit. ``whole``: from one buffer of ``nbytes``
    (made before timing, as a worker's result is) into a new one of ``nbytes`` in the
    receiver, whose pages the system makes as the bytes arrive: what handing a value of
    that size to another process takes at least, the shape of every transfer in the
    data workload.
    """
    listener = socket.create_server(("127.0.0.1", 0))
    pid = os.fork()
    if pid == 0:  # the receiver
        try:
            conn, _ = listener.accept()
            (_receive_whole if whole else _drain)(conn, nbytes)
        finally:
            os._exit(0)
    try:
        conn = socket.create_connection(listener.getsockname())
        chunk = memoryview(bytearray(b"\x01") * nbytes if whole else bytearray(1 << 22))
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


def memcpy_gb_per_s(nbytes: int = 200_000_000) -> float:
    source = bytearray(nbytes)
    target = bytearray(nbytes)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        target[:] = source
        best = min(best, time.perf_counter() - start)
    return round(nbytes / 1e9 / best, 2)


def measure() -> dict[str, object]:
    return {
        "round_trip_us": round_trip_us(),
        "cpu_loop_s": min(cpu_loop_s() for _ in range(3)),
        "loopback_tcp_mb_per_s": loopback_tcp_mb_per_s(),
        # The largest array of the data workload, as it travels: a new buffer receives it.
        "loopback_tcp_whole_400mb_mb_per_s": loopback_tcp_mb_per_s(400_000_000, whole=True),
        "memcpy_gb_per_s": memcpy_gb_per_s(),
    }


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
            f" Loopback TCP moves {floor['loopback_tcp_mb_per_s']:g} MB/s between two processes;"
            f" memcpy {floor['memcpy_gb_per_s']:g} GB/s."
            if "loopback_tcp_mb_per_s" in floor
            else ""
        )
        + (
            " 400 MB from one buffer into a new one in the other process:"
            f" {floor['loopback_tcp_whole_400mb_mb_per_s']:g} MB/s."
            if "loopback_tcp_whole_400mb_mb_per_s" in floor
            else ""
        )
    )
