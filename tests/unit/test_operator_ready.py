"""The worker pods' readiness probe: ready means connected, against a real HTTP server."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from apportion.operator.manifests import worker_pod
from apportion.operator.spec import parse

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


def probe(pod: str, base: str, *options: str) -> subprocess.CompletedProcess[str]:
    """The probe exactly as the worker pods run it (their interpreter named ``python``)."""
    (command,) = [c for c in worker_pod_containers() if c["name"] == "worker"]
    python, *rest = command["readinessProbe"]["exec"]["command"]
    assert python == "python"
    env = {"POD_NAME": pod, "APPORTION_SCHEDULER_HTTP": base, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, *options, *rest], env=env, capture_output=True, text=True, timeout=30
    )


def worker_pod_containers() -> list[dict]:
    spec = parse("c", "ml", {"workerGroups": [{"name": "gpu", "replicas": 1}]})
    owner = {"apiVersion": "apportion.dev/v1alpha1", "kind": "ResourceCluster",
             "metadata": {"name": "c", "namespace": "ml", "uid": "u"}}  # fmt: skip
    return worker_pod(spec, spec.groups[0], 0, owner)["spec"]["containers"]


def test_a_connected_worker_is_ready(scheduler: str) -> None:
    assert probe("c-gpu-1", scheduler).returncode == 0


def test_a_worker_the_scheduler_does_not_know_is_not_ready(scheduler: str) -> None:
    result = probe("c-gpu-7", scheduler)
    assert result.returncode == 1
    assert "c-gpu-7 is not connected" in result.stderr


def test_the_probe_imports_only_the_standard_library(scheduler: str) -> None:
    result = probe("c-gpu-1", scheduler, "-X", "importtime")
    assert result.returncode == 0
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines()}
    assert "json" in imported and "urllib.request" in imported  # the report is complete
    assert not {m for m in imported if m.split(".")[0] in ("apportion", "kopf", "kubernetes")}


def test_no_scheduler_means_not_ready() -> None:
    result = probe("c-gpu-0", "http://127.0.0.1:9")
    assert result.returncode == 1 and "not answering" in result.stderr
