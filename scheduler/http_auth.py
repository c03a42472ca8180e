"""Authentication of the scheduler's HTTP API: one base handler for every route.

Every route but ``/health`` changes or reveals the cluster (worker addresses, pids, host
names), so a route handler derives from ``AuthenticatedHandler`` and is served only to a
request with ``Authorization: Bearer <token>``. The token is the application setting
``token`` (None: authentication is off, as with ``--no-auth``).
"""

from __future__ import annotations

import json

import tornado.web

from apportion.auth import tokens_match

BEARER = "Bearer "


def authorized(header: str | None, token: str | None) -> bool:
    """Whether an ``Authorization`` header value grants access (always, without a token)."""
    if token is None:
        return True
    if not header or not header.startswith(BEARER):
        return False
    return tokens_match(header[len(BEARER) :].strip(), token)


class AuthenticatedHandler(tornado.web.RequestHandler):
    """Answers 401, before the route's method runs, to a request without the token."""

    def prepare(self) -> None:
        if not authorized(self.request.headers.get("Authorization"), self.settings["token"]):
            self.set_status(401)
            self.set_header("WWW-Authenticate", 'Bearer realm="apportion"')
            self.set_header("Content-Type", "application/json")
            self.finish(
                json.dumps(
                    {
                        "error": "a valid bearer token is required: send the header "
                        "'Authorization: Bearer <token>' with the scheduler's token"
                    }
                )
            )
