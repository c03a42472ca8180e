"""More of what a dask.distributed user reaches for, behind thin ``Client`` methods:
``set_resources``, ``run_on_scheduler``, ``upload_file``, ``get_task_stream``, ``restart``
(the scheduler's side is scheduler/client_ops.py)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from apportion.errors import SchedulerConnectionError
from apportion.futures import Future
from apportion.resources import validate
from apportion.serialize import dumps_args, loads_exception, loads_value
from apportion.session import Session


def _answer(reply: dict[str, Any]) -> dict[str, Any]:
    if "error" in reply:
        raise ValueError(reply["error"])
    return reply


def set_resources(
    session: Session, worker: str, resources: Mapping[str, float]
) -> dict[str, float]:
    """Give a worker (by name or address) new resource totals; returns them."""
    if not isinstance(worker, str):
        raise TypeError(f"worker must be a worker's name or address, got {worker!r}")
    clean = validate(resources, what="capacity")
    reply = _answer(session.request({"op": "set-resources", "worker": worker, "resources": clean}))
    return dict(reply["resources"])


def run_on_scheduler(session: Session, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``func`` in the scheduler's process (and loop); a ``dask_scheduler`` (or
    ``scheduler``) parameter receives the scheduler object; coroutines are awaited."""
    args_bytes, deps = dumps_args(args, kwargs, Future)
    if deps:
        raise TypeError("run_on_scheduler takes no futures as arguments")
    reply = session.request(
        # cloudpickle, as client.run: a function of the user's script (``__main__``) goes by
        # value; by reference, the scheduler would look for it in its own __main__.
        {"op": "run-on-scheduler", "func": session.functions.dumps(func), "args": args_bytes}
    )
    if "exception" in reply:
        raise loads_exception(reply["exception"], reply.get("traceback", ""))
    return loads_value(reply["result"])


def upload_file(session: Session, filename: str | os.PathLike[str]) -> dict[str, str]:
    """Send a local file (``.py``, ``.zip``, ``.egg``, ``.whl``) to every worker, also to
    those that join later; importable in tasks from then on. Returns where each worker
    connected now put it."""
    path = os.fspath(filename)
    with open(path, "rb") as f:
        data = f.read()
    reply = session.request(
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


def get_task_stream(session: Session, start: float | None = None) -> list[dict[str, Any]]:
    """The runs that ended since ``start`` (wall clock seconds; default: all the scheduler
    keeps), oldest first: ``key``, ``worker``, ``state``, ``start``, ``stop``, ``units``.
    A scheduler without a dashboard records runs from the first call on."""
    # A worker tells a waiting client of a result directly, a hop before the scheduler
    # hears of the run: a round trip through every worker first (each answers on the
    # connection its earlier reports took) lets those reports reach the stream.
    try:
        run_on_workers(session, session.functions.dumps(_nothing), ())
    except SchedulerConnectionError:
        pass  # a worker left meanwhile: its runs were reported before it went
    reply = _answer(session.request({"op": "task-stream", "since": start or 0}))
    return [dict(run) for run in reply["runs"]]


def restart(session: Session, timeout: float) -> list[str]:
    """See ``Client.restart``; returns the names of the workers that came back."""
    reply = _answer(session.request({"op": "restart", "timeout": timeout}, timeout + 30))
    return list(reply["workers"])


def _nothing() -> None:
    return None


def run_on_workers(
    session: Session, func: bytes, args: tuple, kwargs: dict | None = None
) -> dict[str, Any]:
    """Call the pickled function ``func`` in every worker process; ``{address: result}``."""
    args_bytes, _ = dumps_args(args, kwargs or {}, Future)
    reply = session.request({"op": "run", "func": func, "args": args_bytes})
    results = {}
    for address, outcome in reply["results"].items():
        if "result" in outcome:
            results[address] = loads_value(outcome["result"])
        elif "exception" in outcome:
            raise loads_exception(outcome["exception"], outcome.get("traceback", ""))
        else:
            raise SchedulerConnectionError(outcome.get("error", "worker gave no answer"))
    return results
