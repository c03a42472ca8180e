"""The kubelet's HTTPS endpoint, just enough for `kubectl logs [-f] [--tail N]` (the API
server proxies /containerLogs/<ns>/<pod>/<container> to the node's kubeletEndpoint) and a
WebSocket port-forward (/portForward/<ns>/<pod>, see portforward.py)."""

from __future__ import annotations

import http.server
import logging
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from . import portforward

log = logging.getLogger("kubelet.server")


def _latest_log(pods_dir: Path, namespace: str, pod: str, container: str) -> Path | None:
    candidates = sorted(
        (pods_dir / namespace / pod).glob(f"*/{container}.log"), key=lambda p: p.stat().st_mtime
    )
    return candidates[-1] if candidates else None


def serve(
    port: int,
    cert: Path,
    key: Path,
    pods_dir: Path,
    is_running: Callable[[str, str], bool],
    pod_ip: Callable[[str, str], str | None] = lambda namespace, name: None,
) -> http.server.ThreadingHTTPServer:
    """Starts the server on a daemon thread and returns it."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *args: object) -> None:
            log.debug(fmt, *args)

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            parts = url.path.strip("/").split("/")
            if len(parts) == 3 and parts[0] == "portForward":
                self._port_forward(parts[1], parts[2], urllib.parse.parse_qs(url.query))
                return
            if len(parts) != 4 or parts[0] != "containerLogs":
                self.send_error(404, "only /containerLogs/<ns>/<pod>/<container> is served")
                return
            _, namespace, pod, container = parts
            query = urllib.parse.parse_qs(url.query)
            path = _latest_log(pods_dir, namespace, pod, container)
            if path is None:
                self.send_error(404, f"no log for {namespace}/{pod}/{container}")
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            data = path.read_bytes()
            if "tailLines" in query:
                lines = data.splitlines(keepends=True)
                data = b"".join(lines[-int(query["tailLines"][0]) :]) if lines else b""
            self.wfile.write(data)
            if query.get("follow", ["false"])[0] == "true":
                self._follow(path, path.stat().st_size, namespace, pod)

        def _port_forward(self, namespace: str, pod: str, query: dict[str, list[str]]) -> None:
            ip = pod_ip(namespace, pod)
            ports = query.get("port") or query.get("ports") or []
            if ip is None or len(ports) != 1 or "websocket" not in self.headers.get("Upgrade", ""):
                self.send_error(400, "one port of a running pod, over a WebSocket, is served")
                return
            port = int(ports[0])
            try:
                target = socket.create_connection((ip, port), timeout=10)
            except OSError as exc:
                self.send_error(502, f"cannot connect to {ip}:{port}: {exc}")
                return
            target.settimeout(None)
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header(
                "Sec-WebSocket-Accept", portforward.accept_key(self.headers["Sec-WebSocket-Key"])
            )
            self.send_header("Sec-WebSocket-Protocol", portforward.PROTOCOL)
            self.end_headers()
            self.wfile.flush()
            portforward.relay(self.rfile, self.connection.sendall, port, target)
            self.close_connection = True

        def _follow(self, path: Path, offset: int, namespace: str, pod: str) -> None:
            with path.open("rb") as log_file:
                log_file.seek(offset)
                while True:
                    chunk = log_file.read()
                    if chunk:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                    elif not is_running(namespace, pod):
                        self.wfile.write(log_file.read())  # what came before the exit
                        return
                    else:
                        time.sleep(0.2)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="kubelet-server", daemon=True).start()
    return server
