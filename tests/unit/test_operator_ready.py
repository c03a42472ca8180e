"""The worker pods' readiness probe: ready means connected, against a real HTTP server."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

WORKERS = {"tcp://10.0.0.1:4000": {"name": "c-gpu-0"}, "tcp://10.0.0.2:4000": {"name": "c-gpu-1"}}


class Info(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"workers": WORKERS}).encode()
        self.send_response(200 if self.path == "/api/v1/info" else 404)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def scheduler() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Info)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def probe(pod: str, base: str) -> subprocess.CompletedProcess[str]:
    env = {"POD_NAME": pod, "APPORTION_SCHEDULER_HTTP": base, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "apportion.operator.ready"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_a_connected_worker_is_ready(scheduler: str) -> None:
    assert probe("c-gpu-1", scheduler).returncode == 0


def test_a_worker_the_scheduler_does_not_know_is_not_ready(scheduler: str) -> None:
    result = probe("c-gpu-7", scheduler)
    assert result.returncode == 1
    assert "c-gpu-7 is not connected" in result.stderr


def test_no_scheduler_means_not_ready() -> None:
    result = probe("c-gpu-0", "http://127.0.0.1:9")
    assert result.returncode == 1 and "not answering" in result.stderr
