"""What bounds the scheduler's HTTP port for a stranger, and the headers every response
carries.

A request's body is refused from its ``Content-Length`` before it is read when it is larger
than any route takes (the routes' bodies are small JSON), so an unauthenticated peer cannot
make the scheduler buffer megabytes; a connection that sends no request for
``IDLE_TIMEOUT`` seconds (or its headers or body that slowly) is closed, as the TCP port
does.
"""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any

import tornado.httputil
import tornado.web

# The largest body a route takes: a retire request, the operator's cluster status.
MAX_BODY_BYTES = 1 << 20
IDLE_TIMEOUT = 10.0

# Everything a page may not do unless its route allows it: no scripts, no frames of it on
# other sites, nothing fetched but from here. Inline styles are allowed (the pages use
# style attributes for bars and colours; a style cannot run code).
DEFAULT_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.DOTALL)


def server_limits() -> dict[str, Any]:
    """Keyword arguments of tornado's HTTPServer."""
    return {
        "max_body_size": MAX_BODY_BYTES,
        "idle_connection_timeout": IDLE_TIMEOUT,  # also the time to send the headers
        "body_timeout": IDLE_TIMEOUT,
    }


def page_policy(page: bytes) -> str:
    """The policy of a page whose inline scripts are its own: each allowed by its hash
    (so no other script runs, even one injected into its text), and its event stream."""
    hashes = " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(script).digest()).decode()}'"
        for script in _SCRIPT.findall(page)
    )
    scripts = hashes or "'none'"
    return f"{DEFAULT_POLICY}; script-src {scripts}; connect-src 'self'"


class SecurityHeaders(tornado.web.OutputTransform):
    """Adds the headers to every response; a route's own Content-Security-Policy wins."""

    def transform_first_chunk(
        self,
        status_code: int,
        headers: tornado.httputil.HTTPHeaders,
        chunk: bytes,
        finishing: bool,
    ) -> tuple[int, tornado.httputil.HTTPHeaders, bytes]:
        if "Content-Security-Policy" not in headers:
            headers["Content-Security-Policy"] = DEFAULT_POLICY
        headers["X-Frame-Options"] = "DENY"
        headers["X-Content-Type-Options"] = "nosniff"
        headers["Referrer-Policy"] = "no-referrer"  # the token may be in a dashboard link
        return status_code, headers, chunk
