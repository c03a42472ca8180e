"""More of what a dask.distributed user reaches for, behind thin ``Client`` methods:
``set_resources``, ``run_on_scheduler``, ``upload_file``, ``get_task_stream`` (the
scheduler's side is scheduler/client_ops.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from apportion.errors import SchedulerConnectionError
from apportion.resources import validate
from apportion.serialize import dumps_args, dumps_value, loads_exception, loads_value

if TYPE_CHECKING:
    from apportion.client import Client


def _answer(reply: dict[str, Any]) -> dict[str, Any]:
    if "error" in reply:
        raise ValueError(reply["error"])
    return reply


def set_resources(client: Client, worker: str, resources: Mapping[str, float]) -> dict[str, float]:
    """Give a worker (by name or address) new resource totals; returns them."""
    if not isinstance(worker, str):
        raise TypeError(f"worker must be a worker's name or address, got {worker!r}")
    clean = validate(resources, what="capacity")
    reply = _answer(client._request({"op": "set-resources", "worker": worker, "resources": clean}))
    return dict(reply["resources"])


def run_on_scheduler(client: Client, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``func`` in the scheduler's process (and loop); a ``dask_scheduler`` (or
    ``scheduler``) parameter receives the scheduler object; coroutines are awaited."""
    from apportion.futures import Future

    args_bytes, deps = dumps_args(args, kwargs, Future)
    if deps:
        raise TypeError("run_on_scheduler takes no futures as arguments")
    reply = client._request(
        {"op": "run-on-scheduler", "func": dumps_value(func), "args": args_bytes}
    )
    if "exception" in reply:
        raise loads_exception(reply["exception"], reply.get("traceback", ""))
    return loads_value(reply["result"])


def upload_file(client: Client, filename: str | os.PathLike[str]) -> dict[str, str]:
    """Send a local file (``.py``, ``.zip``, ``.egg``, ``.whl``) to every worker, also to
    those that join later; importable in tasks from then on. Returns where each worker
    connected now put it."""
    path = os.fspath(filename)
    with open(path, "rb") as f:
        data = f.read()
    reply = client._request(
        {"op": "upload-file", "filename": os.path.basename(path), "data": data}, timeout=None
    )
    _answer(reply)
    placed = {}
    for address, outcome in reply["results"].items():
        if "exception" in outcome:
            raise loads_exception(outcome["exception"], outcome.get("traceback", ""))
        if "result" not in outcome:
            raise SchedulerConnectionError(outcome.get("error", "worker gave no answer"))
        placed[address] = loads_value(outcome["result"])
    return placed


def get_task_stream(client: Client, start: float | None = None) -> list[dict[str, Any]]:
    """The runs that ended since ``start`` (wall clock seconds; default: all the scheduler
    keeps), oldest first: ``key``, ``worker``, ``state``, ``start``, ``stop``, ``units``.
    A scheduler without a dashboard records runs from the first call on."""
    # A worker tells a waiting client of a result directly, a hop before the scheduler
    # hears of the run: a round trip through every worker first (each answers on the
    # connection its earlier reports took) lets those reports reach the stream.
    try:
        client.run(_nothing)
    except SchedulerConnectionError:
        pass  # a worker left meanwhile: its runs were reported before it went
    reply = _answer(client._request({"op": "task-stream", "since": start or 0}))
    return [dict(run) for run in reply["runs"]]


def restart(client: Client, timeout: float) -> list[str]:
    """See ``Client.restart``; returns the names of the workers that came back."""
    reply = _answer(client._request({"op": "restart", "timeout": timeout}, timeout + 30))
    return list(reply["workers"])


def _nothing() -> None:
    return None


class TaskStream:
    """``with get_task_stream(client) as ts: ...`` then ``ts.data``: the runs of the block."""

    def __init__(self, client: Client | None = None) -> None:
        from apportion.default_client import default_client

        self.client = client if client is not None else default_client()
        self.data: list[dict[str, Any]] = []
        self.start = 0.0

    def __enter__(self) -> TaskStream:
        get_task_stream(self.client, time.time())  # starts recording, if not yet
        self.start = time.time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.data = get_task_stream(self.client, self.start)
