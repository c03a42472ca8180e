"""The scheduler's HTTP API: health, cluster info and graceful retirement.

Served only when the scheduler is given an HTTP port (``--http-port``); the operator's
probes and autoscaler use it. Every route but ``/health`` needs the token (see http_auth).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import tornado.web
from apportion.scheduler.dashboard_routes import access_log, observability_routes
from apportion.scheduler.http_auth import AuthenticatedHandler
from apportion.scheduler.http_security import SecurityHeaders
from apportion.scheduler.validation import check_retire

from apportion.protocol import Message, ProtocolError

if TYPE_CHECKING:
    from apportion.scheduler.shell import SchedulerShell


def status_app(scheduler: SchedulerShell) -> tornado.web.Application:
    """``GET /health`` (open); ``GET /api/v1/info``, ``GET /api/v1/story/<key>`` and
    ``POST /api/v1/retire`` (they need ``Authorization: Bearer <token>``)."""

    class Health(tornado.web.RequestHandler):
        def get(self) -> None:
            self.write("ok")

    class Info(AuthenticatedHandler):
        def get(self) -> None:
            info = scheduler.state.info()
            info["address"] = scheduler.address
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps(info))

    class Story(AuthenticatedHandler):
        """A task's changes of state still kept, oldest first: ``{"key": ..., "story":
        [{"time", "from", "to", "reason"}, ...]}`` (an empty story for a key unknown)."""

        def get(self, key: str) -> None:
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps({"key": key, "story": scheduler.state.story(key)}))

    class Retire(AuthenticatedHandler):
        """Body ``{"names": [worker names], "count": n}`` (``count`` optional: all named;
        ``workers`` is accepted for ``names``). Answers, once the chosen workers are settled,
        ``{"retired": [names safe to stop], "kept": {name: why it stays in service}}``."""

        async def post(self) -> None:
            try:
                names, count = check_retire(retire_message(self.request.body))
                answer = await scheduler.retire_workers(names, count)
            except (ProtocolError, ValueError) as exc:
                self._answer(400, {"error": str(exc)})
                return
            self._answer(200, answer)

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            self.set_status(status)
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps(body))

    app = tornado.web.Application(
        [
            (r"/health", Health),
            (r"/api/v1/info", Info),
            (r"/api/v1/story/(.+)", Story),
            (r"/api/v1/retire", Retire),
            *observability_routes(scheduler),
        ],
        token=scheduler.token,
        log_function=access_log,
    )
    app.add_transform(SecurityHeaders)
    return app


def retire_message(body: bytes) -> Message:
    """The JSON body of a retire request, as the client protocol's ``retire`` message."""
    try:
        request = json.loads(body or b"{}")
    except ValueError as exc:
        raise ProtocolError(f"the body must be JSON: {exc}") from None
    if not isinstance(request, dict):
        raise ProtocolError('the body must be a JSON object: {"names": [...], "count": n}')
    if "names" in request and "workers" in request:
        raise ProtocolError("give the worker names as 'names' or as 'workers', not both")
    unknown = set(request) - {"names", "workers", "count"}
    if unknown:
        raise ProtocolError(f"unknown fields {sorted(unknown)}; expected 'names' and 'count'")
    names = request.get("names", request.get("workers"))
    return {"op": "retire", "names": names, "count": request.get("count")}
