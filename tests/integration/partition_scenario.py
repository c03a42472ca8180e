"""A network partition between a worker and its scheduler, on loopback only: run inside a
network namespace of its own (``unshare --net python -m tests.integration.partition_scenario``)
by tests/integration/test_partition.py. Prints one JSON line with what it saw.

The worker dials the scheduler at 127.0.0.2, the client at 127.0.0.1, so that one pair of
iptables rules cuts the worker's connection alone; DROP, not REJECT: no RST comes, as when
a host vanishes.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time

from apportion import Client

APPORTION = [sys.executable, "-m", "apportion"]
HEARTBEAT = 1.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _rules(action: str, port: int) -> None:
    for match in (
        ["-d", "127.0.0.2", "--dport", str(port)],
        ["-s", "127.0.0.2", "--sport", str(port)],
    ):
        subprocess.run(["iptables", action, "INPUT", "-p", "tcp", *match, "-j", "DROP"], check=True)


def _lines(stream: object, into: queue.Queue[tuple[float, str]]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        into.put((time.monotonic(), line))


def _wait_for(lines: queue.Queue[tuple[float, str]], text: str, timeout: float) -> float:
    """When a worker log line containing ``text`` was written (monotonic time)."""
    deadline = time.monotonic() + timeout
    while True:
        at, line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        if text in line:
            return at


def main() -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    port, token = _free_port(), "partition-token"
    env = {
        **os.environ,
        "APPORTION_TOKEN": token,
        "APPORTION_WORKER__HEARTBEAT_INTERVAL": str(HEARTBEAT),
        "APPORTION_LOG_LEVEL": "INFO",
    }
    scheduler = subprocess.Popen(
        [*APPORTION, "scheduler", "--port", str(port)],
        env=env,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    worker = subprocess.Popen(
        [*APPORTION, "worker", f"tcp://127.0.0.2:{port}", "--name", "cut", "--host", "127.0.0.1"],
        env=env,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[tuple[float, str]] = queue.Queue()
    threading.Thread(target=_lines, args=(worker.stderr, lines), daemon=True).start()
    try:
        _wait_for(lines, "connected to", timeout=60)
        with Client(f"tcp://127.0.0.1:{port}", token=token) as client:
            before = client.map(lambda x: x * 2, range(10))
            assert client.gather(before) == [x * 2 for x in range(10)]

            _rules("-A", port)
            cut_at = time.monotonic()
            noticed_at = _wait_for(lines, "lost the scheduler", timeout=120)
            during = client.submit(lambda: "made during the cut")

            _rules("-D", port)
            healed_at = time.monotonic()
            reconnected_at = _wait_for(lines, "connected to", timeout=120)
            result = {
                "noticed_after_s": noticed_at - cut_at,
                "reconnected_after_s": reconnected_at - healed_at,
                "during": during.result(timeout=120),
                "before": [future.result(timeout=120) for future in before],
                "invariants": client.check_invariants(),
            }
    finally:
        for process in (worker, scheduler):
            process.terminate()
            process.wait(timeout=30)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
