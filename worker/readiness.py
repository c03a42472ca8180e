"""Whether a worker is connected to its scheduler, answered over HTTP for probes.

``GET /ready`` answers 200 while the worker is connected to its scheduler (the scheduler
accepted its handshake and the connection is open) and 503 with the reason otherwise:
not connected yet, or the scheduler was lost and the worker is dialling again. The
Kubernetes operator points each worker pod's readiness probe at it (an ``httpGet``
probe, ``worker.readiness-port``), so a pod is Ready only while its worker is connected.

Why an endpoint the worker serves rather than a probe that asks the scheduler, or a file
the worker writes for an ``exec`` probe: the kubelet makes an ``httpGet`` probe itself,
one small request on a connection it opens, so a check costs a few hundred microseconds
of the worker's event loop and no process at all. Any ``exec`` probe (even ``test -f``)
starts a process in the container through the container runtime on every check, every
few seconds for every worker of the node; asking the scheduler also made each check load
the scheduler.

Plain HTTP also in a TLS cluster: the kubelet presents no client certificate, and the
answer says only whether this worker is connected. It listens on the worker's contact
host (the pod's IP), not on every interface: pods that share a network namespace (the
test kubelet runs them as processes of one host) each have a port of their own that way.
"""

from __future__ import annotations

import logging

from tornado.httpserver import HTTPServer
from tornado.httputil import HTTPHeaders, HTTPServerRequest, ResponseStartLine

from apportion import config

logger = logging.getLogger("apportion.worker")

PATH = "/ready"


class Readiness:
    """The worker's connection state (set by the worker's edge) and the HTTP server that
    reports it."""

    def __init__(self) -> None:
        self.problem: str | None = "not connected to a scheduler yet"
        self._server: HTTPServer | None = None

    @property
    def ready(self) -> bool:
        return self.problem is None

    def connected(self) -> None:
        self.problem = None

    def lost(self, reason: str) -> None:
        self.problem = f"lost the scheduler ({reason}); connecting again"

    def start(self, host: str) -> None:
        """Serve GET /ready on host, port ``worker.readiness-port`` (on the running event
        loop); nothing when that is None."""
        port = config.get("worker.readiness-port")
        if port is None:
            return
        server = HTTPServer(self._answer)
        try:
            server.listen(port, host)
        except OSError as exc:
            raise OSError(
                f"worker.readiness-port {port} on {host} cannot be served ({exc.strerror}): "
                "give each worker a port of its own, or None for no readiness endpoint"
            ) from None
        self._server = server
        logger.info("readiness at http://%s:%d%s", host, port, PATH)

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def answer(self, path: str) -> tuple[int, str]:
        """The status code and body for a GET of ``path``."""
        if path != PATH:
            return 404, f"not found: {path} (GET {PATH} tells whether this worker is connected)"
        if self.problem is None:
            return 200, "connected to the scheduler"
        return 503, self.problem

    def _answer(self, request: HTTPServerRequest) -> None:
        code, text = self.answer(request.path)
        body = f"{text}\n".encode()
        headers = HTTPHeaders(
            {"Content-Type": "text/plain; charset=utf-8", "Content-Length": str(len(body))}
        )
        reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[code]
        connection = request.connection
        assert connection is not None
        connection.write_headers(ResponseStartLine("HTTP/1.1", code, reason), headers, body)
        connection.finish()
