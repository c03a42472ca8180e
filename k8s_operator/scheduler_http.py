"""The operator's calls to a cluster's scheduler HTTP API: one place that builds the URL,
sends the cluster's bearer token and reads the JSON answer."""

from __future__ import annotations

import json
import ssl
import urllib.request
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SchedulerHttp:
    """A scheduler's HTTP API as the operator reaches it: the scheduler pod's address, the
    cluster's token, and (for a TLS cluster) the context holding the cluster's client
    certificate."""

    host: str
    port: int
    token: str | None = None
    tls: ssl.SSLContext | None = None

    @property
    def base(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def call(self, path: str, body: Any = None, timeout: float = 3.0) -> Any:
        """GET ``path`` (or POST ``body`` as JSON); the decoded answer, None when empty.
        Raises OSError (unreachable, refused, HTTP errors) or ValueError (not JSON)."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(f"{self.base}{path}", data, headers)
        with urllib.request.urlopen(request, timeout=timeout, context=self.tls) as reply:
            answer = reply.read()
        return json.loads(answer) if answer.strip() else None
