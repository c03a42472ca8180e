"""A worker's readiness endpoint (worker.readiness-port) follows its connection to the
scheduler: real worker and scheduler processes on loopback, the scheduler killed and
started again."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from apportion.process import EXIT_STARTUP_FAILED
from tests.conftest import wait_until

APPORTION = [sys.executable, "-m", "apportion"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(port: int, path: str = "/ready") -> tuple[int, str]:
    """The status and body of GET path, or (0, why) when nothing answers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        return reply.status, reply.read().decode()
    except OSError as exc:
        return 0, repr(exc)
    finally:
        conn.close()


def start(args: list[str], **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*APPORTION, *args],
        env={**os.environ, "APPORTION_LOG_LEVEL": "WARNING", **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def ports() -> tuple[int, int]:
    return free_port(), free_port()


@pytest.fixture
def worker(ports: tuple[int, int]) -> Iterator[subprocess.Popen[str]]:
    scheduler_port, ready_port = ports
    process = start(
        ["worker", f"tcp://127.0.0.1:{scheduler_port}", "--no-auth", "--name", "probed"],
        APPORTION_WORKER__READINESS_PORT=str(ready_port),
    )
    yield process
    stop(process)


def scheduler(port: int) -> subprocess.Popen[str]:
    return start(["scheduler", "--port", str(port), "--http-port", "0", "--no-auth"])


def test_ready_only_while_connected_to_the_scheduler(
    worker: subprocess.Popen[str], ports: tuple[int, int]
) -> None:
    scheduler_port, ready_port = ports
    code, text = wait_until(lambda: (r := get(ready_port))[0] and r, what="the endpoint up")
    assert (code, text) == (503, "not connected to a scheduler yet\n")

    first = scheduler(scheduler_port)
    try:
        wait_until(lambda: get(ready_port)[0] == 200, timeout=60, what="ready once connected")
        assert get(ready_port)[1] == "connected to the scheduler\n"
        assert get(ready_port, "/metrics")[0] == 404
    finally:
        first.kill()
        first.wait()
    code, text = wait_until(
        lambda: (r := get(ready_port))[0] != 200 and r, what="not ready once the scheduler died"
    )
    assert code == 503 and text.startswith("lost the scheduler (") and "connecting again" in text

    second = scheduler(scheduler_port)
    try:
        wait_until(lambda: get(ready_port)[0] == 200, timeout=60, what="ready again")
    finally:
        stop(second)
    assert worker.poll() is None, "the worker kept running throughout"


def test_a_readiness_port_in_use_stops_the_worker_saying_so() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [*APPORTION, "worker", f"tcp://127.0.0.1:{free_port()}", "--no-auth"],
            env={**os.environ, "APPORTION_WORKER__READINESS_PORT": str(port)},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == EXIT_STARTUP_FAILED, result.stderr
    assert f"worker.readiness-port {port} on 127.0.0.1 cannot be served" in result.stderr
    assert "Traceback" not in result.stderr
