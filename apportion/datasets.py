"""Values shared through the scheduler, futures included: published datasets
(``Client.publish_dataset``, ``get_dataset``, ``list_datasets``, ``unpublish_dataset``,
``client.datasets``) and the values of variables and queues (apportion/coordination.py).

A value is pickled with each future inside written as its key (``pack``); the scheduler
keeps those results while the value is held there, and holds them for the client that
takes the value before answering it (scheduler/coordination.py). The taker makes its
futures of the keys and asks the scheduler for their state (``unpack``), as a submission of
an existing key does; should a result be gone meanwhile, its future raises a clear error
instead of waiting for ever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, MutableMapping
from typing import Any

from apportion.errors import ApportionError
from apportion.future_table import FutureTable
from apportion.futures import Future
from apportion.serialize import dumps_args, dumps_with_references, loads_with_references
from apportion.session import Session

Message = dict[str, Any]


class CoordinationError(ApportionError, ValueError):
    """The scheduler refused a coordination request (the message says why)."""


class ReleasedResultError(ApportionError, LookupError):
    """A future taken from a variable, queue or dataset whose result was released first."""


def _released(key: str) -> None:
    """Runs in place of a result that was gone before its future was taken."""
    raise ReleasedResultError(
        f"the result of {key!r} was released before this future was taken from a variable, "
        "queue or dataset: keep it published (or its future alive) until it is taken"
    )


def pack(value: Any) -> Message:
    """The message fields of a value: its pickle, and the keys of the futures inside."""
    data, keys = dumps_with_references(value, Future)
    return {"value": data, "keys": keys} if keys else {"value": data}


def unpack(table: FutureTable, data: bytes, keys: list[str] | None) -> Any:
    """A value from its pickle: its futures are this client's, their state asked of the
    scheduler (which holds their results for this client already)."""
    value = loads_with_references(data, table.future)
    if keys:
        session = table.session
        func = session.functions.dumps(_released)
        specs = [{"key": k, "func": func, "args": dumps_args((k,), {}, Future)[0]} for k in keys]
        session.post({"op": "submit", "tasks": specs})
    return value


async def ask(session: Session, message: Message, timeout: float | None) -> Message:
    """Send one coordination request; after ``timeout`` tell the scheduler to stop waiting,
    and take its answer to the request (a grant made meanwhile still counts)."""
    request_id, reply = session.start_request({**message, "op": "coord"})
    try:
        return await asyncio.wait_for(asyncio.shield(reply), timeout)
    except asyncio.TimeoutError:
        session.start_request({"op": "coord", "action": "cancel", "wait_id": request_id})
        return await reply


def request(session: Session, message: Message, timeout: float | None = None) -> Message:
    """A coordination request, waiting for its answer; refusals raise CoordinationError."""
    if timeout is not None and timeout < 0:
        raise ValueError(f"timeout must be None or >= 0 seconds, got {timeout!r}")
    session.check_open()
    reply: Message = session.run(ask(session, message, timeout))
    if "error" in reply:
        raise CoordinationError(reply["error"])
    return reply


# ------------------------------------------------------------------- datasets
def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"a dataset name must be a non-empty string, got {name!r}")
    return name


def publish(table: FutureTable, datasets: dict[str, Any], override: bool = False) -> None:
    """Publish each value under its name (a name taken raises, unless ``override``)."""
    for name, value in datasets.items():
        message = {"action": "dataset-publish", "name": _check_name(name), **pack(value)}
        try:
            request(table.session, {**message, "override": bool(override)})
        except CoordinationError as exc:  # the name is taken: Dask raises KeyError
            raise KeyError(str(exc)) from None


_NO_DEFAULT = object()


def get(
    table: FutureTable, name: str, default: Any = _NO_DEFAULT, timeout: float | None = None
) -> Any:
    """The dataset published as ``name``; ``default`` (else KeyError) if there is none, or,
    with ``timeout``, once none was published for that long."""
    message = {"action": "dataset-get", "name": _check_name(name), "wait": timeout is not None}
    reply = request(table.session, message, timeout)
    if "value" not in reply:
        if default is not _NO_DEFAULT:
            return default
        waited = f" within {timeout}s" if timeout is not None else ""
        raise KeyError(f"no dataset named {name!r} is published{waited}")
    return unpack(table, reply["value"], reply.get("keys"))


def names(table: FutureTable) -> list[str]:
    return list(request(table.session, {"action": "dataset-list", "name": "*"})["names"])


def unpublish(table: FutureTable, name: str) -> None:
    try:
        request(table.session, {"action": "dataset-delete", "name": _check_name(name)})
    except CoordinationError as exc:
        raise KeyError(str(exc)) from None


class Datasets(MutableMapping[str, Any]):
    """``client.datasets``: the published datasets as a dictionary (``client.datasets["x"] =
    df`` publishes, ``del client.datasets["x"]`` unpublishes)."""

    def __init__(self, table: FutureTable) -> None:
        self._table = table

    def __getitem__(self, name: str) -> Any:
        return get(self._table, name)

    def __setitem__(self, name: str, value: Any) -> None:
        publish(self._table, {name: value}, override=True)

    def __delitem__(self, name: str) -> None:
        unpublish(self._table, name)

    def __iter__(self) -> Iterator[str]:
        return iter(names(self._table))

    def __len__(self) -> int:
        return len(names(self._table))

    def __repr__(self) -> str:
        return f"<Datasets: {names(self._table)}>"
