"""The kubelet's HTTPS endpoint, just enough for `kubectl logs [-f] [--tail N]`: the API
server proxies /containerLogs/<ns>/<pod>/<container> to the node's kubeletEndpoint."""

from __future__ import annotations

import http.server
import logging
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

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
) -> http.server.ThreadingHTTPServer:
    """Starts the server on a daemon thread and returns it."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *args: object) -> None:
            log.debug(fmt, *args)

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            parts = url.path.strip("/").split("/")
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
