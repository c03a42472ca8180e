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


def measure() -> dict[str, object]:
    return {"round_trip_us": round_trip_us(), "cpu_loop_s": min(cpu_loop_s() for _ in range(3))}


def describe(floor: dict[str, object] | None) -> str:
    """One sentence for the reports ('' for results recorded before this was measured)."""
    if not floor:
        return ""
    trip = floor["round_trip_us"]
    assert isinstance(trip, dict)
    return (
        f"Machine floor: a process-to-process round trip takes {trip['p50']:g} µs (p50) / "
        f"{trip['p99']:g} µs (p99); sum(range(10**7)) takes {floor['cpu_loop_s']:g} s."
    )
