"""The operator's one way of calling a scheduler's HTTP API, against a real HTTP server on
loopback."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from apportion.operator.scheduler_http import SchedulerHttp


class Recorder(BaseHTTPRequestHandler):
    seen: list[dict] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.seen.append(
            {
                "method": self.command,
                "path": self.path,
                "auth": self.headers.get("Authorization"),
                "type": self.headers.get("Content-Type"),
                "body": json.loads(self.rfile.read(length)) if length else None,
            }
        )
        if self.path == "/missing":
            self.send_error(404)
            return
        payload = b"" if self.path == "/empty" else json.dumps({"ok": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    Recorder.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_a_get_sends_the_token_and_decodes_the_answer(server: ThreadingHTTPServer) -> None:
    scheduler = SchedulerHttp("127.0.0.1", server.server_address[1], "s3cret")
    assert scheduler.base == f"http://127.0.0.1:{server.server_address[1]}"
    assert scheduler.call("/api/v1/info") == {"ok": "/api/v1/info"}
    assert Recorder.seen == [
        {"method": "GET", "path": "/api/v1/info", "auth": "Bearer s3cret", "type": None,
         "body": None}
    ]  # fmt: skip


def test_a_post_sends_json_and_no_token_when_the_cluster_has_none(
    server: ThreadingHTTPServer,
) -> None:
    scheduler = SchedulerHttp("127.0.0.1", server.server_address[1])
    assert scheduler.call("/empty", {"names": ["w-0"], "count": 1}) is None
    (seen,) = Recorder.seen
    assert seen["method"] == "POST" and seen["auth"] is None
    assert seen["type"] == "application/json"
    assert seen["body"] == {"names": ["w-0"], "count": 1}


def test_http_errors_are_raised_as_oserror(server: ThreadingHTTPServer) -> None:
    with pytest.raises(OSError, match="404"):
        SchedulerHttp("127.0.0.1", server.server_address[1], "t").call("/missing")
