"""HTTP routes of the dashboard and ``/metrics`` on the scheduler's HTTP port.

The dashboard needs the cluster's token (it shows task names and can grow to act on the
cluster): ``Authorization: Bearer <token>``, or the cookie set by opening
``/dashboard?token=<token>`` (what ``client.dashboard_link`` gives) or by the login
form. ``/metrics`` needs the bearer token like every route but ``/health`` (its labels name
the workers).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

import tornado.web
from apportion.scheduler import dashboard
from apportion.scheduler.http_auth import AuthenticatedHandler
from apportion.scheduler.http_auth import authorized as bearer_authorized
from apportion.scheduler.http_security import page_policy
from apportion.scheduler.metrics import CONTENT_TYPE, exposition, scheduler_registry
from tornado.iostream import StreamClosedError

from apportion.auth import tokens_match

if TYPE_CHECKING:
    from apportion.scheduler.shell import SchedulerShell

COOKIE = "apportion-token"
access = logging.getLogger("tornado.access")

LOGIN_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>apportion: sign in</title></head>
<body style="font: 15px system-ui, sans-serif; margin: 3em">
<h1>apportion dashboard</h1>
<p>{message}</p>
<form method="post" action="/dashboard/login">
<label>Cluster token <input type="password" name="token" autofocus size="50"></label>
<button type="submit">Open</button></form>
<p style="color: #666">The token is in the file given to <code>apportion scheduler
--token-file</code>, or <code>client.dashboard_link</code> opens this page signed in.</p>
</body></html>"""


def token_matches(offered: str | None, token: str | None) -> bool:
    return token is None or (offered is not None and tokens_match(offered, token))


def authorized(handler: tornado.web.RequestHandler, token: str | None) -> bool:
    """The one check the dashboard's routes make: a bearer header or the dashboard cookie."""
    if token is None:
        return True
    if bearer_authorized(handler.request.headers.get("Authorization"), token):
        return True
    return token_matches(handler.get_cookie(COOKIE), token)


def observability_routes(scheduler: SchedulerShell) -> list[tuple[str, Any]]:
    registry = scheduler_registry(scheduler)
    shared = dashboard.SharedRendering(
        lambda: dashboard.view(scheduler.state, scheduler.state.events, scheduler.address)
    )

    class Metrics(AuthenticatedHandler):
        def get(self) -> None:
            self.set_header("Content-Type", CONTENT_TYPE)
            self.write(exposition(registry))

    class Root(tornado.web.RequestHandler):
        def get(self) -> None:
            self.redirect("/dashboard")

    class Page(tornado.web.RequestHandler):
        def get(self) -> None:
            offered = self.get_query_argument("token", None)
            if offered is not None:
                self._sign_in(offered)
                return
            if not authorized(self, scheduler.token):
                self.set_status(401)
                self.write(LOGIN_PAGE.format(message="Enter the cluster's token to continue."))
                return
            data = dashboard.view(scheduler.state, scheduler.state.events, scheduler.address)
            page = dashboard.render_page(data)
            self.set_header("Content-Security-Policy", page_policy(page))
            self.write(page)

        def post(self) -> None:  # the login form
            self._sign_in(self.get_body_argument("token", ""))

        def _sign_in(self, offered: str) -> None:
            if not token_matches(offered, scheduler.token):
                self.set_status(401)
                self.write(LOGIN_PAGE.format(message="That token is not this cluster's."))
                return
            if scheduler.token is not None:
                # Over TLS, never sent back over plain HTTP.
                secure = self.request.protocol == "https"
                self.set_cookie(COOKIE, offered, httponly=True, samesite="Strict", secure=secure)
            # Without the token in the address bar (or the browser's history).
            self.redirect("/dashboard")

    class Events(tornado.web.RequestHandler):
        """Server-sent events: the sections that changed, every ``PUSH_INTERVAL``."""

        async def get(self) -> None:
            if not authorized(self, scheduler.token):
                self.set_status(401)
                self.write("a valid token is required")
                return
            self.set_header("Content-Type", "text/event-stream")
            self.set_header("Cache-Control", "no-cache")
            sent: dict[str, str] = {}
            try:
                while not scheduler.stopped.is_set():
                    sections = shared.sections()
                    changed = {k: v for k, v in sections.items() if sent.get(k) != v}
                    sent = sections
                    self.write(f"data: {json.dumps(changed)}\n\n")
                    await self.flush()
                    await asyncio.sleep(dashboard.PUSH_INTERVAL)
            except StreamClosedError:
                pass  # the page was closed

    class ClusterStatus(tornado.web.RequestHandler):
        """``POST``: the operator tells the scheduler its ResourceCluster's status (a JSON
        object, see k8s_operator/scheduler_feed.py), shown on the dashboard."""

        def post(self) -> None:
            if not authorized(self, scheduler.token):
                self.set_status(401)
                self.write({"error": "a valid bearer token is required"})
                return
            try:
                summary = cluster_status(self.request.body)
            except ValueError as exc:
                self.set_status(400)
                self.write({"error": str(exc)})
                return
            if scheduler.state.events is not None:
                scheduler.state.events.cluster = summary
            self.write({"ok": True})

    return [
        (r"/api/v1/cluster-status", ClusterStatus),
        (r"/metrics", Metrics),
        (r"/", Root),
        (r"/dashboard", Page),
        (r"/dashboard/login", Page),
        (r"/dashboard/events", Events),
    ]


def cluster_status(body: bytes) -> dict[str, Any]:
    """The operator's summary of the cluster, checked: a JSON object naming the cluster,
    with a list of worker groups (objects) if any."""
    try:
        summary = json.loads(body or b"null")
    except ValueError as exc:
        raise ValueError(f"the body must be JSON: {exc}") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("name"), str):
        raise ValueError('the body must be a JSON object with a "name": {"name": "pipeline", ...}')
    groups = summary.get("workerGroups", [])
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise ValueError('"workerGroups" must be a list of objects')
    return summary


def access_log(handler: tornado.web.RequestHandler) -> None:
    """Requests that went well at DEBUG: scrapes and open pages would otherwise fill the
    scheduler's log (and its kept recent lines) with one line every few seconds."""
    status = handler.get_status()
    level = logging.DEBUG if status < 400 else logging.WARNING
    access.log(
        level,
        "%d %s %.2fms",
        status,
        handler._request_summary(),
        1000.0 * handler.request.request_time(),
    )
