"""A small Kubernetes REST client on the standard library (mutual TLS, JSON, watch).

Enough for the process kubelet and the harness: no generated models, no dependency that
could pick a surprising patch content type.
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"

Obj = dict[str, Any]


class ApiError(RuntimeError):
    def __init__(self, status: int, body: str, method: str, path: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Credentials:
    server: str  # https://127.0.0.1:PORT
    ca: Path
    cert: Path
    key: Path

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Credentials:
        config = yaml.safe_load(path.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        return cls(
            server=cluster["server"],
            ca=Path(cluster["certificate-authority"]),
            cert=Path(user["client-certificate"]),
            key=Path(user["client-key"]),
        )


class Client:
    def __init__(self, creds: Credentials, timeout: float = 30.0) -> None:
        url = urllib.parse.urlsplit(creds.server)
        self._host = url.hostname or "127.0.0.1"
        self._port = url.port or 443
        self._timeout = timeout
        self._ssl = ssl.create_default_context(cafile=str(creds.ca))
        self._ssl.load_cert_chain(str(creds.cert), str(creds.key))

    def _connection(self, timeout: float | None) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            self._host, self._port, context=self._ssl, timeout=timeout
        )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        if query:
            path = f"{path}?{urllib.parse.urlencode(query)}"
        conn = self._connection(self._timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Accept": "application/json"}
            if data is not None:
                headers["Content-Type"] = content_type
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            text = response.read().decode()
        finally:
            conn.close()
        if response.status >= 300:
            raise ApiError(response.status, text, method, path)
        if not response.getheader("Content-Type", "").startswith("application/json"):
            return text  # e.g. /readyz answers "ok"
        return json.loads(text) if text else None

    def get(self, path: str, **query: str) -> Obj:
        return self.request("GET", path, query=query or None)

    def get_or_none(self, path: str) -> Obj | None:
        try:
            return self.get(path)
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def create(self, path: str, obj: Obj) -> Obj:
        return self.request("POST", path, obj)

    def merge_patch(self, path: str, patch: Obj) -> Obj:
        return self.request("PATCH", path, patch, content_type=MERGE_PATCH)

    def strategic_patch(self, path: str, patch: Obj) -> Obj:
        return self.request("PATCH", path, patch, content_type=STRATEGIC_PATCH)

    def delete(self, path: str, body: Obj | None = None) -> Obj | None:
        try:
            return self.request("DELETE", path, body)
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def watch(self, path: str, resource_version: str, timeout_s: int = 60) -> Iterator[Obj]:
        """Yields watch events ({type, object}) until the server ends the stream."""
        query = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        conn = self._connection(timeout_s + 30)
        try:
            conn.request("GET", f"{path}?{urllib.parse.urlencode(query)}")
            response = conn.getresponse()
            if response.status >= 300:
                raise ApiError(response.status, response.read().decode(), "WATCH", path)
            # The body is newline-delimited JSON; readline() de-chunks transparently.
            while line := response.readline():
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()


def pod_path(namespace: str, name: str = "") -> str:
    base = f"/api/v1/namespaces/{namespace}/pods"
    return f"{base}/{name}" if name else base
